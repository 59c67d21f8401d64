"""Values the command line takes as a user types them, sizes it refuses
before any work, and runs that end without warnings a user would read as a
problem."""
import os
import subprocess
import sys
import time

from pyg_dist.cli import _negative_values_attached
from tests.conftest import REPO


def pyg_dist_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pyg_dist.cli", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_negative_values_are_values():
    assert _negative_values_attached(["train", "--fanout", "-1,-1,-1", "--seed", "-3"]) == \
        ["train", "--fanout=-1,-1,-1", "--seed=-3"]
    # a flag that takes no value stays itself; a value given with = is kept
    assert _negative_values_attached(["--overwrite", "--fanout=-1,5", "--lr", "1e-3"]) == \
        ["--overwrite", "--fanout=-1,5", "--lr", "1e-3"]


def test_fanout_all_neighbours_as_the_readme_writes_it(tmp_path):
    # parsing gets past --fanout -1,-1,-1 (argparse took it for a flag):
    # the run then fails on the missing partition directory, in one line
    p = pyg_dist_cli("train", "--root", str(tmp_path / "none"), "--loader", "neighbor",
                     "--fanout", "-1,-1,-1")
    assert p.returncode != 0
    assert "expected one argument" not in p.stderr
    assert "is not a partition directory" in p.stderr


def test_a_generated_graph_too_large_for_the_machine_is_refused(tmp_path):
    start = time.monotonic()
    p = pyg_dist_cli("partition", "--num-nodes", "1000000000", "--num-parts", "2",
                     "--root", str(tmp_path / "parts"), "--data-dir", str(tmp_path / "data"))
    assert p.returncode == 1 and time.monotonic() - start < 60
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "GiB to generate and partition" in lines[0], p.stderr
    assert not os.path.exists(tmp_path / "parts" / "meta.json")


def test_single_process_training_warns_nothing(tmp_path):
    # torch warns once per process: a fresh interpreter, warnings as errors
    code = ("from tests.conftest import small_graph\n"
            "from pyg_dist.train import TrainConfig, train_single_process\n"
            "train_single_process(small_graph(), TrainConfig(hidden=8, epochs=1, "
            "progress=False))\n")
    p = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code],
                       capture_output=True, text=True, timeout=120,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr
