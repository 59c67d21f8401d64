"""The console script end to end: partition, info, train with spawned ranks.
The real console script, a process of its own, where the process is the
point (its exit status, torchrun); elsewhere its main() in this process
(:func:`cli`), whose ranks fork from this process' forkserver instead of
each run importing torch and PyG anew. Signals: tests/run/test_failures.py."""
import json
import os
import subprocess
import sys

import pytest

METRIC_KEYS = {"epoch", "loss", "train_acc", "val_acc", "test_acc", "time",
               "time_compute", "time_comm", "time_reduce", "time_sample", "bytes_sent",
               "halo_rows", "halo_rows_total", "peak_mem_bytes"}


def run(*args, check=True):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "pyg_dist.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=check)


def test_partition_info_train(tmp_path, cli):
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    p = cli("partition", "--num-nodes", "3000", "--num-parts", "2", "--root", root,
            "--data-dir", str(tmp_path / "data"))
    assert "halo/inner" in p.stdout and "edge_cut" in p.stdout
    assert "comm_volume" in cli("info", root).stdout
    cli("train", "--root", root, "--out", out, "--epochs", "2", "--hidden", "16",
        "--no-progress", "--model", "gcn", "--checkpoint-every", "1")
    assert {"curves.png", "time_breakdown.png", "memory.png"} <= set(os.listdir(out))
    cli("train", "--root", root, "--out", out, "--epochs", "3", "--hidden", "16",
        "--no-progress", "--model", "gcn", "--resume")
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert len(rows[-1]["peak_mem_per_rank"]) == 2
    pred = str(tmp_path / "pred")
    cli("predict", "--root", root, "--model-dir", out, "--out", pred)
    assert sorted(os.listdir(pred)) == ["pred_0.pt", "pred_1.pt", "predictions.json"]
    assert all(METRIC_KEYS <= set(r) for r in rows)
    assert rows[-1]["world_size"] == 2 and rows[-1]["bytes_sent"] > 0
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["world_size"] == 2 and 0.0 <= summary["test_acc"] <= 1.0


@pytest.mark.parametrize("args,message", [
    (["--model", "mlp"], "invalid choice"),
    (["--dropout", "1.5"], "dropout must be in [0, 1)"),
    (["--lr", "0"], "lr must be > 0"),
    (["--sampler", "bns", "--rate", "0.1"], "--rate do(es) not apply to --sampler bns"),
    (["--sampler", "bns", "--p", "2"], "p must be in [0, 1]"),
    (["--cache", "pipeline", "--bound", "fixed:1"], "--bound do(es) not apply to --cache"),
    (["--staleness", "0"], "staleness must be an integer >= 1"),
    (["--bound", "gap:-1"], "gap:H needs H > 0"),
    (["--feature-cache", "degree", "--feature-cache-capacity", "lots"], "capacity"),
    (["--loader", "neighbor", "--fanout", "5,5"], "fanout has 2 hops but the model has 3"),
    (["--loader", "neighbor", "--fanout", "5,x,5"], "fan-outs are integers"),
    (["--loader", "neighbor", "--sampler", "bns"], "halo samplers, caches"),
    (["--lr", "inf"], "lr must be > 0 and finite"),
    (["--lr", "nan"], "lr must be > 0 and finite"),
    (["--weight-decay", "nan"], "weight_decay must be >= 0 and finite"),
    (["--timeout", "0"], "--timeout must be a finite number > 0"),
    (["--timeout", "-3"], "--timeout must be a finite number > 0"),
    (["--heads", "0"], "heads must be >= 1"),
    (["--nproc", "-1"], "--nproc must be a finite number > 0"),
    (["--nproc", "0"], "--nproc must be a finite number > 0"),
    (["--resume", "--overwrite"], "choose one"),
    (["--bound", "gap-abs:0"], "gap-abs:H needs H > 0"),
    (["--bound", "adaptive:0.5"], "number of epochs >= 0"),
    (["--clip-grad", "0"], "--clip-grad must be a finite number > 0"),
    (["--exchange", "ring"], "invalid choice"),
    (["--exchange", "sequential", "--memory-budget", "lots"], "--memory-budget: a size"),
    (["--exchange", "sequential", "--memory-budget=-1G"], "--memory-budget: a size"),
    (["--memory-budget", "1G"], "memory_budget chooses per layer"),
    (["--exchange", "broadcast", "--sampler", "bns"], "does not combine with sampler='bns'"),
    (["--exchange", "broadcast", "--cache", "pipeline"], "cache='pipeline'"),
    (["--exchange", "broadcast", "--overlap"], "overlap=True"),
    (["--malloc", "tcmalloc"], "invalid choice"),
    (["--feature-cache-capacity", "200%"], "sizes a feature cache: give --feature-cache"),
    (["--loader", "neighbor", "--loader-workers", "0", "--fixed-depth"], "starts none"),
])
def test_bad_hyper_parameters(tmp_path, args, message, capsys):
    from pyg_dist.cli import main  # in process: refused before any rank starts
    with pytest.raises(SystemExit) as info:
        main(["train", "--root", str(tmp_path), *args])
    assert info.value.code != 0
    assert message in capsys.readouterr().err + str(info.value.code)


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_bad_graph_size_is_refused(tmp_path, value, capsys):
    from pyg_dist.cli import main
    with pytest.raises(SystemExit) as info:
        main(["partition", "--num-parts", "2", "--root", str(tmp_path), "--num-nodes", value])
    assert info.value.code != 0
    assert "--num-nodes must be a finite number > 0" in capsys.readouterr().err


