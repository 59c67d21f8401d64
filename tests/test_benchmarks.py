"""The benchmark suite end to end, CI-sized: real pyg-dist runs on one set of
partitions, the table, the JSON and the figures; and the emulated network's
labels and wire-byte counters (benchmarks/netem.py)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import netem  # noqa: E402

# Two ranks: an all_to_all_single of 2^20 floats (each rank sends half) and an
# all_reduce of 2^19 (each rank has to receive the other's 2 MB): 8 MB of payload.
A2A, REDUCE = 2**20, 2**19
PAYLOAD = 2 * (A2A // 2 * 4) + 2 * REDUCE * 4
COLLECTIVES = textwrap.dedent(f"""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    data = torch.randn({A2A})
    dist.all_to_all_single(torch.empty_like(data), data)
    dist.all_reduce(torch.randn({REDUCE}))
    dist.destroy_process_group()
""")


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


def test_netem_link_labels_and_loopback_network():
    assert netem.parse_link("1gbit,0.2ms").label == "1gbit/0.2ms"
    assert netem.parse_link("loopback").is_loopback
    with pytest.raises(ValueError):
        netem.parse_link("1gbit,fast")
    net = netem.LoopbackNetwork(2)
    assert net.label == "loopback" and "no added delay" in net.description
    result = net.launch([sys.executable, "-c", "pass"], timeout=60).check()
    # lo's counters are shared by all ranks (and everything else): not measured.
    assert result.wire_bytes is None and result.sent is None and result.received is None
    codes, outputs = result  # still unpacks like the pair it was
    assert codes == [0, 0] and len(outputs) == 2


def test_netem_emulated_network_reports_wire_bytes(tmp_path):
    ok, reason = netem.available()
    if not ok:
        pytest.skip(f"no emulated network here: {reason}")
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES)
    prefix = f"t{os.getpid() % 10**7}"  # namespaces of its own, also beside other runs
    net = netem.EmulatedNetwork(2, netem.parse_link("1gbit,0.1ms"), prefix=prefix)
    # The label names the delay only where the kernel adds it (no user-space delayer).
    if netem.delay_support()[0] == "netem":
        assert net.label == "1gbit/0.1ms" and "0.1ms one-way delay" in net.description
    else:
        assert net.label == "1gbit" and net.link.delay is None
        assert "no added delay" in net.description and "0.1ms requested" in net.description
    with net:
        result = net.launch([sys.executable, str(script)], timeout=180).check()
    assert len(result.wire_bytes) == 2
    # Everything on the links: the payload plus rendezvous and headers.
    assert PAYLOAD <= result.sent < 1.5 * PAYLOAD
    assert PAYLOAD <= result.received < 1.5 * PAYLOAD  # the star's ranks receive what they send
    for rank in result.wire_bytes:
        assert rank["tx_packets"] > 0 and rank["rx_packets"] > 0
        # the tbf counts every 1500-byte frame's headers, veth a GSO packet's once
        assert rank["tx_frame_bytes"] >= rank["tx_bytes"]
        assert rank["tx_frames"] >= rank["tx_packets"]


# PyG's baselines at their best (benchmarks/pyg_baselines.py) and the paired
# 1-partition overhead (benchmarks/overhead.py --parts 1), tiny.
# `make bench-env`'s Python: $PYG_ENV, else .bench/pyg-env in the repository.
BENCH_ENV = os.path.join(os.environ.get("PYG_ENV") or os.path.join(REPO, ".bench", "pyg-env"),
                         "bin", "python")


def _bench(tmp_path, script, *flags):
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, os.path.join("benchmarks", script), *flags, "--workdir",
         str(tmp_path / "work"), "--" + ("output" if script == "overhead.py" else "out"),
         str(out)], cwd=REPO, env=dict(os.environ, PYTHONWARNINGS="ignore"),
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def test_pyg_baselines_full_graph_probes_every_form_and_keeps_the_fastest(tmp_path):
    stdout, saved = _bench(tmp_path, "pyg_baselines.py", "--quick", "--baselines", "full",
                           "--num-nodes", "1000", "--epochs", "2", "--pyg-python",
                           str(tmp_path / "no-python"))
    (full, ) = saved["results"]
    threads = {t for t in (1, 2) if t <= os.cpu_count()}
    forms = {p["config"]["adj"] for p in full["probes"]}
    assert {"csr", "edge_index"} <= forms and len(full["probes"]) == len(forms) * len(threads)
    fastest = min(full["probes"], key=lambda p: p["s_per_epoch"])
    assert full["config"] == fastest["config"] and full["summary"]["test_acc"] > 0
    assert len(full["summary"]["epoch_times"]) == 2 and saved["graph"]["num_nodes"] == 1000
    assert "| PyG full-graph | adj=" in stdout and "(best)" in stdout


def _loader_python():
    r"""A Python with a backend of PyG's loaders (torch-sparse or pyg-lib)."""
    probe = ("import importlib.util as u; "
             "assert u.find_spec('torch_sparse') or u.find_spec('pyg_lib')")
    return next((p for p in (sys.executable, BENCH_ENV) if os.path.exists(p) and
                 subprocess.run([p, "-c", probe], capture_output=True).returncode == 0), None)


