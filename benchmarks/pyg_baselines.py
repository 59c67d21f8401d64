r"""The PyG baselines of the benchmarks, each in the configuration a PyG user
would pick at its best: full-graph training, ``NeighborLoader``,
``ClusterLoader`` and PyG's multi-process recipe (``DistributedDataParallel``
with one ``NeighborLoader`` per process), with the model pyg_dist trains
(:func:`pyg_dist.train.build_model`, same seed and optimizer).

Best configuration: before its timed run, each baseline times a short probe
(one warm-up epoch, then ``--probe-epochs`` epochs; the median counts) of
every candidate configuration in one process, and then trains with the
fastest in a fresh process (its own peak memory):

* full-graph: every adjacency form (``csr``: a ``torch.sparse_csr`` ``adj_t``;
  ``sparse_tensor``: a ``torch_sparse.SparseTensor``, where torch-sparse is
  installed; ``edge_index``: gather/scatter, left out where its per-edge
  messages would take over half the memory) x torch threads {1, 2, cores};
* ``NeighborLoader`` / ``ClusterLoader``: every adjacency form per batch
  (``NeighborLoader``: ``transform=T.ToSparseTensor(...)``, run by the loader,
  in its workers when it has some; ``ClusterLoader``: converted in the
  training loop) x the same threads, with ``num_workers=0``; then, in the
  fastest form, ``num_workers`` in {1, 2} (``persistent_workers=True``) with
  the trainer on all cores or on the cores the workers leave (workers
  compete with the trainer for the cores);
* DDP (``--procs`` processes, gloo, each with the whole graph and a
  ``NeighborLoader`` over its share of the train nodes, as PyG's multi-GPU
  example): the same search with ``cores // procs`` (pyg_dist's threads per
  rank) in place of the cores, each probe's time the slowest rank's.

Every epoch is one pass over the train nodes (``--batch-size`` seeds per step,
all processes together; default: the train nodes in ``--num-batches`` steps)
followed by an untimed full-graph evaluation, so the per-epoch rows have the
keys of pyg-dist's ``metrics.jsonl`` (no halo exchange: those times and bytes
are 0) and feed the same tables and plots. ``time_sample`` is the time spent
waiting on the loader for its next batch. Peak memory is the resident set of
the training process(es); loader workers are not counted.

``NeighborLoader`` and ``ClusterLoader`` need torch-sparse or pyg-lib, which
have no wheels here: they run in a Python that has them (``--pyg-python``,
``make bench-env``); so does full-graph when that Python has torch-sparse
(for the ``SparseTensor`` form). :func:`run` launches a baseline there and
returns its rows; :func:`tuned` its probes and best configuration.

Usage::

    # every baseline, probed then trained; a table and benchmarks/results/pyg_baselines.json
    python benchmarks/pyg_baselines.py --dataset default --num-nodes 50000 --epochs 10
    python benchmarks/pyg_baselines.py --dataset reddit-shaped --layers 2 --hidden 256 \
        --fanout 25,10 --batch-size 1024 --procs 2
    python benchmarks/pyg_baselines.py --quick        # tiny, for tests

    # one baseline in one configuration, one JSON row per epoch on stdout (what run() calls)
    .bench/pyg-env/bin/python benchmarks/pyg_baselines.py --kind neighbor \
        --num-nodes 10000 --epochs 5 --num-batches 10 --adj csr --workers 1
"""
import argparse
import copy
import functools
import json
import math
import os
import os.path as osp
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch_geometric.data import Data

from pyg_dist.config import model_layer
from pyg_dist.metrics import (accuracies, correct_counts, peak_memory_bytes,
                              reset_peak_memory)
from pyg_dist.train import TrainConfig, build_model, node_loss, num_classes_of

KINDS = ("full", "neighbor", "cluster", "ddp")
NAMES = {"full": "PyG full-graph", "neighbor": "PyG NeighborLoader",
         "cluster": "PyG ClusterLoader", "ddp": "PyG DDP NeighborLoader"}
FORMS = ("csr", "sparse_tensor", "edge_index")  # adjacency forms the model takes
WORKERS = (1, 2)  # num_workers tried after 0
RESULTS = osp.join(osp.dirname(osp.abspath(__file__)), "results", "pyg_baselines.json")
# The Python of `make bench-env` (torch-sparse built from source): $PYG_ENV, else the
# ignored folder .bench/pyg-env inside the repository, so that a clone finds its own.
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PYG_ENV = os.environ.get("PYG_ENV") or osp.join(REPO, ".bench", "pyg-env")
PYG_PYTHON = osp.join(PYG_ENV, "bin", "python")
QUICK = {"num_nodes": 2000, "epochs": 3, "probe_epochs": 1}
CORES = os.cpu_count() or 1


# ---------------------------------------------------------------- the graph
def load_graph(dataset: str, num_nodes: Optional[int], workdir: str,
               data_root: Optional[str] = None) -> Data:
    r"""Graph :obj:`dataset` (a name of :data:`pyg_dist.datasets.DATASETS`)
    by :func:`pyg_dist.datasets.load` from :obj:`data_root`, a generated one
    with :obj:`num_nodes` nodes if given; ``default`` is cached in
    ``workdir/data`` unless :obj:`data_root` is given, as the other
    benchmarks do."""
    from pyg_dist.datasets import load
    sized = {"num_nodes": num_nodes} if num_nodes else {}
    if dataset == "default":
        from pyg_dist.datasets import load_default
        return load_default(data_root or osp.join(workdir, "data"), **sized)
    return load(dataset, data_root, **sized)


def forms_for(model: str) -> List[str]:
    r"""The adjacency forms :obj:`model` takes here (``SparseTensor`` only
    where torch-sparse is installed)."""
    import torch_geometric.typing as pyg_typing
    if not model_layer(model).takes_adj_t:
        return ["edge_index"]
    return [f for f in FORMS if f != "sparse_tensor" or pyg_typing.WITH_TORCH_SPARSE]


def to_sparse(form: str):
    r"""PyG's transform from ``edge_index`` to :obj:`form` (``None`` for
    ``edge_index``): ``T.ToSparseTensor``, transposed ``adj_t`` with the
    targets as rows."""
    if form == "edge_index":
        return None
    import torch_geometric.transforms as T
    import torch_geometric.typing as pyg_typing
    if form == "sparse_tensor" and not pyg_typing.WITH_TORCH_SPARSE:
        raise RuntimeError("adj sparse_tensor needs torch-sparse")
    return T.ToSparseTensor(layout=torch.sparse_csr if form == "csr" else None)


def with_adjacency(data: Data, form: str) -> Data:
    r""":obj:`data` with its adjacency in :obj:`form` (a shallow copy)."""
    transform = to_sparse(form)
    return data if transform is None else transform(copy.copy(data))


# ------------------------------------------------------------- the loaders
def batches(data: Data, kind: str, config: Dict[str, Any], seeds: torch.Tensor,
            batch_size: int, fanout: Sequence[int], num_batches: int,
            workdir: str) -> Iterable[Data]:
    r"""One epoch's training batches of :obj:`kind` in configuration
    :obj:`config` (``adj``, ``workers``): the whole graph (its adjacency
    converted once), ``NeighborLoader`` (fan-out :obj:`fanout`, seeds
    :obj:`seeds` in batches of :obj:`batch_size`; ``ddp``: this process'
    share) or ``ClusterLoader`` (ClusterGCN: ``4 * num_batches`` METIS
    clusters, 4 per batch)."""
    if kind == "full":
        graph = Data(x=data.x, y=data.y, edge_index=data.edge_index,
                     train_mask=data.train_mask, num_nodes=data.num_nodes)
        return [with_adjacency(graph, config["adj"])]
    from torch_geometric.loader import ClusterLoader, NeighborLoader
    workers = config.get("workers", 0)
    extra = {"num_workers": workers, "persistent_workers": workers > 0}
    if kind in ("neighbor", "ddp"):
        graph = Data(x=data.x, y=data.y, edge_index=data.edge_index, num_nodes=data.num_nodes)
        return NeighborLoader(graph, num_neighbors=list(fanout), input_nodes=seeds,
                              batch_size=batch_size, shuffle=True,
                              transform=to_sparse(config["adj"]), **extra)
    return ClusterLoader(clusters(data, num_batches, workdir), batch_size=4, shuffle=True,
                         **extra)


_CLUSTERS: Dict[Tuple, Any] = {}


def clusters(data: Data, num_batches: int, workdir: str):
    r"""``ClusterData`` of :obj:`data` (METIS once per process)."""
    key = (id(data), num_batches, workdir)
    if key not in _CLUSTERS:
        from torch_geometric.loader import ClusterData
        _CLUSTERS[key] = ClusterData(data, num_parts=4 * num_batches, log=False,
                                     save_dir=osp.join(workdir, "pyg_clusters"))
    return _CLUSTERS[key]


# --------------------------------------------------------------- training
def epoch(model, optimizer, loader: Iterable[Data], kind: str, form: str) -> Dict[str, Any]:
    r"""One pass over :obj:`loader`: time, time waiting on the loader, mean
    loss and steps. The loss is the mean over a batch's train nodes (its
    seeds for ``NeighborLoader``)."""
    model.train()
    waited, loss_sum, steps = 0.0, 0.0, 0
    start = wait_start = time.perf_counter()
    for batch in loader:
        if kind == "cluster":  # ClusterLoader takes no transform
            batch = with_adjacency(batch, form)
        waited += time.perf_counter() - wait_start
        optimizer.zero_grad(set_to_none=True)
        out = model(batch.x, batch.adj_t if "adj_t" in batch else batch.edge_index)
        if "batch_size" in batch:  # NeighborLoader: the seeds come first
            out, y = out[:batch.batch_size], batch.y[:batch.batch_size]
        else:
            out, y = out[batch.train_mask], batch.y[batch.train_mask]
        loss = node_loss(out, y) / max(out.size(0), 1)
        loss.backward()
        optimizer.step()
        loss_sum, steps = loss_sum + loss.item(), steps + 1
        wait_start = time.perf_counter()
    seconds = time.perf_counter() - start
    return {"time": seconds, "time_sample": waited, "loss": loss_sum / max(steps, 1),
            "steps": steps}


def evaluate(model, data: Data, adj) -> Dict[str, Optional[float]]:
    r"""``{train,val,test}_acc`` of :obj:`model` on the whole graph."""
    model.eval()
    with torch.no_grad():
        return accuracies(correct_counts(model(data.x, adj), data))


def eval_adjacency(data: Data, model: str):
    return (with_adjacency(Data(edge_index=data.edge_index, num_nodes=data.num_nodes),
                           "csr").adj_t if model_layer(model).takes_adj_t else data.edge_index)


class Setup:
    r"""What a process trains: graph, model config, loader shape, its seeds
    (``ddp``: its share) and the reduction over processes (identity in one)."""

    def __init__(self, args: argparse.Namespace, data: Data, rank: int = 0, world: int = 1):
        self.args, self.data, self.rank, self.world = args, data, rank, world
        self.config = TrainConfig(model=args.model, num_layers=args.layers, hidden=args.hidden,
                                  epochs=args.epochs, seed=args.seed, progress=False)
        train = data.train_mask.nonzero().view(-1)
        step = args.batch_size or math.ceil(train.numel() / args.num_batches)
        self.batch_size = math.ceil(step / world)  # seeds per step and process
        share = train.numel() // world  # equal shares: every rank takes as many steps
        self.seeds = train.tensor_split(world)[rank][:share] if world > 1 else train

    def fresh(self, config: Dict[str, Any]):
        r"""A fresh model, optimizer and loader of :obj:`config`."""
        torch.set_num_threads(config["threads"])
        model = build_model(self.config, self.data.num_features, num_classes_of(self.data.y))
        if self.world > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=self.config.lr,
                                     weight_decay=self.config.weight_decay)
        loader = batches(self.data, self.args.kind, config, self.seeds, self.batch_size,
                         self.args.fanout, self.args.num_batches, self.args.workdir)
        return model, optimizer, loader

    def slowest(self, seconds: List[float]) -> List[float]:
        if self.world == 1:
            return seconds
        import torch.distributed as dist
        t = torch.tensor(seconds, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def gathered(self, value: int) -> List[int]:
        if self.world == 1:
            return [value]
        import torch.distributed as dist
        out = [torch.zeros(1, dtype=torch.long) for _ in range(self.world)]
        dist.all_gather(out, torch.tensor([value]))
        return [int(v) for v in out]

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier()


def train(setup: Setup, config: Dict[str, Any],
          emit: Callable[[Dict[str, Any]], None]) -> None:
    r"""Trains ``--epochs`` epochs in :obj:`config`, calling :obj:`emit`
    with one metrics row per epoch (on rank 0)."""
    model, optimizer, loader = setup.fresh(config)
    eval_adj = eval_adjacency(setup.data, setup.args.model) if setup.rank == 0 else None
    for number in range(1, setup.args.epochs + 1):
        reset_peak_memory()
        one = epoch(model, optimizer, loader, setup.args.kind, config["adj"])
        seconds, waited = setup.slowest([one["time"], one["time_sample"]])
        per_rank = setup.gathered(peak_memory_bytes())
        if setup.rank == 0:
            accuracy = evaluate(getattr(model, "module", model), setup.data, eval_adj)
            emit({"epoch": number, "loss": one["loss"], "time": seconds,
                  "time_compute": seconds - waited, "time_comm": 0.0, "time_reduce": 0.0,
                  "time_sample": waited, "bytes_sent": 0, "bytes_saved": 0,
                  "cache_hit_rate": None, "halo_rows": 0, "halo_rows_total": 0,
                  "peak_mem_bytes": max(per_rank),
                  "peak_mem_bytes_mean": sum(per_rank) // len(per_rank),
                  "peak_mem_per_rank": per_rank, "steps": one["steps"], "config": config,
                  **accuracy})
        setup.barrier()
    del loader  # persistent workers end here


def probe(setup: Setup, config: Dict[str, Any]) -> Dict[str, Any]:
    r"""Times :obj:`config`: one warm-up epoch, then ``--probe-epochs``
    epochs; ``s_per_epoch`` is their median (slowest process)."""
    model, optimizer, loader = setup.fresh(config)
    times = [epoch(model, optimizer, loader, setup.args.kind, config["adj"])["time"]
             for _ in range(1 + setup.args.probe_epochs)]
    del loader
    times = setup.slowest(times)
    return {"config": config, "s_per_epoch": statistics.median(times[1:]),
            "epoch_times": times}


def search(setup: Setup, emit: Callable[[Dict[str, Any]], None]) -> List[Dict[str, Any]]:
    r"""Probes the candidate configurations of ``--kind`` (module docstring)
    and returns the probes, emitting each; the fastest is
    ``min(probes, key=s_per_epoch)``."""
    kind, cores = setup.args.kind, max(1, CORES // setup.world)
    forms = [f for f in forms_for(setup.args.model) if f in setup.args.forms]
    probes: List[Dict[str, Any]] = []

    def measure(config: Dict[str, Any]) -> None:
        probes.append(probe(setup, config))
        emit(probes[-1])

    grid = sorted({min(t, cores) for t in setup.args.threads_grid or (1, 2, cores)})
    data = setup.data
    # full-graph edge_index: one message per edge and feature, its gradient and the
    # scatter's output; not probed where that needs over half the memory
    messages = 3 * 4 * data.num_edges * data.num_features
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if kind == "full" and "edge_index" in forms and messages > memory / 2:
        forms.remove("edge_index")
        emit({"config": {"adj": "edge_index"}, "skipped": f"its messages need ~"
              f"{messages / 2**30:.1f} GiB, over half the {memory / 2**30:.0f} GiB here"})
    for form in forms:
        for threads in grid:
            measure({"adj": form, "threads": threads, "workers": 0})
    if kind == "full":
        return probes
    form = best(probes)["adj"]
    for workers in setup.args.workers_grid:
        for threads in sorted({grid[-1], max(1, grid[-1] - workers)}, reverse=True):
            measure({"adj": form, "threads": threads, "workers": workers})
    return probes


def best(probes: List[Dict[str, Any]]) -> Dict[str, Any]:
    return min(probes, key=lambda p: p["s_per_epoch"])["config"]


def work(args: argparse.Namespace, rank: int = 0, world: int = 1) -> None:
    r"""One process of a baseline: probes (``--probe``) or training, rows
    as JSON lines on stdout (rank 0)."""
    def emit(row: Dict[str, Any]) -> None:
        if rank == 0:
            print(json.dumps(row), flush=True)

    data = load_graph(args.dataset, args.num_nodes, args.workdir, args.data_root)
    setup = Setup(args, data, rank, world)
    if args.probe:
        search(setup, emit)
    else:
        train(setup, {"adj": args.adj or ("csr" if args.kind == "full" else "edge_index"),
                      "threads": args.threads or max(1, CORES // world),
                      "workers": args.workers}, emit)


def _ddp_rank(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.procs)
    try:
        work(args, rank, args.procs)
    finally:
        dist.destroy_process_group()


def ddp(args: argparse.Namespace) -> None:
    r"""``--procs`` DDP processes (gloo on loopback), each running
    :func:`work` on its share of the train nodes: rank 0 is this process,
    the others spawned; a rank that fails ends them all."""
    import multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    others = [mp.get_context("spawn").Process(target=_ddp_rank, args=(rank, args, port))
              for rank in range(1, args.procs)]
    for proc in others:
        proc.start()

    def watch() -> None:  # the only joiner; rank 0 would wait on a dead rank forever
        for rank, proc in enumerate(others, 1):
            proc.join()
            if proc.exitcode != 0:
                print(f"DDP rank {rank} exited with {proc.exitcode}", file=sys.stderr,
                      flush=True)
                os._exit(1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        _ddp_rank(0, args, port)
    except BaseException:
        for proc in others:
            proc.terminate()
        raise
    watcher.join()


# ------------------------------------------- launching (run_all, the driver)
def python_for(kind: str, pyg_python: str) -> str:
    r"""The Python of baseline :obj:`kind`: :obj:`pyg_python` when it has a
    loader backend, else (full-graph only, which needs none) this one."""
    if kind == "full" and has_loader_backend(pyg_python) is not None:
        return sys.executable
    return pyg_python


def worker_cmd(python: str, kind: str, args: argparse.Namespace, seed: int) -> List[str]:
    r"""The command of baseline :obj:`kind` with the graph, model, loader
    and epochs of :obj:`args` (attributes other benchmarks lack default)."""
    get = functools.partial(getattr, args)
    fanout = list(args.fanout)
    cmd = [python, osp.abspath(__file__), "--kind", kind, "--epochs", str(args.epochs),
           "--hidden", str(args.hidden), "--seed", str(seed), "--workdir", args.workdir,
           "--num-batches", str(args.num_batches), "--fanout", ",".join(map(str, fanout)),
           "--dataset", get("dataset", None) or "default", "--model", get("model", None) or "sage",
           "--layers", str(get("layers", None) or len(fanout)),
           "--probe-epochs", str(get("probe_epochs", None) or 2)]
    if kind == "ddp":  # as many processes as pyg_dist's parts
        procs = get("procs", None) or get("parts", None) or 2
        cmd += ["--procs", str(max(procs) if isinstance(procs, (list, tuple)) else procs)]
    if get("forms", None):
        cmd += ["--forms", *args.forms]
    if get("workers_grid", None) is not None:
        cmd += ["--workers-grid", *map(str, args.workers_grid)]
    if get("threads_grid", None):
        cmd += ["--threads-grid", *map(str, args.threads_grid)]
    for flag, value in (("--num-nodes", args.num_nodes), ("--batch-size", get("batch_size", None)),
                        ("--data-root", get("data_root", None))):
        if value:
            cmd += [flag, str(value)]
    return cmd


def _launch(cmd: List[str], timeout: Optional[float]) -> List[Dict[str, Any]]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else f"exit code {proc.returncode}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


_TUNED: Dict[Tuple, Tuple[Dict[str, Any], List[Dict[str, Any]]]] = {}
_SKIPPED: Dict[Tuple, Dict[str, str]] = {}


def tuned(python: str, kind: str, args: argparse.Namespace,
          ) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    r"""The fastest configuration of baseline :obj:`kind` and every probe
    (module docstring), probed once per Python, baseline and graph/model
    (cached). Raises ``RuntimeError`` as :func:`run`."""
    missing = None if kind == "full" else has_loader_backend(python)
    if missing:
        raise RuntimeError(missing)
    cmd = worker_cmd(python, kind, args, 0) + ["--probe"]
    key = tuple(cmd)
    if key not in _TUNED:
        lines = _launch(cmd, getattr(args, "timeout", None))
        probes = [p for p in lines if "s_per_epoch" in p]
        if not probes:
            raise RuntimeError(f"{kind}: no configuration to probe")
        _SKIPPED[key] = {p["config"]["adj"]: p["skipped"] for p in lines if "skipped" in p}
        _TUNED[key] = best(probes), probes
    return _TUNED[key]


def skipped(python: str, kind: str, args: argparse.Namespace) -> Dict[str, str]:
    r"""The adjacency forms :func:`tuned` left out as too large, and why."""
    return _SKIPPED.get(tuple(worker_cmd(python, kind, args, 0) + ["--probe"]), {})


def run(python: str, kind: str, args: argparse.Namespace, seed: int,
        config: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    r"""Runs baseline :obj:`kind` in :obj:`python` (a fresh process: its
    own peak memory and all the machine's cores) with the graph, model and
    epochs of :obj:`args`, in :obj:`config` (default: the fastest,
    :func:`tuned`, unless ``args.pyg_tune`` is false: then ``args.adj``,
    ``threads``, ``workers`` where given); returns its rows.
    Raises ``RuntimeError`` with the reason when :obj:`python` lacks the
    loaders' backend, or with the last line of its error output when it
    fails."""
    missing = None if kind == "full" else has_loader_backend(python)
    if missing:
        raise RuntimeError(missing)
    if config is None and getattr(args, "pyg_tune", True):
        config = tuned(python, kind, args)[0]
    elif config is None:  # the driver's --no-tune: its --adj, --threads, --workers
        config = {key: getattr(args, key) for key in ("adj", "threads", "workers")
                  if getattr(args, key, None) is not None}
    cmd = worker_cmd(python, kind, args, seed)
    for key, value in (config or {}).items():
        cmd += [f"--{key}", str(value)]
    return _launch(cmd, getattr(args, "timeout", None))


@functools.lru_cache(maxsize=None)
def has_loader_backend(python: str) -> Optional[str]:
    r"""``None`` when :obj:`python` has a backend of ``NeighborLoader`` and
    ``ClusterLoader`` (torch-sparse or pyg-lib), else why not (probed once
    per Python)."""
    if not osp.exists(python):
        return f"{python} not found (make bench-env)"
    if osp.abspath(python) == osp.abspath(sys.executable):  # not realpath: venvs link one binary
        # this interpreter: asked here, not in a new one (which imports PyG anew, ~5 s)
        import torch_geometric.typing as t
        return None if t.WITH_TORCH_SPARSE or t.WITH_PYG_LIB else "no torch-sparse or pyg-lib"
    probe = ("import torch_geometric.typing as t; "
             "assert t.WITH_TORCH_SPARSE or t.WITH_PYG_LIB, 'no torch-sparse or pyg-lib'")
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    return None if proc.returncode == 0 else (lines[-1] if lines else "probe failed")


def describe(config: Optional[Dict[str, Any]], kind: str, procs: int) -> str:
    if not config:
        return "-"
    text = f"adj={config['adj']}, threads={config['threads']}"
    if kind != "full":
        text += f", workers={config.get('workers', 0)}"
    return text + (f", procs={procs}" if kind == "ddp" else "")


def tables(results: List[Dict[str, Any]]) -> str:
    r"""The markdown tables: per baseline its best configuration and timed
    run, then every probe."""
    mib = 2**20
    lines = ["| baseline | best configuration | s/epoch | epochs/s | test acc "
             "| peak MiB (max) | peak MiB per process |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['baseline']} | not run: {r['error']} | | | | | |")
            continue
        s = r["summary"]
        per = ", ".join(f"{v / mib:.0f}" for v in s["peak_mem_per_rank"] or [])
        lines.append(f"| {r['baseline']} | {describe(r['config'], r['kind'], r['procs'])} "
                     f"| {s['epoch_time']:.3f} | {s['epochs_per_s']:.2f} "
                     f"| {100 * s['test_acc']:.2f} | {s['peak_mem_max'] / mib:.0f} | {per} |")
    lines += ["", "probes (one warm-up epoch, then the median of the probe epochs):", "",
              "| baseline | configuration | s/epoch | x best |", "|---|---|---|---|"]
    for r in results:
        fastest = min((p["s_per_epoch"] for p in r.get("probes", [])), default=None)
        for p in r.get("probes", []):
            mark = " (best)" if p["config"] == r.get("config") else ""
            lines.append(f"| {r['baseline']} | {describe(p['config'], r['kind'], r['procs'])}"
                         f"{mark} | {p['s_per_epoch']:.3f} | {p['s_per_epoch'] / fastest:.2f} |")
    return "\n".join(lines)


def drive(args: argparse.Namespace) -> None:
    r"""Every baseline of ``--baselines``: probes, the timed run in the
    fastest configuration, the tables and the JSON (``--out``)."""
    from common import machine, save, summarize
    started = time.time()
    data = load_graph(args.dataset, args.num_nodes, args.workdir, args.data_root)
    num_train = int(data.train_mask.sum())
    graph = {"dataset": args.dataset, "num_nodes": data.num_nodes,
             "num_edges": data.num_edges, "num_features": data.num_features,
             "num_classes": num_classes_of(data.y), "num_train": num_train}
    print(f"graph {args.dataset}: {data.num_nodes:,} nodes, {data.num_edges:,} edges, "
          f"{data.num_features} features, {graph['num_classes']} classes, {num_train:,} train; "
          f"{args.model} x{args.layers} hidden {args.hidden}, fan-outs {args.fanout}, "
          f"{args.batch_size or math.ceil(num_train / args.num_batches)} seeds per step; "
          f"{CORES} cores", flush=True)
    del data
    results: List[Dict[str, Any]] = []
    for kind in args.baselines:
        python = python_for(kind, args.pyg_python)
        result: Dict[str, Any] = {"baseline": NAMES[kind], "kind": kind, "python": python,
                                  "procs": args.procs if kind == "ddp" else 1}
        try:
            if args.pyg_tune:
                result["config"], result["probes"] = tuned(python, kind, args)
                tried = {p["config"]["adj"] for p in result["probes"]}
                why = ("model takes edge_index only" if not model_layer(args.model).takes_adj_t
                       else f"no torch-sparse in {python}")
                result["not_probed"] = {f: why for f in args.forms if f not in tried}
                result["not_probed"].update(skipped(python, kind, args))
                for form, why in result["not_probed"].items():
                    print(f"  {NAMES[kind]}: adj={form} not probed: {why}", flush=True)
                for p in result["probes"]:
                    print(f"  {NAMES[kind]} probe {describe(p['config'], kind, args.procs)}: "
                          f"{p['s_per_epoch']:.3f} s/epoch", flush=True)
            rows = run(python, kind, args, args.seed)
            result.setdefault("config", rows[0].get("config"))
            result["summary"] = summarize(rows)
            print(f"  {NAMES[kind]} [{describe(result['config'], kind, args.procs)}]: "
                  f"{result['summary']['epoch_time']:.3f} s/epoch, "
                  f"acc {result['summary']['test_acc']:.4f}", flush=True)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            result["error"] = str(e)
            print(f"  {NAMES[kind]}: not run: {e}", flush=True)
        results.append(result)
        save(args, results, started, [], graph=graph, cores=CORES)
    text = tables(results)
    print("\n" + text)
    save(args, results, started, [], graph=graph, cores=CORES, table=text)
    print(f"wrote {args.out} ({machine()['date']})")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from pyg_dist.config import MODELS
    from pyg_dist.datasets import DATASETS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("Usage::")[1])
    parser.add_argument("--kind", choices=KINDS,
                        help="run one baseline in one configuration (a worker); "
                             "without it: every --baselines, probed")
    parser.add_argument("--baselines", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--quick", action="store_true",
                        help="tiny: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument("--dataset", default="default",
                        help=f"graph: one of {', '.join(DATASETS)} (pyg_dist.datasets.load)")
    parser.add_argument("--num-nodes", type=int, default=None,
                        help="nodes of a generated --dataset (default, reddit-shaped; "
                             "default: its own size)")
    parser.add_argument("--data-root", default=None,
                        help="datasets folder (default $PYG_DIST_DATA; default graph: "
                             "WORKDIR/data)")
    parser.add_argument("--model", choices=list(MODELS), default="sage")
    parser.add_argument("--layers", type=int, default=None, help="default: one per fan-out")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--fanout", type=lambda s: [int(k) for k in s.split(",")],
                        default=None, help="per layer, e.g. 10,5,5 (default 10 each)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="seeds per step, all processes together (default: the "
                             "train nodes in --num-batches steps)")
    parser.add_argument("--num-batches", type=int, default=10,
                        help="steps per epoch (and ClusterLoader: 4x as many clusters)")
    parser.add_argument("--epochs", type=int, default=None, help="timed run (default 10)")
    parser.add_argument("--probe-epochs", type=int, default=None,
                        help="timed epochs per probe after one warm-up (default 2)")
    parser.add_argument("--procs", type=int, default=2,
                        help="DDP processes (as many as pyg_dist's parts)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-tune", dest="pyg_tune", action="store_false",
                        help="skip the probes: train in --adj/--threads/--workers")
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS),
                        help="adjacency forms the probes try")
    parser.add_argument("--workers-grid", type=int, nargs="*", default=list(WORKERS),
                        help="num_workers the loader probes try after 0")
    parser.add_argument("--threads-grid", type=int, nargs="+", default=None,
                        help="torch threads per process the probes try (default 1, 2 "
                             "and cores // procs, at most cores // procs)")
    parser.add_argument("--adj", choices=FORMS, default=None,
                        help="worker: adjacency form (default: csr full-graph, "
                             "else edge_index)")
    parser.add_argument("--threads", type=int, default=None,
                        help="worker: torch threads per process (default cores // procs)")
    parser.add_argument("--workers", type=int, default=0, help="worker: loader num_workers")
    parser.add_argument("--probe", action="store_true",
                        help="worker: probe every configuration instead of training")
    parser.add_argument("--pyg-python", default=None,
                        help="Python with torch-sparse or pyg-lib for the loaders (default: "
                             "this one if it has them, else $PYG_ENV/bin/python, default "
                             ".bench/pyg-env/bin/python)")
    parser.add_argument("--workdir", default="runs/bench_suite")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--out", default=None,
                        help="JSON (default benchmarks/results/pyg_baselines[_quick].json)")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else {}).items():
        if getattr(args, key) is None and (key != "num_nodes" or args.dataset == "default"):
            setattr(args, key, value)
    args.epochs = args.epochs or 10
    args.probe_epochs = args.probe_epochs or 2
    if args.fanout is None:
        args.fanout = [10] * (args.layers or 3)
    args.layers = args.layers or len(args.fanout)
    if len(args.fanout) != args.layers:
        parser.error(f"--fanout needs one fan-out per layer ({args.layers}), got {args.fanout}")
    if args.pyg_python is None:
        args.pyg_python = (sys.executable if has_loader_backend(sys.executable) is None
                           else PYG_PYTHON)
    args.out = args.out or (RESULTS.replace(".json", "_quick.json") if args.quick else RESULTS)
    return args


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    if args.kind is None:
        sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
        return drive(args)
    if args.kind == "ddp":
        return ddp(args)
    torch.set_num_threads(CORES)
    work(args)


if __name__ == "__main__":
    main()
