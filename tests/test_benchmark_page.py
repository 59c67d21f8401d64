"""BENCHMARKS.md's headline table is what benchmarks/results/headline.json holds,
in its first 40 lines; no tracked file names a folder of the machine that made it
or the project's history ("stop" as a unit of time, issue numbers)."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import headline  # noqa: E402

# Built from pieces so that this file does not match its own patterns.
MACHINE_FOLDERS = "/" + "|/".join(["work/", "tmp/", "root/", "home/"])
STOP_WORDS = (r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|"
              r"eleventh|twelfth) st" + r"op|st" + r"op[0-9]+")
ISSUE_NUMBERS = "iss" + "ue [0-9]"


def _git_grep(*args: str) -> str:
    if not os.path.isdir(os.path.join(REPO, ".git")) and not os.path.isfile(
            os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "grep", "-n", *args], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode in (0, 1), proc.stderr  # 1: nothing found
    return proc.stdout


def test_no_tracked_file_names_a_machine_folder():
    assert _git_grep("-E", MACHINE_FOLDERS) == ""


def test_no_project_history_words():
    assert _git_grep("-iE", STOP_WORDS) == ""
    assert _git_grep(ISSUE_NUMBERS, "--", "pyg_dist", "benchmarks", "tests", "docs") == ""


def test_the_page_shows_headline_json_within_its_first_40_lines():
    with open(headline.RESULTS) as f:
        head = json.load(f)
    with open(headline.PAGE) as f:
        page = f.read()
    block = headline.render(head)
    assert block in page, "BENCHMARKS.md's table differs from headline.json: make bench"
    assert page[:page.index(headline.END)].count("\n") < 40
    assert set(head["rows"]) == set(headline.ROWS)
    for key, row in head["rows"].items():
        assert row["command"] in block and headline.ROWS[key]["section"] in block
        # every row links a results file that exists
        assert os.path.exists(os.path.join(REPO, "benchmarks", "results",
                                           headline.ROWS[key]["json"]))


def test_rewrite_replaces_only_the_table(tmp_path):
    page = tmp_path / "BENCHMARKS.md"
    before, after = "# Title\n\nintro\n\n", "\n\n## Section\n\nkept\n"
    page.write_text(before + headline.BEGIN + "\nold table\n" + headline.END + after)
    headline.rewrite_page(headline.BEGIN + "\nnew\n" + headline.END, str(page))
    assert page.read_text() == before + headline.BEGIN + "\nnew\n" + headline.END + after
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no <!-- headline:begin -->"):
        headline.rewrite_page("x", str(page))