def test_pyg_baselines_neighbor_loader_probes_forms_and_workers(tmp_path):
    python = _loader_python()
    stdout, saved = _bench(tmp_path, "pyg_baselines.py", "--quick", "--baselines", "neighbor",
                           "--num-nodes", "1000", "--epochs", "2", "--num-batches", "3",
                           "--forms", "csr", "edge_index", "--workers-grid", "1",
                           "--threads-grid", "1",
                           "--pyg-python", python or str(tmp_path / "no-python"))
    (r, ) = saved["results"]
    if python is None:  # no loader backend: reported with its reason, not dropped
        assert "make bench-env" in r["error"]
        pytest.skip("no Python with torch-sparse or pyg-lib (make bench-env)")
    configs = [p["config"] for p in r["probes"]]
    assert [(c["adj"], c["workers"]) for c in configs][:2] == [("csr", 0), ("edge_index", 0)]
    assert len(configs) == 3 and configs[2]["workers"] == 1
    assert r["config"] == min(r["probes"], key=lambda p: p["s_per_epoch"])["config"]
    assert r["summary"]["test_acc"] > 0 and len(r["summary"]["epoch_times"]) == 2
    assert "| PyG NeighborLoader | adj=" in stdout and "(best)" in stdout


def test_pyg_baselines_ddp_one_loader_per_process(tmp_path):
    python = _loader_python()
    if python is None:
        pytest.skip("no Python with torch-sparse or pyg-lib (make bench-env)")
    stdout, saved = _bench(tmp_path, "pyg_baselines.py", "--quick", "--baselines", "ddp",
                           "--num-nodes", "1000", "--epochs", "2", "--num-batches", "3",
                           "--procs", "2", "--no-tune", "--adj", "csr", "--workers", "1",
                           "--pyg-python", python)
    (r, ) = saved["results"]
    assert r["config"] == {"adj": "csr", "threads": 1, "workers": 1} and r["procs"] == 2
    assert r["summary"]["test_acc"] > 0 and len(r["summary"]["epoch_times"]) == 2
    assert len(r["summary"]["peak_mem_per_rank"]) == 2  # one peak per process
    assert "| PyG DDP NeighborLoader | adj=csr, threads=1, workers=1, procs=2 |" in stdout


def test_overhead_one_partition_alternates_repetitions(tmp_path):
    stdout, saved = _bench(tmp_path, "overhead.py", "--parts", "1", "--reps", "2",
                           "--num-nodes", "1000", "--epochs", "1")
    reps = saved["repetitions"]
    assert [r["rep"] for r in reps] == [1, 2] and saved["target"] == 1.05
    assert all(r["ratio"] == r["pyg_dist_s"] / r["pyg_s"] for r in reps)
    assert all(len(r["pyg_epoch_times"]) == len(r["pyg_dist_epoch_times"]) == 2 for r in reps)
    ratio = saved["ratio"]
    assert ratio["min"] <= ratio["q1"] <= ratio["median"] <= ratio["q3"] <= ratio["max"]
    assert [r["name"] for r in saved["rows"]] == ["PyG (single process)", "pyg_dist, 1 part"]
    assert saved["rows"][1]["ratio"] == ratio["median"] and "target <= 1.05x" in stdout