def test_missing_partition_dir(tmp_path):
    p = run("train", "--root", str(tmp_path / "none"), check=False)
    assert p.returncode == 1 and "meta.json" in p.stderr


@pytest.mark.parametrize("malloc", ["reuse", "system"])
def test_one_rank_runs_itself_again_with_its_allocator_setting(tmp_path, malloc):
    r"""One rank trains in the command's own process: under ``reuse`` the
    command runs itself again with glibc's per-thread cache off (its output
    printed once), under ``system`` as it started."""
    from pyg_dist.utils.allocator import malloc_in_use
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    run("partition", "--num-nodes", "1000", "--num-parts", "1", "--root", root,
        "--data-dir", str(tmp_path / "data"))
    p = run("train", "--root", root, "--out", out, "--epochs", "1", "--hidden", "8",
            "--no-progress", "--no-plots", "--malloc", malloc)
    assert p.stdout.count('"world_size": 1') == 1
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["malloc_thread_cache"] is (
        None if malloc_in_use() is None else malloc == "system")


def test_torchrun(tmp_path):
    r"""Real torchrun: two ranks join through its environment."""
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    run("partition", "--num-nodes", "2000", "--num-parts", "2", "--root", root,
        "--data-dir", str(tmp_path / "data"))
    from pyg_dist.distributed import free_port
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-port", str(free_port()), "-m", "pyg_dist.cli", "train",
                    "--root", root,
                    "--out", out, "--epochs", "2", "--hidden", "8", "--no-progress",
                    "--sampler", "bns", "--p", "0.5", "--precompute-layer0",
                    "--exchange-dtype", "bf16"],
                   env=env, capture_output=True, text=True, timeout=300, check=True)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert len(rows) == 2 and rows[-1]["world_size"] == 2
    assert all(r["halo_rows"] < 0.8 * r["halo_rows_total"] for r in rows)
    summary = json.load(open(os.path.join(out, "summary.json")))
    config = summary["config"]
    assert config["sampler_args"] == {"p": 0.5} and config["exchange_dtype"] == "bf16"
    assert config["precompute_layer0"]
    # each rank ran the command again with glibc's per-thread cache off
    from pyg_dist.utils.allocator import malloc_in_use
    assert summary["malloc_thread_cache"] is (False if malloc_in_use() is not None else None)


def test_cohesive_batches_end_to_end(tmp_path, cli):
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    p = cli("partition", "--num-nodes", "2000", "--num-parts", "2", "--root", root,
            "--data-dir", str(tmp_path / "data"), "--num-batches", "4", "--balance-batches")
    assert "cohesive batches" in p.stdout and "below random batches" in p.stdout
    assert "balanced batch parts" in p.stdout
    cli("train", "--root", root, "--out", out, "--epochs", "3", "--hidden", "16",
        "--no-progress", "--loader", "cohesive", "--overlap", "--sampler", "bns", "--p", "0.5")
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert len(rows) == 3 and rows[-1]["loss"] < rows[0]["loss"]
    p = cli("train", "--root", root, "--loader", "cohesive", "--staleness", "1", check=False)
    assert p.returncode != 0 and "do not combine" in p.stderr


