r"""IntelLabs' SAR and pyg_dist side by side, full-graph training on the same
graph, parts, model, initial weights and loss; and one full-graph step of
each under ``torch.profiler``.

The workload (the defaults): pyg_dist's ``reddit_shaped(num_nodes=30000,
seed=0)`` (3M directed edges, 602 features, 41 classes), a 3-layer GraphSAGE
(mean aggregation, hidden 128, dropout 0.5: the model of the mini-batch
comparison with DistDGL, ``benchmarks/distdgl.py``), Adam lr 0.01, 10
epochs of one full-graph step each, ranks 1, 2, 4 and 8 on this machine,
``OMP_NUM_THREADS=1`` per rank, 3 repeats, the runs of a rank count
alternated SAR / pyg_dist.

Systems (``--systems``):

* ``sar``: SAR's default, sequential aggregation and rematerialisation (one
  peer's rows at a time, fetched again in the backward pass);
* ``sar-oneshot``: SAR's one-shot aggregation (``get_full_partition_graph``:
  every remote row a layer needs at once; needs the patch of
  ``benchmarks/sar_env.sh``);
* ``pyg-seq``: ``pyg_dist`` with ``--exchange sequential`` (SAR's scheme);
* ``pyg``: ``pyg_dist``'s default (the halo exchange);
* ``pyg-pre``, ``pyg-seq-pre``: ``pyg`` and ``pyg-seq`` with
  ``--precompute-layer0`` (the first layer's aggregation of the input
  features, which no step changes, computed once: exact);
* ``pyg-seq-pre-budget``: ``pyg-seq-pre`` with ``--memory-budget``
  (``--pyg-memory-budget``, default 16M): the layers whose halo rows fit
  receive them at once, the others one peer's rows at a time (each run
  records which: ``layer_aggregation``).

Any ``pyg-FLAG-...`` name runs pyg_dist with those flags (:data:`PYG_FLAGS`;
``pyg-pre-overlap``: ``--precompute-layer0 --overlap``).

``summary[ranks]["fastest"]`` names each side's fastest system of the run,
and ``ratios`` holds their ratio beside the fixed pairs.

With one rank there is no exchange: ``sar`` and the pyg_dist systems whose
flags are among :data:`ONE_RANK_FLAGS` run (``pyg-seq`` at one rank: the
sequential engine's kernels on the whole graph, the one-process reference
of its ranks' memory).

How both get the same work:

* **Graph and parts.** ``pyg-dist partition --dataset reddit-shaped --method
  metis`` (the user's path) writes pyg_dist's parts; its node assignment is
  given to ``dgl.distributed.partition_graph`` in place of DGL's METIS call
  (``benchmarks/sar_rank.py partition``), and DGL's parts are checked to hold
  exactly pyg_dist's nodes, node for node.
* **Model and weights.** One PyG ``GraphSAGE`` (pyg_dist's ``build_model``,
  seeded): its weights go to pyg_dist as they are and to DGL's ``SAGEConv``
  as ``fc_neigh = lin_l``, ``fc_self = lin_r`` with ``lin_l``'s bias. Both
  apply ReLU then dropout between layers.
* **Loss and step.** Cross-entropy summed over a rank's training nodes over
  all ranks' training nodes (SAR's examples; pyg_dist's loss), gradients
  summed over the ranks, Adam. With ``--agreement-ranks`` (default 2),
  every system first trains 3 epochs with dropout off: the epochs' losses
  must agree (written as ``agreement``).
* **pyg_dist** trains through its Python API (``check_training`` then
  ``run_ranks`` over ``pyg_dist.train.train``, what ``pyg-dist train``
  runs), with ``build_model`` wrapped to load the weights (the CLI takes no
  initial weights), its ranks started as ``pyg-dist train`` starts them
  (``--pyg-launch spawn``, the default: one rank in the driver's child
  process, more forked from the forkserver that imported torch and PyG once,
  with the environment of allocator ``reuse``) or by
  ``torch.distributed.run`` (``--pyg-launch torchrun``: every rank a fresh
  interpreter that imports torch and PyG itself, as SAR's ranks do; their
  RSS holds the pages of libtorch the imports touched, about 70 MiB more
  per rank); evaluation off during training. **SAR** runs as its examples do, one
  process per rank (``benchmarks/sar_rank.py train``, in SAR's venv), gloo
  on loopback.

Measured per run: the epoch time, the max over ranks of each epoch's step
(forward, backward, gradient all-reduce, optimiser step), the median of
epochs 3..N (``--skip``: the first two pay one-off costs); peak RSS per
rank: the resident high-water mark of each epoch's step window
(``/proc/self/status`` ``VmHWM``, reset by ``/proc/self/clear_refs`` at the
step's start, as pyg_dist's metrics do; max over epochs), and each rank
process' lifetime peak polled from ``/proc`` by this driver
(``--poll-interval``); test accuracy of the final weights, both by one
single-process PyG model with exact full-graph inference; the load average
before and after every run. Before a timed run the driver waits while the
1-minute load average is above ``--max-load``, polling every 60 s, at most
``--load-wait`` seconds in all.

The profile (``--what profile``): one process, the same graph, model and
weights, ``--profile-warmup`` steps then ``--profile-steps`` steps under
``torch.profiler`` for SAR (default mode) and for ``pyg_dist.train.train``
(its step wrapped); every event's self CPU time goes to forward, backward
or optimiser (by its ancestors) and to a kind (aggregation, exchange, GEMM,
dropout, activation, loss, optimiser, other), per step. DGL's sparse kernels are not
torch operators: they are wrapped in ``record_function`` (``dgl::gspmm``
...) for the profile.

Usage (``make bench-sar-env`` first)::

    .venv/bin/python benchmarks/sar.py                # ranks 1,2,4,8, then the profile
    .venv/bin/python benchmarks/sar.py --ranks 1,4 --what bench
    .venv/bin/python benchmarks/sar.py --what profile
    .venv/bin/python benchmarks/sar.py --quick        # small graph, 1 and 2 ranks, 2 epochs

Results: ``benchmarks/results/sar_reddit_shaped.json`` and
``sar_profile.json`` (``_quick`` with ``--quick``; ``--out``, ``--profile-out``).
"""
import argparse
import json
import os
import os.path as osp
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(HERE)
SCRIPT = osp.abspath(__file__)
RANK_SCRIPT = osp.join(HERE, "sar_rank.py")
RESULTS_DIR = osp.join(HERE, "results")
MiB = 2 ** 20

sys.path.insert(0, HERE)
from common import portable  # noqa: E402
from distdgl import (_loadavg, _proc_status, _read_json, _write_json,  # noqa: E402
                     dgl_to_pyg, full_graph_accuracies, machine_info, pyg_to_dgl)

QUICK = {"num_nodes": 4000, "epochs": 2, "repeats": 1, "ranks": [1, 2], "skip": 0,
         "profile_warmup": 1, "profile_steps": 1}
FULL = {"num_nodes": 30000, "epochs": 10, "repeats": 3, "ranks": [1, 2, 4, 8], "skip": 2,
        "profile_warmup": 2, "profile_steps": 3}
#: The systems by name; a pyg_dist system with flags is ``pyg-FLAG-...`` (:func:`label`).
SYSTEMS = {"sar": "SAR default (sequential + remat.)", "sar-oneshot": "SAR one-shot",
           "pyg": "pyg_dist default (halo)"}
#: A pyg_dist system's name: ``pyg`` and its flags, in any order.
PYG_FLAGS = {"seq": "--exchange sequential", "pre": "--precompute-layer0",
             "budget": "--memory-budget", "overlap": "--overlap", "compact": "--malloc compact"}


def label(system: str) -> str:
    r"""What a system is, in the tables."""
    return SYSTEMS.get(system) or "pyg_dist " + " ".join(PYG_FLAGS[f] for f in pyg_flags(system))


def pyg_flags(system: str) -> List[str]:
    r"""The flags a pyg_dist system's name gives (``pyg-seq-pre``: seq, pre)."""
    return system.split("-")[1:]


#: The flags a one-rank run takes: it has no exchange, but these change its
#: kernels or memory (``seq``: the sequential engine's, one pass per piece,
#: no column blocks), so a one-rank run is the reference of their ranks.
ONE_RANK_FLAGS = ("seq", "pre", "compact")


# --------------------------------------------------------------------------- #
# The pyg_dist ranks (project venv; started as pyg-dist train starts them, or by torchrun)
# --------------------------------------------------------------------------- #

def _train_with_weights(root: str, config, out: str, weights: str, run_dir: str,
                        profile: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    r"""``pyg_dist.train.train`` with the model's initial weights loaded
    (``train`` builds its model with ``build_model``: that one call is
    wrapped); with :obj:`profile`, steps ``warmup+1 .. warmup+steps`` run
    under ``torch.profiler``."""
    import torch
    import torch.distributed as dist
    import pyg_dist.train as pyg_train

    state = torch.load(weights, weights_only=True)
    original, original_step = pyg_train.build_model, pyg_train._Run.step

    def build_with_weights(cfg, in_channels, out_channels):
        model = original(cfg, in_channels, out_channels)
        model.load_state_dict(state)  # strict: every key and shape
        return model

    pyg_train.build_model = build_with_weights
    if profile is not None:
        pyg_train._Run.step = _profiled_step(original_step, profile)
    try:
        summary = pyg_train.train(root, config, out)
    finally:
        pyg_train.build_model, pyg_train._Run.step = original, original_step
    rank = dist.get_rank()
    _write_json(osp.join(run_dir, f"pyg_rank{rank}.json"),
                {"rank": rank, "world": dist.get_world_size(), "pid": os.getpid(),
                 "torch_threads": torch.get_num_threads(),
                 "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                 "engine": summary.get("engine"), "torch": torch.__version__})
    return summary


def _profiled_step(step, profile: Dict[str, Any]):
    import torch
    from torch.profiler import ProfilerActivity

    calls = {"n": 0, "prof": None, "walls": []}

    def wrapped(self, batch, epoch):
        calls["n"] += 1
        n, warmup, steps = calls["n"], profile["warmup"], profile["steps"]
        if not warmup < n <= warmup + steps:
            return step(self, batch, epoch)
        if calls["prof"] is None:
            calls["prof"] = torch.profiler.profile(activities=[ProfilerActivity.CPU])
            calls["prof"].__enter__()
        start = time.perf_counter()
        with torch.profiler.record_function("## step ##"):
            loss = step(self, batch, epoch)
        calls["walls"].append(time.perf_counter() - start)
        if n == warmup + steps:
            prof = calls["prof"]
            prof.__exit__(None, None, None)
            sys.path.insert(0, HERE)
            from sar_rank import event_rows
            _write_json(profile["out"], {"walls": calls["walls"], "events": event_rows(prof),
                                         "torch": torch.__version__})
        return loss
    return wrapped


def pyg_rank_main(spec_path: str) -> int:
    from pyg_dist.config import TrainConfig
    from pyg_dist.launch import run_ranks
    from pyg_dist.preflight import check_training
    spec = _read_json(spec_path)
    config = TrainConfig(**spec["config"])
    config.validate()
    check_training(spec["root"], config, spec["out"], None)  # what run_training checks
    # Without torchrun's environment, run_ranks starts the ranks as `pyg-dist
    # train` does (one rank: in this process; more: forked from its forkserver).
    run_ranks(_train_with_weights, (spec["root"], config, spec["out"], spec["weights"],
                                    spec["run_dir"], spec.get("profile")),
              spec["root"], None, spec["timeout"], config.malloc)
    return 0


# --------------------------------------------------------------------------- #
# Preparation: graph, parts (both systems), weights
# --------------------------------------------------------------------------- #

def _sar_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["DGLBACKEND"] = "pytorch"
    env.pop("PYTHONPATH", None)  # the SAR venv imports nothing of this tree
    return env


def load_graph(args):
    from pyg_dist.datasets import load_reddit_shaped
    return load_reddit_shaped(root=osp.join(args.workdir, "data"), seed=args.data_seed,
                              num_nodes=args.num_nodes)


def model_config(args, classes: int, **extra: Any) -> Dict[str, Any]:
    return {"model": "sage", "num_layers": args.layers, "hidden": args.hidden,
            "dropout": args.dropout, "lr": args.lr, "weight_decay": 0.0,
            "epochs": args.epochs, "seed": args.seed, "loader": "full", "eval_every": 0,
            "progress": False, "overwrite": True, **extra}


def prepare_weights(args, data) -> Dict[str, Any]:
    r"""The initial weights, pyg_dist's ``build_model`` seeded with ``--seed``,
    in PyG's layout and DGL's."""
    import numpy as np
    import torch
    from pyg_dist.config import TrainConfig, build_model
    classes = int(data.y.max()) + 1
    model = build_model(TrainConfig(**model_config(args, classes)), data.num_features, classes)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pyg_path = osp.join(args.workdir, f"init_seed{args.seed}.pt")
    torch.save(state, pyg_path)
    dgl_path = osp.join(args.workdir, f"init_seed{args.seed}_dgl.npz")
    np.savez(dgl_path, **{k: v.numpy() for k, v in pyg_to_dgl(state, args.layers).items()})
    return {"pyg": pyg_path, "dgl": dgl_path, "classes": classes}


def prepare_parts(args, data, ranks: int) -> Dict[str, Any]:
    r"""pyg_dist's METIS parts (``pyg-dist partition``) and DGL's parts of the
    same assignment for SAR, checked node for node; reused when present."""
    import numpy as np
    import torch
    from pyg_dist.partition import PartitionBook
    from pyg_dist.partition.partition import graph_hash
    w = args.workdir
    root = osp.join(w, f"parts{ranks}")
    if not osp.exists(osp.join(root, "meta.json")):
        cli = osp.join(osp.dirname(sys.executable), "pyg-dist")
        cmd = [cli, "partition", "--dataset", "reddit-shaped", "--num-nodes",
               str(args.num_nodes), "--data-seed", str(args.data_seed), "--data-dir",
               osp.join(w, "data"), "--num-parts", str(ranks), "--method", "metis",
               "--root", root]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    book = PartitionBook.load(root)
    assert book.meta["graph_hash"] == graph_hash(data), "partitions of another graph"
    dgl_parts = osp.join(w, f"dgl_parts{ranks}")
    check_file = osp.join(dgl_parts, "assignment_check.json")
    if not osp.exists(check_file):
        assignment = torch.empty(data.num_nodes, dtype=torch.long)
        assignment[book.perm] = book.owner(torch.arange(data.num_nodes))
        graph_npz = osp.join(w, f"graph_parts{ranks}.npz")
        np.savez(graph_npz, src=data.edge_index[0].numpy(), dst=data.edge_index[1].numpy(),
                 x=data.x.numpy(), y=data.y.numpy(), assignment=assignment.numpy(),
                 train_mask=data.train_mask.numpy(), val_mask=data.val_mask.numpy(),
                 test_mask=data.test_mask.numpy())
        shutil.rmtree(dgl_parts, ignore_errors=True)
        subprocess.run([args.sar_python, RANK_SCRIPT, "partition", "--graph", graph_npz,
                        "--out", dgl_parts], check=True, env=_sar_env(), cwd=REPO)
        os.remove(graph_npz)
    check = _read_json(check_file)
    if not all(check["identical_parts"]):
        raise SystemExit(f"DGL's parts differ from pyg_dist's: {check}")
    return {"root": root, "part_config": check["part_config"], "assignment_check": check,
            "partition": {k: book.meta.get(k) for k in ("method", "edge_cut_ratio",
                                                        "comm_volume")}}


# --------------------------------------------------------------------------- #
# Runs
# --------------------------------------------------------------------------- #

class Poller:
    r"""Polls the resident set of a process tree from ``/proc`` in a thread:
    per process, the largest ``VmHWM`` and ``VmRSS`` seen."""

    def __init__(self, roots: List[int], interval: float) -> None:
        self.roots, self.interval = roots, interval
        self.peaks: Dict[int, Dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> List[int]:
        out, stack = [], list(self.roots)
        while stack:
            pid = stack.pop()
            out.append(pid)
            try:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{tid}/children") as f:
                        stack.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                pass
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self._tree():
                status = _proc_status(pid)
                row = self.peaks.setdefault(pid, {})
                for key in ("VmHWM", "VmRSS"):
                    if key in status:
                        row[key] = max(row.get(key, 0), status[key])
            self._stop.wait(self.interval)

    def stop(self) -> Dict[int, Dict[str, int]]:
        self._stop.set()
        self._thread.join()
        return self.peaks


def wait_for_load(args, budget: Dict[str, float]) -> List[float]:
    r"""Waits (polling every 60 s) while the 1-minute load average is above
    ``--max-load``, for at most what is left of ``--load-wait`` in all;
    returns the load average it starts the run at."""
    while _loadavg()[0] > args.max_load and budget["left"] > 0:
        print(f"  load average {_loadavg()[0]:.2f} > {args.max_load}: waiting "
              f"({budget['left']:.0f} s of waiting left)", flush=True)
        pause = min(60.0, budget["left"])
        time.sleep(pause)
        budget["left"] -= pause
    return _loadavg()


def cpu_busy(seconds: float = 3.0) -> float:
    r"""The fraction of all cores busy over the next :obj:`seconds` (from
    ``/proc/stat``): what else runs on the machine right now, which the
    1-minute load average shows only with a lag."""
    def sample():
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return sum(values), values[3] + values[4]  # idle + iowait
    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return round(1 - (idle1 - idle0) / max(total1 - total0, 1), 3)


def _wait(procs: List[subprocess.Popen], timeout: float) -> List[int]:
    deadline = time.time() + timeout
    while any(p.poll() is None for p in procs):
        if time.time() > deadline or any(p.returncode not in (None, 0) for p in procs):
            time.sleep(5 if time.time() <= deadline else 0)  # let the others fail first
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    return [p.wait() for p in procs]


def _thread_env() -> Dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def launch_sar(args, parts, weights, system: str, ranks: int, run_dir: str,
               index: int, dropout: float, epochs: int) -> Dict[str, Any]:
    spec = {"world": ranks, "mode": "one-shot" if system == "sar-oneshot" else "sar",
            "part_config": parts["part_config"], "layers": args.layers,
            "hidden": args.hidden, "dropout": dropout, "lr": args.lr, "epochs": epochs,
            "in_feats": args.num_features, "classes": weights["classes"],
            "weights": weights["dgl"], "seed": args.seed, "run_dir": run_dir,
            "master_port": 29700 + index % 200}
    spec_path = osp.join(run_dir, "spec.json")
    _write_json(spec_path, spec)
    env = {**_sar_env(), **{k: v for k, v in _thread_env().items()
                            if k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED")}}
    procs = []
    for r in range(ranks):
        log = open(osp.join(run_dir, f"rank{r}.log"), "w")
        procs.append(subprocess.Popen([args.sar_python, RANK_SCRIPT, "train", "--spec",
                                       spec_path, "--rank", str(r)], env=env, cwd=REPO,
                                      stdout=log, stderr=subprocess.STDOUT))
    poller = Poller([p.pid for p in procs], args.poll_interval)
    codes = _wait(procs, args.timeout)
    peaks = poller.stop()
    if any(codes):
        raise RuntimeError(f"SAR ranks exited {codes}:\n" + _tail(run_dir))
    rows = [_read_json(osp.join(run_dir, f"sar_rank{r}.json")) for r in range(ranks)]
    epochs_out = []
    for e in range(epochs):
        per = [row["epochs"][e] for row in rows]
        epochs_out.append({"epoch": e + 1, "time": max(x["time"] for x in per),
                           "time_per_rank": [x["time"] for x in per], "loss": per[0]["loss"],
                           "peak_rss_per_rank": [x["peak_rss"] for x in per]})
    import numpy as np
    import torch
    arrays = np.load(osp.join(run_dir, "sar_final.npz"))
    state = dgl_to_pyg({k: torch.from_numpy(arrays[k].copy()) for k in arrays.files},
                       args.layers)
    return {"epochs": epochs_out, "state": state,
            "polled_peak_rss_per_rank": [peaks.get(row["pid"], {}).get("VmHWM")
                                         for row in rows],
            "ranks_info": [{k: row[k] for k in ("rank", "pid", "torch_threads",
                                                "omp_num_threads", "num_local_train",
                                                "baseline_rss", "dgl", "torch")}
                           for row in rows]}


def launch_pyg(args, parts, weights, system: str, ranks: int, run_dir: str, index: int,
               dropout: float, epochs: int,
               profile: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    from pyg_dist.cli import size_in_bytes
    from pyg_dist.utils.allocator import rank_environment
    flags = pyg_flags(system)
    config = model_config(args, weights["classes"], dropout=dropout, epochs=epochs,
                          exchange="sequential" if "seq" in flags else "halo",
                          precompute_layer0="pre" in flags, overlap="overlap" in flags,
                          malloc="compact" if "compact" in flags else "reuse",
                          memory_budget=(size_in_bytes(args.pyg_memory_budget)
                                         if "budget" in flags else None))
    out = osp.join(run_dir, "out")
    spec = {"root": osp.abspath(parts["root"]), "config": config, "out": out,
            "weights": weights["pyg"], "run_dir": run_dir, "timeout": 600,
            "profile": profile}
    spec_path = osp.join(run_dir, "spec.json")
    _write_json(spec_path, spec)
    env = _thread_env()
    env.update(rank_environment(config["malloc"]))  # as pyg-dist train's ranks
    env.setdefault("PYTHONWARNINGS", "ignore")
    cmd = [sys.executable, SCRIPT, "pyg-rank", "--spec", spec_path]
    if args.pyg_launch == "torchrun":
        cmd[1:1] = ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                    str(ranks), "--master-addr", "127.0.0.1", "--master-port",
                    str(29500 + index % 150)]
    log = open(osp.join(run_dir, "launcher.log"), "w")
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    poller = Poller([proc.pid], args.poll_interval)
    codes = _wait([proc], args.timeout)
    peaks = poller.stop()
    if any(codes):
        raise RuntimeError(f"pyg_dist exited {codes}:\n" + _tail(run_dir))
    infos = [_read_json(osp.join(run_dir, f"pyg_rank{r}.json")) for r in range(ranks)]
    with open(osp.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    epochs_out = [{"epoch": r["epoch"], "time": r["time"], "loss": r["loss"],
                   "peak_rss_per_rank": r.get("peak_mem_per_rank"),
                   "baseline_rss_per_rank": r.get("baseline_mem_per_rank"),
                   "code_per_rank": r.get("code_mem_per_rank"),
                   "live_per_rank": r.get("live_mem_per_rank"),
                   "baseline_live_per_rank": r.get("baseline_live_mem_per_rank"),
                   "time_comm": r.get("time_comm"), "time_reduce": r.get("time_reduce")}
                  for r in rows]
    from pyg_dist.train import load_model
    summary = _read_json(osp.join(out, "summary.json"))
    return {"epochs": epochs_out, "state": load_model(out).state_dict(),
            "launch": args.pyg_launch, "engine": summary.get("engine"),
            "layer_aggregation": summary.get("layer_aggregation"),
            "polled_peak_rss_per_rank": [peaks.get(i["pid"], {}).get("VmHWM") for i in infos],
            "ranks_info": infos}


def _tail(run_dir: str, lines: int = 12) -> str:
    out = []
    for name in sorted(os.listdir(run_dir)):
        if name.endswith(".log"):
            with open(osp.join(run_dir, name), errors="replace") as f:
                out.append(f"--- {name}\n" + "".join(f.readlines()[-lines:]))
    return "\n".join(out)


def evaluate(state, args, data, classes: int) -> Dict[str, float]:
    r"""Exact full-graph inference of one single-process PyG GraphSAGE with
    :obj:`state`: the same evaluation for both systems."""
    return full_graph_accuracies(model_config(args, classes), classes, data, state)


def run_one(args, data, parts, weights, system: str, ranks: int, index: int,
            dropout: float, epochs: int, timed: bool, budget) -> Dict[str, Any]:
    run_dir = osp.abspath(osp.join(args.workdir, "runs", f"{index:03d}_{ranks}r_{system}"))
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    record: Dict[str, Any] = {"system": system, "ranks": ranks, "index": index,
                              "dropout": dropout, "epochs_run": epochs}
    record["loadavg_before"] = wait_for_load(args, budget) if timed else _loadavg()
    record["cpu_busy_before"] = cpu_busy()
    launch = launch_sar if system.startswith("sar") else launch_pyg
    started = time.time()
    try:
        result = launch(args, parts, weights, system, ranks, run_dir, index, dropout, epochs)
    except Exception as e:  # noqa: BLE001: recorded, the other runs go on
        record.update(ok=False, error=f"{type(e).__name__}: {e}",
                      loadavg_after=_loadavg(), wall_s=time.time() - started)
        print(f"  FAILED: {record['error'][:2000]}", flush=True)
        return record
    record["wall_s"] = time.time() - started
    record["loadavg_after"] = _loadavg()
    state = result.pop("state")
    timed_epochs = result["epochs"][args.skip:] or result["epochs"]
    peak = [max(e["peak_rss_per_rank"][r] for e in result["epochs"]) for r in range(ranks)]
    if all(e.get("baseline_rss_per_rank") for e in result["epochs"]):
        # what training adds to a rank's resident set (pyg_dist's metrics)
        record["training_rss_per_rank_mib"] = [
            round(max(e["peak_rss_per_rank"][r] - e["baseline_rss_per_rank"][r]
                      for e in result["epochs"]) / MiB, 1) for r in range(ranks)]
        # of it: libtorch's machine code first run after the baseline (the
        # same file pages in every process), and glibc's bytes in use
        record["training_code_per_rank_mib"] = [
            round(max((e["code_per_rank"] or [0] * ranks)[r] or 0
                      for e in result["epochs"]) / MiB, 1) for r in range(ranks)]
        if all(e.get("baseline_live_per_rank") for e in result["epochs"]):
            record["training_live_per_rank_mib"] = [
                round(max(e["live_per_rank"][r] - e["baseline_live_per_rank"][r]
                          for e in result["epochs"]) / MiB, 1) for r in range(ranks)]
    record.update(ok=True, **result,
                  s_per_epoch=statistics.median(e["time"] for e in timed_epochs),
                  epoch_times=[e["time"] for e in result["epochs"]],
                  losses=[e["loss"] for e in result["epochs"]],
                  peak_rss_per_rank_mib=[round(b / MiB, 1) for b in peak],
                  polled_peak_rss_per_rank_mib=[round(b / MiB, 1) if b else None
                                                for b in result["polled_peak_rss_per_rank"]],
                  **evaluate(state, args, data, weights["classes"]))
    print(f"  {record['s_per_epoch']:.3f} s/epoch, peak RSS/rank "
          f"{'/'.join(f'{v:.0f}' for v in record['peak_rss_per_rank_mib'])} MiB, test acc "
          f"{100 * record['test_acc']:.2f}%, losses {[round(v, 4) for v in record['losses']]}, "
          f"load {record['loadavg_before'][0]:.2f}->{record['loadavg_after'][0]:.2f}",
          flush=True)
    return record


def systems_for(args, ranks: int) -> List[str]:
    return [s for s in args.systems if ranks > 1 or s == "sar" or (
        s.startswith("pyg") and set(pyg_flags(s)) <= set(ONE_RANK_FLAGS))]


def agreement(args, data, weights, budget) -> Dict[str, Any]:
    r"""Every system, dropout off, ``--agreement-epochs`` epochs on
    ``--agreement-ranks`` ranks: the epochs' losses side by side (the first
    is the initial weights' loss, the later ones follow the gradients and
    Adam's steps) and their largest relative difference."""
    k = args.agreement_ranks
    parts = prepare_parts(args, data, k)
    out: Dict[str, Any] = {"ranks": k, "epochs": args.agreement_epochs, "losses": {}}
    for i, system in enumerate(systems_for(args, k)):
        print(f"[agreement] {system}, {k} ranks, dropout 0", flush=True)
        r = run_one(args, data, parts, weights, system, k, 900 + i, 0.0,
                    args.agreement_epochs, False, budget)
        out["losses"][system] = r.get("losses")
        out.setdefault("errors", {})[system] = r.get("error")
    losses = [v for v in out["losses"].values() if v]
    ref = losses[0] if losses else []
    out["max_rel_diff"] = max((abs(a - b) / max(abs(b), 1e-12) for other in losses[1:]
                               for a, b in zip(other, ref)), default=None)
    print(f"[agreement] max relative loss difference: {out['max_rel_diff']}", flush=True)
    return out


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for r in runs:
        if not r.get("ok"):
            continue
        row = out.setdefault(str(r["ranks"]), {}).setdefault(r["system"], {"runs": []})
        row["runs"].append(r)
    for by_system in out.values():
        for system, row in by_system.items():
            ok = row.pop("runs")
            s = [r["s_per_epoch"] for r in ok]
            peak = [max(r["peak_rss_per_rank_mib"]) for r in ok]
            polled = [max(v for v in r["polled_peak_rss_per_rank_mib"] if v) for r in ok
                      if any(r["polled_peak_rss_per_rank_mib"])]
            row.update(runs=len(ok), s_per_epoch_median=statistics.median(s),
                       s_per_epoch_range=[min(s), max(s)],
                       peak_rss_per_rank_mib_median=statistics.median(peak),
                       peak_rss_per_rank_mib_range=[min(peak), max(peak)],
                       polled_peak_rss_per_rank_mib_median=(statistics.median(polled)
                                                            if polled else None),
                       **({"training_rss_per_rank_mib_median": statistics.median(
                               max(r["training_rss_per_rank_mib"]) for r in ok),
                           "training_rss_all_ranks_mib_median": statistics.median(
                               sum(r["training_rss_per_rank_mib"]) for r in ok)}
                          if all("training_rss_per_rank_mib" in r for r in ok) else {}),
                       **({f"{kind}_all_ranks_mib_median": statistics.median(
                               sum(r[f"{kind}_per_rank_mib"]) for r in ok)
                           for kind in ("training_code", "training_live")
                           if all(f"{kind}_per_rank_mib" in r for r in ok)}),
                       test_acc_mean=statistics.mean(r["test_acc"] for r in ok),
                       test_acc_range=[min(r["test_acc"] for r in ok),
                                       max(r["test_acc"] for r in ok)],
                       loadavg_before=[r["loadavg_before"][0] for r in ok],
                       loadavg_after=[r["loadavg_after"][0] for r in ok])
        pairs = [("pyg-seq", "sar"), ("pyg", "sar-oneshot"), ("pyg", "sar"),
                 ("pyg-pre", "sar"), ("pyg-pre", "sar-oneshot"), ("pyg-seq-pre", "sar"),
                 ("pyg-seq-pre-budget", "sar"), ("pyg-seq-pre-budget", "sar-oneshot")]
        # each side at its fastest configuration of this run
        fastest = [min((s for s in by_system if s.startswith(side) and "runs" in by_system[s]),
                       key=lambda s: by_system[s]["s_per_epoch_median"], default=None)
                   for side in ("pyg", "sar")]
        for ours, theirs in pairs + ([tuple(fastest)] if all(fastest) else []):
            if ours in by_system and theirs in by_system:
                a, b = by_system[ours], by_system[theirs]
                by_system.setdefault("ratios", {})[f"{ours}/{theirs}"] = {
                    "s_per_epoch": a["s_per_epoch_median"] / b["s_per_epoch_median"],
                    "peak_rss_per_rank": (a["peak_rss_per_rank_mib_median"]
                                          / b["peak_rss_per_rank_mib_median"]),
                    "test_acc_pp": 100 * (a["test_acc_mean"] - b["test_acc_mean"])}
        if all(fastest):
            by_system["fastest"] = {"pyg_dist": fastest[0], "sar": fastest[1]}
    return out


def table(summary: Dict[str, Any], systems: List[str]) -> str:
    r"""The markdown table: per rank count and system, the median epoch
    (range), the median peak RSS per rank, the test accuracy and the load
    averages the runs started at."""
    head = "| ranks | " + " | ".join(label(s) for s in systems) + " |"
    lines = [head, "|---|" + "---|" * len(systems)]
    for ranks, by_system in sorted(summary.items(), key=lambda kv: int(kv[0])):
        cells = []
        for s in systems:
            row = by_system.get(s)
            if row is None:
                cells.append("–")
                continue
            lo, hi = row["s_per_epoch_range"]
            load = "/".join(f"{v:.1f}" for v in row["loadavg_before"])
            cells.append(f"{row['s_per_epoch_median']:.3f} s ({lo:.3f}–{hi:.3f}), "
                         f"{row['peak_rss_per_rank_mib_median']:,.0f} MiB, "
                         f"{100 * row['test_acc_mean']:.2f}% (load {load})")
        lines.append(f"| {ranks} | " + " | ".join(cells) + " |")
    ratios = []
    for ranks, by_system in sorted(summary.items(), key=lambda kv: int(kv[0])):
        for name, r in by_system.get("ratios", {}).items():
            ratios.append(f"- {ranks} ranks, {name}: epoch {r['s_per_epoch']:.2f}x, peak RSS "
                          f"per rank {r['peak_rss_per_rank']:.2f}x, test accuracy "
                          f"{r['test_acc_pp']:+.2f} pp")
    return "\n".join(lines + [""] + ratios)


def bench(args, data, weights) -> int:
    started = time.time()
    budget = args.load_budget
    header = {
        "machine": machine_info(),
        "args": {k: v for k, v in vars(args).items() if k != "load_budget"},
        "workload": {"graph": f"reddit_shaped(num_nodes={args.num_nodes}, "
                              f"seed={args.data_seed})", "nodes": data.num_nodes,
                     "edges": int(data.num_edges), "features": data.num_features,
                     "classes": weights["classes"],
                     "train_nodes": int(data.train_mask.sum()),
                     "model": f"GraphSAGE mean, {args.layers} layers, hidden {args.hidden}, "
                              f"ReLU then dropout {args.dropout} between layers",
                     "optimizer": f"Adam lr {args.lr}", "epochs": args.epochs,
                     "loss": "cross-entropy summed over a rank's training nodes / all "
                             "ranks' training nodes; gradients summed over ranks",
                     "systems": {s: label(s) for s in args.systems}},
        "method": {
            "timing": f"per epoch the max over ranks of the step (forward, backward, "
                      f"gradient all-reduce, optimiser); per run the median of epochs "
                      f"{args.skip + 1}..{args.epochs}; per cell the median over runs",
            "memory": "peak_rss_per_rank: VmHWM of each epoch's step window (reset by "
                      "/proc/self/clear_refs at its start), max over epochs; "
                      "polled_peak_rss_per_rank: max VmHWM polled from /proc by the driver "
                      "over the rank process' life (set-up included); pyg_dist only: "
                      "training_rss_per_rank: per rank, max over epochs of the window's "
                      "peak minus the RSS once partition and model were loaded "
                      "(baseline_mem_per_rank of metrics.jsonl)",
            "threads": "OMP_NUM_THREADS=1 and MKL_NUM_THREADS=1 for every rank; torch "
                       "threads 1 on both sides",
            "launch": f"pyg_dist's ranks: {args.pyg_launch} (spawn: as pyg-dist train starts "
                      "them, forked from a process that imported torch and PyG; torchrun: a "
                      "fresh interpreter per rank); SAR's: a fresh interpreter per rank",
            "allocator": "as each system comes: pyg_dist's default (malloc reuse, with the "
                         "GLIBC_TUNABLES pyg-dist train gives its ranks), SAR with glibc's "
                         "defaults",
            "evaluation": "both final models by one single-process PyG GraphSAGE, exact "
                          "full-graph inference; neither evaluates while training",
            "order": "per rank count: repeat r runs every system in --systems order",
            "load": f"before each timed run: wait while loadavg > {args.max_load} (every "
                    f"60 s, at most {args.load_wait} s in all); loadavg recorded either way, "
                    f"and cpu_busy_before: the fraction of all cores busy in the 3 s "
                    f"before the run (/proc/stat)"},
    }
    runs: List[Dict[str, Any]] = []
    agree = None

    def save() -> None:
        _write_json(args.out, portable({
            **header, "agreement": agree, "parts": parts_info,
            "minutes": (time.time() - started) / 60, "summary": summarize(runs),
            "runs": [{k: v for k, v in r.items()} for r in runs]}))

    parts_info: Dict[str, Any] = {}
    if args.agreement_ranks:
        agree = agreement(args, data, weights, budget)
    index = 0
    for ranks in args.ranks:
        parts = prepare_parts(args, data, ranks)
        parts_info[str(ranks)] = {k: v for k, v in parts.items() if k != "root"}
        print(f"\n{ranks} rank(s): parts identical "
              f"{parts['assignment_check']['identical_parts']}", flush=True)
        for rep in range(args.repeats):
            for system in systems_for(args, ranks):
                print(f"[{index}] {system}, {ranks} rank(s), repeat {rep + 1}/{args.repeats}",
                      flush=True)
                runs.append(run_one(args, data, parts, weights, system, ranks, index,
                                    args.dropout, args.epochs, True, budget))
                runs[-1]["repeat"] = rep
                index += 1
                save()
    save()
    summary = summarize(runs)
    print("\n" + table(summary, args.systems))
    if agree:
        print(f"\nlosses with dropout off, {agree['ranks']} ranks, max relative "
              f"difference {agree['max_rel_diff']}: {agree['losses']}")
    print(f"\nwrote {args.out}")
    return 0 if all(r.get("ok") for r in runs) else 1


# --------------------------------------------------------------------------- #
# The profile
# --------------------------------------------------------------------------- #

# (kind, substrings of an event's or an ancestor's name, lower case). An event's
# kind: the first kind whose substrings match its own name or any ancestor's,
# kinds tried in this order (an optimiser's or an aggregation's inner
# multiplications are theirs, not GEMMs).
KINDS = [
    ("optimizer", ("optimizer.", "adam", "_foreach")),
    ("exchange", ("comm_", "all_to_all", "all_reduce", "allreduce", "gloo", "c10d",
                  "broadcast", "exchange")),
    ("aggregation", ("spmm", "sddmm", "dgl::", "sparse", "aggregat", "scatter",
                     "segment", "index_add", "csr", "sarop", "sar::")),
    ("dropout", ("dropout", "bernoulli")),
    ("activation", ("relu", "threshold")),
    ("loss", ("cross_entropy", "log_softmax", "nll_loss", "logsoftmax", "nllloss")),
    ("GEMM", ("aten::mm", "addmm", "matmul", "linear", "mkldnn", "onednn", "bmm")),
]
PHASES = [("optimizer", ("optimizer.",)), ("backward", ("autograd::engine", "backward"))]


def _first_match(names: List[str], table, default: str) -> str:
    r"""The first label of :obj:`table` (``[(label, keys)]``) one of whose
    keys is part of one of :obj:`names` (lower-cased); :obj:`default` if none."""
    low = [n.lower() for n in names]
    for label, keys in table:
        if any(k in n for n in low for k in keys):
            return label
    return default


def _kind(names: List[str]) -> str:
    return _first_match(names, KINDS, "other")


def _phase(names: List[str]) -> str:
    return _first_match(names, PHASES, "forward")


def classify(raw: Dict[str, Any]) -> Dict[str, Any]:
    r"""Per step: milliseconds of self CPU time by phase and kind, the top
    operators by self CPU time, and the step's wall time not inside any
    profiled operator ("untracked": Python and untraced kernels)."""
    steps = len(raw["walls"])
    by: Dict[str, Dict[str, float]] = {}
    ops: Dict[str, float] = {}
    tracked = 0.0
    for e in raw["events"]:
        chain = [e["name"]] + e["ancestors"]
        if "## step ##" not in chain or e["name"] == "## step ##":
            continue
        ms = e["self_us"] / 1000 / steps
        phase, kind = _phase(chain), _kind(chain)
        by.setdefault(phase, {}).setdefault(kind, 0.0)
        by[phase][kind] += ms
        ops[e["name"]] = ops.get(e["name"], 0.0) + ms
        tracked += ms
    wall = 1000 * statistics.fmean(raw["walls"])  # the self times are per-step means too
    kinds = {k for v in by.values() for k in v}
    totals = {k: sum(v.get(k, 0.0) for v in by.values()) for k in kinds}
    return {"step_ms": wall, "step_ms_median": 1000 * statistics.median(raw["walls"]),
            "steps": steps, "walls_s": raw["walls"],
            "by_phase_kind_ms": by, "by_kind_ms": totals,
            "by_phase_ms": {p: sum(v.values()) for p, v in by.items()},
            "untracked_ms": wall - tracked,
            "top_ops_ms": sorted(ops.items(), key=lambda kv: -kv[1])[:15]}


def profile(args, data, weights) -> int:
    r"""One process, the same graph, model and weights: SAR's default and
    pyg_dist's default step under ``torch.profiler``."""
    parts = prepare_parts(args, data, 1)
    warmup, steps = args.profile_warmup, args.profile_steps
    out: Dict[str, Any] = {"machine": machine_info(),
                           "workload": f"reddit_shaped(num_nodes={args.num_nodes}, seed="
                                       f"{args.data_seed}), 1 process, GraphSAGE "
                                       f"{args.layers} layers hidden {args.hidden}, dropout "
                                       f"{args.dropout}, Adam; OMP_NUM_THREADS=1",
                           "warmup_steps": warmup, "profiled_steps": steps,
                           "kinds": {k: list(v) for k, v in KINDS}, "loadavg": {}}
    base = osp.abspath(osp.join(args.workdir, "profile"))
    shutil.rmtree(base, ignore_errors=True)
    for system in ("sar", "pyg"):
        run_dir = osp.join(base, system)
        os.makedirs(run_dir)
        raw_path = osp.join(run_dir, "profile_raw.json")
        out["loadavg"][system] = {"before": wait_for_load(args, args.load_budget)}
        print(f"[profile] {system}: {warmup} warm-up steps, {steps} profiled", flush=True)
        if system == "sar":
            spec = {"world": 1, "mode": "sar", "part_config": parts["part_config"],
                    "layers": args.layers, "hidden": args.hidden, "dropout": args.dropout,
                    "lr": args.lr, "in_feats": data.num_features,
                    "classes": weights["classes"], "weights": weights["dgl"],
                    "seed": args.seed, "master_port": 29690, "warmup": warmup,
                    "steps": steps}
            spec_path = osp.join(run_dir, "spec.json")
            _write_json(spec_path, spec)
            env = {**_sar_env(), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            subprocess.run([args.sar_python, RANK_SCRIPT, "profile", "--spec", spec_path,
                            "--out", raw_path], check=True, env=env, cwd=REPO)
        else:
            out["pyg_system"] = label(args.profile_system)
            launch_pyg(args, parts, weights, args.profile_system, 1, run_dir, 0, args.dropout,
                       warmup + steps, profile={"warmup": warmup, "steps": steps,
                                                "out": raw_path})
        out["loadavg"][system]["after"] = _loadavg()
        out[system] = classify(_read_json(raw_path))
    _write_json(args.profile_out, portable(out))
    print("\n" + profile_table(out) + f"\n\nwrote {args.profile_out}")
    return 0


def profile_table(out: Dict[str, Any]) -> str:
    kinds = ["aggregation", "exchange", "GEMM", "dropout", "activation", "loss", "optimizer",
             "other"]
    lines = ["| ms per step (self CPU) | SAR fwd | SAR bwd | SAR total | pyg_dist fwd | "
             "pyg_dist bwd | pyg_dist total |", "|---|---:|---:|---:|---:|---:|---:|"]

    def cell(system: str, phase: Optional[str], kind: str) -> str:
        by = out[system]["by_phase_kind_ms"]
        if phase is None:
            return f"{out[system]['by_kind_ms'].get(kind, 0.0):.0f}"
        return f"{by.get(phase, {}).get(kind, 0.0):.0f}"
    for kind in kinds:
        lines.append(f"| {kind} | " + " | ".join(
            cell(s, p, kind) for s in ("sar", "pyg") for p in ("forward", "backward", None))
            + " |")
    lines.append("| untracked (Python, unprofiled kernels) | | | "
                 f"{out['sar']['untracked_ms']:.0f} | | | {out['pyg']['untracked_ms']:.0f} |")
    lines.append(f"| **step (wall)** | | | **{out['sar']['step_ms']:.0f}** | | | "
                 f"**{out['pyg']['step_ms']:.0f}** |")
    top = ["", "top operators by self CPU time (ms per step):"]
    for s in ("sar", "pyg"):
        top.append(f"- {'SAR' if s == 'sar' else 'pyg_dist'}: " + ", ".join(
            f"{name} {ms:.0f}" for name, ms in out[s]["top_ops_ms"][:8]))
    return "\n".join(lines + top)


# --------------------------------------------------------------------------- #

def _size(text: str) -> str:
    r"""A --memory-budget value, checked as pyg-dist train checks it (kept as given)."""
    from pyg_dist.cli import size_in_bytes
    size_in_bytes(text)
    return text


def _ints(text: str) -> List[int]:
    return [int(k) for k in text.split(",") if k]


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "pyg-rank":
        sub = argparse.ArgumentParser(prog="sar.py pyg-rank")
        sub.add_argument("--spec", required=True)
        return pyg_rank_main(sub.parse_args(argv[1:]).spec)
    parser = argparse.ArgumentParser(
        description="SAR and pyg_dist side by side, full-graph training on the same graph, "
                    "parts, model, weights and loss; and one step of each profiled")
    parser.add_argument("--quick", action="store_true",
                        help=f"a short check: {QUICK} (explicit flags still win)")
    parser.add_argument("--what", choices=("bench", "profile", "both"), default="both")
    parser.add_argument("--num-nodes", type=int)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--ranks", type=_ints, help="rank counts, e.g. 1,2,4,8")
    parser.add_argument("--systems", type=lambda t: t.split(","),
                        default=["sar", "pyg-seq", "sar-oneshot", "pyg", "pyg-pre", "pyg-seq-pre",
                                 "pyg-seq-pre-budget"],
                        help=f"the runs of a repeat, in order: {', '.join(SYSTEMS)}, or "
                             f"pyg-FLAG-FLAG... ({', '.join(PYG_FLAGS)})")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--skip", type=int, help="first epochs left out of the median")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0, help="initial weights and dropout")
    parser.add_argument("--agreement-ranks", type=int, default=2,
                        help="ranks of the dropout-off loss check (0: none)")
    parser.add_argument("--agreement-epochs", type=int, default=3)
    parser.add_argument("--profile-warmup", type=int)
    parser.add_argument("--profile-steps", type=int)
    parser.add_argument("--profile-system", default="pyg",
                        help="the pyg_dist system profiled (one rank), e.g. pyg-pre")
    parser.add_argument("--pyg-memory-budget", default="16M", type=_size,
                        help="pyg-dist train --memory-budget of the -budget systems")
    parser.add_argument("--pyg-launch", choices=("spawn", "torchrun"), default="spawn",
                        help="how pyg_dist's ranks start: spawn (pyg-dist train's own "
                             "start, the README's command: one rank in its process, more "
                             "forked from a process that imported torch and PyG) or "
                             "torchrun (one fresh interpreter per rank)")
    parser.add_argument("--max-load", type=float, default=1.5)
    parser.add_argument("--load-wait", type=float, default=1200,
                        help="seconds of waiting for the load, in all")
    parser.add_argument("--poll-interval", type=float, default=0.2)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--sar-env", default=os.environ.get("SAR_ENV",
                                                            osp.join(REPO, ".bench", "sar-env")))
    parser.add_argument("--workdir")
    parser.add_argument("--out")
    parser.add_argument("--profile-out")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    unknown = [s for s in args.systems if s not in SYSTEMS and not (
        s.startswith("pyg-") and set(pyg_flags(s)) <= set(PYG_FLAGS))]
    if unknown:
        parser.error(f"unknown system(s) {unknown}: {', '.join(SYSTEMS)}, or "
                     f"pyg-FLAG-... ({', '.join(PYG_FLAGS)})")
    args.sar_python = osp.join(osp.abspath(args.sar_env), "bin", "python")
    if not osp.exists(args.sar_python):
        parser.error(f"no SAR venv at '{args.sar_env}': run `make bench-sar-env` "
                     f"(or give --sar-env)")
    suffix = "_quick" if args.quick else ""
    args.workdir = osp.abspath(args.workdir or osp.join(REPO, "runs", "sar" + suffix))
    args.out = osp.abspath(args.out or osp.join(RESULTS_DIR, f"sar_reddit_shaped{suffix}.json"))
    args.profile_out = osp.abspath(args.profile_out or
                                   osp.join(RESULTS_DIR, f"sar_profile{suffix}.json"))
    os.makedirs(args.workdir, exist_ok=True)
    data = load_graph(args)
    args.num_features = data.num_features
    args.load_budget = {"left": float(args.load_wait)}  # shared by every timed run
    weights = prepare_weights(args, data)
    code = 0
    if args.what in ("profile", "both"):
        code |= profile(args, data, weights)
    if args.what in ("bench", "both"):
        code |= bench(args, data, weights)
    return code


if __name__ == "__main__":
    sys.exit(main())
