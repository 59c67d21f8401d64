"""The benchmark suite end to end, CI-sized: real pyg-dist runs on one set of
partitions, the table, the JSON and the figures."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_suite_runs_every_kind_of_method(tmp_path):
    out = tmp_path / "suite.json"
    methods = ["PyG full-graph", "PyG ClusterLoader", "exact", "BNS p=0.1", "PSC"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run_all", "--quick", "--num-nodes", "2000",
         "--epochs", "3", "--seeds", "1", "--costs", "--methods", *methods,
         "--pyg-python", str(tmp_path / "no-python"), "--workdir", str(tmp_path / "work"),
         "--out", str(out)],
        cwd=REPO, env=dict(os.environ, PYTHONWARNINGS="ignore"), capture_output=True,
        text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads(out.read_text())
    assert saved["machine"]["cpus"] == os.cpu_count() and saved["args"]["epochs"] == 3
    by = {r["method"]: r for r in saved["results"]}
    assert list(by) == methods and all(r["link"] == "loopback" for r in by.values())

    # A baseline that cannot run is reported with its reason, not dropped.
    assert not by["PyG ClusterLoader"]["runs"]
    assert "make bench-env" in by["PyG ClusterLoader"]["error"]
    run = {name: r["runs"][0] for name, r in by.items() if r["runs"]}
    for name, one in run.items():
        assert len(one["curve"]) == 3 and all(val is not None for _, val, _ in one["curve"])
        assert one["epochs_per_s"] > 0 and one["peak_mem_max"] >= one["peak_mem_mean"] > 0
    assert len(run["exact"]["peak_mem_per_rank"]) == 2 and run["PyG full-graph"]["bytes_sent"] == 0
    # The defining properties, measured through the whole stack.
    assert 0 < run["BNS p=0.1"]["bytes_sent"] < 0.2 * run["exact"]["bytes_sent"]
    assert run["PSC"]["cache_hit_rate"] > 0 and run["PSC"]["bytes_saved"] > 0
    # The target is a fraction of exact's own final accuracy: exact reaches it.
    assert 1 <= run["exact"]["epochs_to_target"] <= 3

    table = (tmp_path / "suite.md").read_text()
    assert "| exact | " in table and "| 1.00 |" in table and "not run:" in table
    assert "BNS p=0.1: " in table  # the summary lines
    figures = {f"suite_{name}.png" for name in ("breakdown", "convergence", "memory",
                                                "staleness")}
    assert figures <= set(os.listdir(tmp_path))