def test_cohesive_batches_cost_model(tmp_path, cli):
    r"""``partition --num-batches`` measures CM-GCN's cost constants here for
    the model that will train (or takes a ``calibrate`` file), stores them
    with the batches and prints them; ``--balance-rule greedy``."""
    from pyg_dist.distributed import rank_threads
    from pyg_dist.loader import load_batch_cost
    root = str(tmp_path / "parts")
    common = ("partition", "--num-nodes", "1000", "--num-parts", "2", "--root", root,
              "--data-dir", str(tmp_path / "data"), "--num-batches", "3")
    p = cli(*common, "--hidden", "24", "--batch-layers", "2", "--model", "gcn")
    cost = load_batch_cost(root)
    assert list(cost.dims[1:-1]) == [24] and cost.num_layers == 2
    assert cost.measured["model"] == "gcn" and cost.measured["threads"] == rank_threads(2)
    assert f"alpha/beta {cost.alpha / cost.beta:.3g}" in p.stdout
    constants = str(tmp_path / "measured_elsewhere.json")
    cli("calibrate", "--out", constants, "--threads", "1", "--hidden", "16")
    p = cli(*common, "--cost-constants", constants, "--balance-batches",
            "--balance-rule", "greedy")
    saved, cost = json.load(open(constants)), load_batch_cost(root)
    assert all(getattr(cost, k) == saved[k] for k in ("alpha", "beta", "gamma", "eta", "lam"))
    assert cost.measured == saved["measured"] and saved["measured"]["dims"][1] == 16
    assert list(cost.dims[1:-1]) == [64, 64]  # this graph's widths: train's default model
    assert f"cost model from {constants}" in p.stdout and "(greedy rule)" in p.stdout


@pytest.mark.parametrize("args,message", [
    (["--cost-constants", "{missing}"], "does not exist"),
    (["--cost-constants", "{corrupt}"], "not readable JSON"),
    (["--cost-constants", "{wrong}"], "missing beta"),
    (["--balance-rule", "greedy"], "--balance-rule needs --balance-batches"),
    (["--hidden", "0"], "--batch-hidden must be a finite number > 0"),
    (["--batch-layers", "0"], "--batch-layers must be >= 1"),
])
def test_bad_cost_model_flags_are_refused(tmp_path, args, message, capsys):
    from pyg_dist.cli import main  # in process: refused before any work
    files = {"missing": tmp_path / "none.json", "corrupt": tmp_path / "corrupt.json",
             "wrong": tmp_path / "wrong.json"}
    files["corrupt"].write_text("{\"alpha\": 1e-9,")
    files["wrong"].write_text(json.dumps({"alpha": 1e-9, "gamma": 1e-9, "eta": 1e-9,
                                          "lam": 1e-9}))
    root = tmp_path / "parts"
    with pytest.raises(SystemExit) as info:
        main(["partition", "--num-parts", "2", "--root", str(root), "--num-nodes", "500",
              "--num-batches", "2", *[a.format(**files) for a in args]])
    assert info.value.code != 0
    assert message in capsys.readouterr().err + str(info.value.code)
    assert not root.exists()  # nothing was partitioned


def test_neighbor_loader_end_to_end(tmp_path, cli):
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    cli("partition", "--num-nodes", "2000", "--num-parts", "2", "--root", root,
        "--data-dir", str(tmp_path / "data"), "--method", "block")
    cli("train", "--root", root, "--out", out, "--epochs", "3", "--hidden", "16",
        "--no-progress", "--loader", "neighbor", "--fanout", "10,5,5", "--batch-size", "16",
        "--sampler-workers", "2", "--feature-cache", "degree")
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert len(rows) == 3 and rows[-1]["loss"] < rows[0]["loss"]
    assert all(METRIC_KEYS <= set(r) for r in rows)
    assert all(r["seeds_per_s"] > 0 and 0 <= r["trainer_idle_frac"] <= 1
               and r["in_flight"] >= 1 and r["feature_bytes"] > 0
               and 0 < r["cache_hit_rate"] <= 1 for r in rows)
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["test_acc"] > 0.25  # 10 classes: chance is 0.1
    assert summary["config"]["fanout"] == [10, 5, 5]


@pytest.mark.parametrize("text, expected", [("0", 0), ("4096", 4096), ("512K", 512 << 10),
                                            ("16M", 16 << 20), ("1.5G", 3 << 29),
                                            ("2GiB", 2 << 30), ("3mb", 3 << 20)])
def test_memory_budget_sizes(text, expected):
    from pyg_dist.cli import size_in_bytes
    assert size_in_bytes(text) == expected