def test_regime_suite_quick_on_the_papers_graph(tmp_path):
    r"""benchmarks/regime.py --quick end to end on the Reddit-shaped graph:
    the boundary table, BNS memory runs, the link choice, the methods with
    their goals, the JSON and the markdown (rmat's loading and partitioning:
    tests/datasets/test_regime_datasets.py)."""
    stdout, saved = _bench(tmp_path, "regime.py", "--quick", "--methods", "exact",
                           "BNS p=0.1", "--memory-parts", "2", "--memory-runs", "BNS p=1",
                           "BNS p=0.1")
    four = next(p for p in saved["partitions"] if p["parts"] == 4)
    # the regime: as many boundary nodes as inner ones in every part
    assert len(four["stats"]) == 4 and min(s["halo_ratio"] for s in four["stats"]) >= 1
    memory = {r["method"]: r for r in saved["memory"]}
    assert list(memory) == ["BNS p=1", "BNS p=0.1"]
    assert all(r["peak_above_baseline_max"] > 0 for r in memory.values())
    assert memory["BNS p=0.1"]["bytes_sent"] < 0.2 * memory["BNS p=1"]["bytes_sent"]
    assert [g["parts"] for g in saved["memory_goals"]] == [2]
    assert saved["probes"] == [] and saved["link"] == "loopback"  # one rate: no calibration
    runs = {r["method"]: r["summary"] for r in saved["methods"]}
    assert list(runs) == ["exact", "BNS p=0.1"]
    assert runs["exact"]["wire_bytes_per_epoch"] is None  # loopback has no per-rank counters
    assert 0 < runs["BNS p=0.1"]["bytes_sent"] < 0.2 * runs["exact"]["bytes_sent"]
    assert [g["method"] for g in saved["goals"]] == ["BNS p=0.1"]
    table = (tmp_path / "out.md").read_text()
    assert "| exact | " in table and "- BNS p=0.1: " in table and table in stdout


def test_sancus_quick_against_the_broadcast_baseline(tmp_path):
    r"""benchmarks/sancus.py --quick end to end: CAGNET's broadcast
    baseline and SANCUS's epoch bounds on it, the table, the claim lines
    and the JSON. SCS-E1 resends every other epoch, SCS-A1 every third
    (the first one, t = 0, is left out of the means), so each moves less."""
    stdout, saved = _bench(tmp_path, "sancus.py", "--quick", "--methods",
                           "CAGNET (broadcast)", "SCS-E1", "SCS-A1")
    runs = {r["method"]: r["runs"][0] for r in saved["results"]}
    assert list(runs) == ["CAGNET (broadcast)", "SCS-E1", "SCS-A1"]
    assert runs["CAGNET (broadcast)"]["bytes_saved"] == 0
    assert 0 < runs["SCS-A1"]["bytes_sent"] < runs["SCS-E1"]["bytes_sent"] \
        < runs["CAGNET (broadcast)"]["bytes_sent"]
    assert [line.split(":")[0] for line in saved["targets"]] == ["SCS-E1", "SCS-A1"]
    assert "less communication than CAGNET" in stdout and "< CAGNET" in stdout


def test_sequential_quick_memory_against_ranks(tmp_path):
    r"""benchmarks/sequential.py --quick end to end on a graph whose halo
    exceeds its interior: both exchanges at 1 and 2 ranks, the table, the
    target lines, the JSON and the plot."""
    stdout, saved = _bench(tmp_path, "sequential.py", "--quick")
    runs = [(r["graph"], r["ranks"], r["exchange"]) for r in saved["results"]]
    assert runs == [("reddit-shaped:random", 1, "halo"), ("reddit-shaped:random", 2, "halo"),
                    ("reddit-shaped:random", 2, "sequential")]
    assert all(r["above_baseline_max"] > 0 and r["epoch_time"] > 0 for r in saved["results"])
    assert saved["targets"][0].startswith("reddit-shaped:random 2 ranks: sequential")
    assert "linear ideal" in stdout
    assert os.path.exists(os.path.splitext(saved["args"]["out"])[0] + ".png")
