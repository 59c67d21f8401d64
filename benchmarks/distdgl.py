r"""DistDGL 2.1 and pyg_dist side by side on the same graph, partitions, model,
fan-outs, batch size and initial weights.

The workload (the defaults): the ``reddit_shaped`` graph of pyg_dist
(30,000 nodes, 3M directed edges, 602 features, 41 classes), 2 METIS parts
(``--parts 4`` for four), one trainer per part, every part an emulated machine;
a 3-layer GraphSAGE (mean aggregation, hidden 128, dropout 0.5), fan-outs
15,10,5, 1,024 seeds per trainer and step, Adam (lr 0.01), 5 epochs, and runs
alternated DGL, DGL with a sampler process, pyg_dist, ... (``--repeats`` of
each). Sampling: DGL as its README launches it (``--num_samplers 0``: in the
trainer) and with one sampler process per trainer (``dgl-s1``), the faster of
the two being the comparison; pyg_dist with ``pyg-dist train``'s default (one
background sampling thread; ``pyg-w0``: in the training loop).

How the two systems are given the same work:

* **Graph and partitions.** pyg_dist partitions the graph (``pyg-dist partition
  --dataset reddit-shaped --method metis``, the user's path); its node
  assignment (``book.pt``) is handed to ``dgl.distributed.partition_graph``,
  whose METIS call (``dgl.distributed.partition.metis_partition_assignment``)
  is replaced, in the DGL process only, by that assignment. The parts are then
  checked to hold exactly the same nodes (written to the results).
* **Machines.** Every part is a "machine": a network namespace (its own IP,
  joined to the others by veth pairs on a bridge in one more namespace) and a
  mount namespace with a private ``/dev/shm`` (DGL's servers keep the graph in
  shared memory under fixed names). DGL runs one server and one trainer per
  machine (DGL's ``tools/launch.py`` environment, set by hand, trainers under
  ``torch.distributed.run``); pyg_dist runs one rank per machine under
  ``torch.distributed.run`` (its multi-node form). Both systems' collectives
  and RPCs cross the same veth links.
* **Threads.** ``OMP_NUM_THREADS`` = ``--threads`` (default: cores / parts) for
  every trainer of both systems, and ``torch.set_num_threads`` the same; DGL's
  servers get ``--server-threads`` (1, ``launch.py``'s default). Each trainer
  reports the threads it ran with.
* **Model and initial weights.** One PyG ``GraphSAGE`` is built (pyg_dist's
  ``build_model``, seeded); its weights go to pyg_dist as they are and to DGL's
  ``SAGEConv`` as ``fc_neigh.weight = lin_l.weight``, ``fc_self.weight =
  lin_r.weight``, ``fc_self.bias = lin_l.bias``: DGL computes ``fc_self(h_i) +
  fc_neigh(mean_j h_j)`` (its bias lives in ``fc_self`` for mean aggregation),
  PyG ``lin_l(mean_j x_j) + lin_r(x_i)`` (bias in ``lin_l``). Before the runs,
  both models are evaluated on the same small graph and must agree (``equivalence``
  in the results). ``pyg-dist train`` cannot take initial weights, so pyg_dist
  trains through its Python API (``pyg_dist.launch.run_ranks`` over
  ``pyg_dist.train.train``, exactly what ``run_training`` runs, after the same
  ``check_training``), with ``build_model`` wrapped to load the weights.
* **Fan-outs.** pyg_dist's ``--fanout 15,10,5`` samples 15 neighbours of every
  seed, 10 at hop 2 and 5 at hop 3 (PyG's order); DGL's
  ``NeighborSampler(fanouts)`` lists the input layer first, so DGL gets
  ``[5, 10, 15]`` (``--dgl-fanout-order literal`` passes the list unreversed).
  Both compute layer l only for the nodes layer l+1 reads (DGL's blocks;
  pyg_dist's per-layer trimming, :mod:`pyg_dist.nn.trim`) and project before
  aggregating where the output is narrower (DGL's ``SAGEConv``; pyg_dist's
  ``DistSAGEConv``). DGL's blocks resample every layer's destination nodes,
  pyg_dist samples a node once per batch (as PyG's ``NeighborLoader`` does).
* **Steps.** Both split the training nodes evenly over the trainers
  (DistDGL's ``node_split(force_even=True)``, pyg_dist's two-level split), take
  1,024 seeds per trainer per step, keep the last partial batch and average
  the gradients over the trainers every step (DDP / one all-reduce).
* **Evaluation.** Neither system evaluates while training. Each run's final
  weights (DGL's mapped back) are evaluated by one single-process PyG model on
  the whole graph with full neighbourhoods (exact inference), so both
  accuracies come from the same code.

What stays different: DGL runs on its venv's torch 2.2.1 (PyPI's CUDA build, on
the CPU), pyg_dist on the project's torch; that build's libraries add ~250 MiB
of file-backed pages to a DGL process' RSS (the anonymous part is reported
apart); each DGL machine also runs its server on the same cores.

Measured per run: s/epoch (max over trainers, the median of epochs 2..N),
seeds/s (all trainers' seeds of an epoch over that time), train/val/test
accuracy, peak RSS per trainer (the training window of each epoch: the
resident high-water mark reset by ``/proc/self/clear_refs`` at the start of
every epoch, as pyg_dist's metrics do), each process' lifetime peak RSS
(polled every 0.5 s, with its anonymous, file and shared-memory parts)
including DGL's servers, ``/dev/shm`` use per machine, the bytes the machines
sent over their links, and the load average before and after the run.

Usage (as root: namespaces; ``make bench-dgl-env`` first)::

    .venv/bin/python benchmarks/distdgl.py                 # the full measurement
    .venv/bin/python benchmarks/distdgl.py --parts 4       # 4 parts/machines
    .venv/bin/python benchmarks/distdgl.py --quick         # small graph, 2 epochs, 1 run each

Results: ``benchmarks/results/distdgl_2parts.json`` (``distdgl_4parts.json`` for
``--parts 4``, ``distdgl_2parts_quick.json`` for ``--quick``; ``--out``). This one
file is run by both venvs: the project's (driver, pyg_dist ranks, machine
agents: standard library only) and DGL's (``dgl-*`` subcommands), so only the
standard library is imported at module level.
"""
import argparse
import datetime
import json
import os
import os.path as osp
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(HERE)
SCRIPT = osp.abspath(__file__)
RESULTS_DIR = osp.join(HERE, "results")
# `make bench-dgl-env`'s venv: an ignored folder of the repository, so that every clone
# builds and finds its own.
DGL_ENV = osp.join(REPO, ".bench", "dgl-env")
GRAPH_NAME = "reddit_shaped"
NS_PREFIX = "dgb"           # namespaces dgb-sw (the bridge) and dgb-m0, dgb-m1, ...
SUBNET = "10.77.0"          # machine m is SUBNET.(m + 1)
IFNAME = "eth0"             # each machine's end of its veth pair
MiB = 2 ** 20

QUICK = {"num_nodes": 4000, "epochs": 2, "repeats": 1}
FULL = {"num_nodes": 30000, "epochs": 5, "repeats": 3}


# --------------------------------------------------------------------------- #
# Small helpers (standard library only)
# --------------------------------------------------------------------------- #

def _read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def _write_json(path: str, value: Any) -> None:
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
    os.replace(tmp, path)


def _proc_status(pid: Any = "self") -> Dict[str, int]:
    r"""The memory fields of ``/proc/PID/status`` in bytes (empty if gone)."""
    out: Dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def reset_peak_rss() -> None:
    r"""Starts a new resident-set high-water-mark window, as pyg_dist's
    ``metrics.reset_peak_memory`` does on Linux."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _children(pid: int) -> List[int]:
    out: List[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except (OSError, ValueError):
        pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        return ""


def _loadavg() -> List[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------- #
# The machine agent: one per emulated machine, inside its namespaces
# --------------------------------------------------------------------------- #

def variant(system: str) -> Tuple[str, Optional[int]]:
    r"""A run's system and its sampler workers: ``dgl`` (DGL's README:
    ``launch.py --num_samplers 0``), ``dgl-s1`` (one sampler process per
    trainer), ``pyg`` (``pyg-dist train``'s default), ``pyg-w0`` (sampling in
    the training loop); ``None``: the system's default."""
    base, _, workers = system.partition("-")
    if base not in ("dgl", "pyg") or (workers and not (
            workers[:1] == ("s" if base == "dgl" else "w") and workers[1:].isdigit())):
        raise ValueError(f"unknown system '{system}': dgl, dgl-sN, pyg or pyg-wN")
    return base, int(workers[1:]) if workers else (0 if base == "dgl" else None)


SYSTEM_NAMES = {"dgl": "DistDGL 2.1.0", "pyg": "pyg_dist"}


def system_name(system: str) -> str:
    base, workers = variant(system)
    if system == base:
        return SYSTEM_NAMES[base]
    return f"{SYSTEM_NAMES[base].split()[0]}, {workers} {'sampl.' if base == 'dgl' else 'work.'}"


def machine_main(spec_path: str, m: int) -> int:
    r"""Runs machine :obj:`m` of a run: mounts a private ``/dev/shm`` (this
    process is in its own mount namespace), starts the machine's processes
    (DGL: server then trainer launcher; pyg_dist: the rank launcher), polls
    every descendant's memory until the launcher exits, then waits for the
    servers (DGL's trainer 0 shuts them down) and writes
    ``RUN/machine_{m}.json``. Standard library only."""
    spec = _read_json(spec_path)
    mach = spec["machines"][m]
    run_dir = spec["run_dir"]
    os.makedirs(osp.join(run_dir, "logs"), exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/dev/shm"],
                   check=True)
    if mach.get("cores"):
        os.sched_setaffinity(0, mach["cores"])
    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = signum
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    procs: Dict[str, subprocess.Popen] = {}
    for p in mach["procs"]:
        env = dict(os.environ)
        env.update({k: str(v) for k, v in p["env"].items()})
        log = open(osp.join(run_dir, "logs", f"machine{m}_{p['role']}.log"), "w")
        procs[p["role"]] = subprocess.Popen(p["cmd"], env=env, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=REPO)
    launcher = procs["launcher"]
    roles = {proc.pid: role for role, proc in procs.items()}
    peaks: Dict[int, Dict[str, Any]] = {}
    shm_peak = 0
    interval = spec.get("poll_interval", 0.5)

    def poll() -> None:
        nonlocal shm_peak
        stack = list(roles)
        while stack:
            pid = stack.pop()
            for child in _children(pid):
                if child not in roles:
                    parent = roles[pid]
                    # The launcher's children are the trainers; anything else
                    # started below a trainer or a server (DGL runs lscpu) is a child.
                    roles[child] = ("trainer" if parent == "launcher" else
                                    parent if parent.endswith("-child") else parent + "-child")
                stack.append(child)
            status = _proc_status(pid)
            if not status:
                continue
            row = peaks.setdefault(pid, {"pid": pid, "role": roles[pid],
                                         "cmd": _cmdline(pid)})
            for key, value in status.items():
                row[key] = max(row.get(key, 0), value)
        st = os.statvfs("/dev/shm")
        shm_peak = max(shm_peak, (st.f_blocks - st.f_bfree) * st.f_frsize)

    started, timed_out = time.time(), False
    deadline = started + spec["timeout"]
    while launcher.poll() is None:
        poll()
        if stop["signal"] is not None or time.time() > deadline:
            timed_out = stop["signal"] is None
            break
        time.sleep(interval)
    # The servers end when trainer 0 sends the shutdown (after the last
    # client's barrier): give them a while, then end whatever is left.
    grace = time.time() + (5 if timed_out or stop["signal"] else 60)
    while any(p.poll() is None for p in procs.values()) and time.time() < grace:
        poll()
        time.sleep(interval)
    leftover = [pid for pid in roles if _proc_status(pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in leftover:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if leftover and sig == signal.SIGTERM:
            time.sleep(3)
    for proc in procs.values():
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    result = {"machine": m, "timed_out": timed_out, "signal": stop["signal"],
              "returncodes": {role: proc.returncode for role, proc in procs.items()},
              "killed_leftovers": len(leftover), "wall_s": time.time() - started,
              "shm_peak_bytes": shm_peak, "processes": list(peaks.values())}
    _write_json(osp.join(run_dir, f"machine_{m}.json"), result)
    return 0 if launcher.returncode == 0 and not timed_out else 1


# --------------------------------------------------------------------------- #
# The pyg_dist trainer (project venv, under torch.distributed.run)
# --------------------------------------------------------------------------- #

def _pyg_train_with_weights(root: str, config, out: str, weights: str,
                            run_dir: str) -> Dict[str, Any]:
    r"""``pyg_dist.train.train`` with the model's initial weights loaded from
    :obj:`weights` (a PyG ``state_dict``): ``train`` builds its model with
    ``build_model`` (then broadcasts rank 0's parameters), so that one call
    is wrapped for the run."""
    import torch
    import torch.distributed as dist
    import pyg_dist.train as pyg_train

    state = torch.load(weights, weights_only=True)
    original = pyg_train.build_model

    def build_with_weights(cfg, in_channels, out_channels):
        model = original(cfg, in_channels, out_channels)
        model.load_state_dict(state)  # strict: every key and shape
        return model

    pyg_train.build_model = build_with_weights
    try:
        summary = pyg_train.train(root, config, out)
    finally:
        pyg_train.build_model = original
    rank = dist.get_rank()
    _write_json(osp.join(run_dir, f"pyg_rank{rank}.json"),
                {"rank": rank, "world": dist.get_world_size(),
                 "torch_threads": torch.get_num_threads(),
                 "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                 "torch": torch.__version__})
    return summary


def pyg_trainer_main(spec_path: str) -> int:
    from pyg_dist.config import TrainConfig
    from pyg_dist.launch import run_ranks
    from pyg_dist.preflight import check_training
    spec = _read_json(spec_path)
    pyg = spec["pyg"]
    config = TrainConfig(**pyg["config"])
    config.validate()
    # What pyg_dist.launch.run_training does, with the wrapped train function.
    check_training(pyg["root"], config, pyg["out"], None)
    run_ranks(_pyg_train_with_weights,
              (pyg["root"], config, pyg["out"], spec["weights"]["pyg"], spec["run_dir"]),
              pyg["root"], None, pyg["timeout"])
    return 0


# --------------------------------------------------------------------------- #
# The DGL side (DGL venv): partitioning, the equivalence check, servers/trainers
# --------------------------------------------------------------------------- #

def _dgl_sage(in_feats: int, hidden: int, classes: int, layers: int, dropout: float):
    r"""GraphSAGE as DGL's distributed example builds it: ``SAGEConv(mean)``
    layers, ReLU and dropout between them (PyG's ``GraphSAGE`` order)."""
    import torch.nn as nn
    import torch.nn.functional as F
    import dgl.nn.pytorch as dglnn

    class SAGE(nn.Module):
        def __init__(self):
            super().__init__()
            dims = [in_feats] + [hidden] * (layers - 1) + [classes]
            self.layers = nn.ModuleList(dglnn.SAGEConv(a, b, "mean")
                                        for a, b in zip(dims[:-1], dims[1:]))
            self.dropout = nn.Dropout(dropout)

        def forward(self, blocks, h):
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    return SAGE()


def _load_dgl_weights(model, path: str) -> None:
    import numpy as np
    import torch
    arrays = np.load(path)
    state = {k: torch.from_numpy(arrays[k].copy()) for k in arrays.files}
    model.load_state_dict(state)  # strict


def dgl_partition_main(args) -> int:
    r"""DGL's partitions of the exported graph with pyg_dist's assignment
    (SAR's too: ``benchmarks/sar_rank.py partition``)."""
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import numpy as np
    import torch
    import dgl
    import dgl.distributed.partition as dgl_partition

    z = np.load(args.graph)
    n = int(z["x"].shape[0])
    assignment = torch.from_numpy(z["assignment"].astype(np.int64))
    parts = int(assignment.max()) + 1
    g = dgl.graph((torch.from_numpy(z["src"]), torch.from_numpy(z["dst"])), num_nodes=n)
    g.ndata["features"] = torch.from_numpy(z["x"])
    g.ndata["labels"] = torch.from_numpy(z["y"])
    for key in ("train_mask", "val_mask", "test_mask"):
        g.ndata[key] = torch.from_numpy(z[key])
    calls = []

    def given_assignment(sim_g, num_parts, **kwargs):
        # partition_graph's METIS call, answered with pyg_dist's METIS parts.
        assert sim_g.num_nodes() == n and num_parts == parts, (sim_g.num_nodes(), num_parts)
        calls.append(kwargs)
        return assignment.clone()

    dgl_partition.metis_partition_assignment = given_assignment
    started = time.time()
    orig_nids, _ = dgl.distributed.partition_graph(
        g, GRAPH_NAME, parts, args.out, num_hops=1, part_method="metis",
        return_mapping=True)
    seconds = time.time() - started
    # One part: DGL puts every node in it without asking METIS.
    assert len(calls) == (1 if parts > 1 else 0), \
        "partition_graph did not ask for a METIS assignment"
    # The check: DGL's part p holds exactly pyg_dist's part p.
    conf = _read_json(osp.join(args.out, GRAPH_NAME + ".json"))
    ranges = conf["node_map"]["_N"]
    orig = orig_nids.numpy()
    same = []
    for p, (lo, hi) in enumerate(ranges):
        dgl_nodes = np.sort(orig[lo:hi])
        pyg_nodes = np.nonzero(z["assignment"] == p)[0]
        same.append(bool(dgl_nodes.size == pyg_nodes.size
                         and np.array_equal(dgl_nodes, pyg_nodes)))
    report = {"parts": parts, "identical_parts": same, "seconds": seconds,
              "inner_nodes": [hi - lo for lo, hi in ranges],
              "part_config": osp.join(args.out, GRAPH_NAME + ".json"),
              "dgl": dgl.__version__, "torch": torch.__version__}
    _write_json(osp.join(args.out, "assignment_check.json"), report)
    print(json.dumps(report))
    return 0 if all(same) else 1


def dgl_check_main(args) -> int:
    r"""DGL's model with the initial weights on a small whole graph (eval
    mode), for the driver to compare with PyG's outputs."""
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import numpy as np
    import torch
    import dgl
    spec = _read_json(args.spec)
    z = np.load(args.graph)
    g = dgl.graph((torch.from_numpy(z["src"]), torch.from_numpy(z["dst"])),
                  num_nodes=int(z["x"].shape[0]))
    model = _dgl_sage(spec["in_feats"], spec["hidden"], spec["classes"], spec["layers"],
                      spec["dropout"])
    _load_dgl_weights(model, args.weights)
    model.eval()
    with torch.no_grad():
        out = model([g] * spec["layers"], torch.from_numpy(z["x"]))
    np.save(args.out, out.numpy())
    return 0


def dgl_trainer_main(spec_path: str) -> int:
    r"""A DGL server (``DGL_ROLE=server``: ``initialize`` serves and exits) or
    trainer (under ``torch.distributed.run``), as DGL's
    ``examples/distributed/graphsage`` runs them, with the run's settings."""
    os.environ.setdefault("DGLBACKEND", "pytorch")
    spec = _read_json(spec_path)
    d = spec["dgl"]
    import numpy as np
    import torch
    import torch.nn.functional as F
    import dgl

    dgl.distributed.initialize(d["ip_config"])  # a server serves here, then exits
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"] + rank)  # the seeds' shuffle and dropout
    dgl.seed(spec["seed"] + rank)  # this trainer's sampling (the servers draw their own)
    g = dgl.distributed.DistGraph(GRAPH_NAME, part_config=d["part_config"])
    pb = g.get_partition_book()
    train_nid = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
    local = pb.partid2nids(pb.partid).numpy()
    local_seed_fraction = float(np.isin(train_nid.numpy(), local).mean())
    model = _dgl_sage(spec["in_feats"], spec["hidden"], spec["classes"], spec["layers"],
                      spec["dropout"])
    _load_dgl_weights(model, spec["weights"]["dgl"])
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=spec["lr"])
    sampler = dgl.dataloading.NeighborSampler(d["fanouts"])
    loader = dgl.dataloading.DistNodeDataLoader(g, train_nid, sampler,
                                                batch_size=spec["batch_size"],
                                                shuffle=True, drop_last=False)
    features, labels = g.ndata["features"], g.ndata["labels"]
    baseline = _proc_status()
    rows = []
    for epoch in range(1, spec["epochs"] + 1):
        reset_peak_rss()
        start = time.perf_counter()
        seeds_done, steps, loss_sum, inputs = 0, 0, 0.0, 0
        blocks_of_first_step = None
        model.train()
        with model.join():
            for input_nodes, seeds, blocks in loader:
                x = features[input_nodes]
                y = labels[seeds].long()
                loss = F.cross_entropy(model(blocks, x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if blocks_of_first_step is None:  # (sources, destinations, edges), input first
                    blocks_of_first_step = [(b.num_src_nodes(), b.num_dst_nodes(),
                                             b.num_edges()) for b in blocks]
                seeds_done += len(seeds)
                inputs += len(input_nodes)
                loss_sum += float(loss) * len(seeds)
                steps += 1
        seconds = time.perf_counter() - start
        mem = _proc_status()
        rows.append({"epoch": epoch, "time": seconds, "seeds": seeds_done, "steps": steps,
                     "loss": loss_sum / max(seeds_done, 1), "input_nodes": inputs,
                     "blocks_of_first_step": blocks_of_first_step,
                     "peak_rss": mem.get("VmHWM"), "rss": mem.get("VmRSS"),
                     "rss_shmem": mem.get("RssShmem"), "rss_anon": mem.get("RssAnon")})
        print(f"rank {rank} epoch {epoch}: {seconds:.3f} s, {seeds_done} seeds, "
              f"{steps} steps, loss {rows[-1]['loss']:.4f}", flush=True)
    if rank == 0:
        state = {k: v.detach().cpu().numpy() for k, v in model.module.state_dict().items()}
        np.savez(osp.join(spec["run_dir"], "dgl_final.npz"), **state)
    _write_json(osp.join(spec["run_dir"], f"dgl_rank{rank}.json"),
                {"rank": rank, "world": world, "torch_threads": torch.get_num_threads(),
                 "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                 "num_train": int(len(train_nid)),
                 "local_seed_fraction": local_seed_fraction,
                 "baseline_rss": baseline.get("VmRSS"), "epochs": rows,
                 "dgl": dgl.__version__, "torch": torch.__version__})
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0  # DGL's atexit hook (exit_client) shuts the servers down


# --------------------------------------------------------------------------- #
# The driver (project venv, root)
# --------------------------------------------------------------------------- #

def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


class Network:
    r"""``parts`` emulated machines: network namespaces ``dgb-m{m}`` with
    address ``10.77.0.{m+1}`` on ``eth0``, each joined by a veth pair to a
    bridge in namespace ``dgb-sw``; removed by :meth:`close`."""

    def __init__(self, parts: int, mtu: int) -> None:
        self.parts, self.mtu = parts, mtu
        self.names = [f"{NS_PREFIX}-m{m}" for m in range(parts)]
        self.switch = f"{NS_PREFIX}-sw"

    def ip(self, m: int) -> str:
        return f"{SUBNET}.{m + 1}"

    def open(self) -> "Network":
        self.close()  # leftovers of an interrupted run
        _sh("ip", "netns", "add", self.switch)
        _sh("ip", "-n", self.switch, "link", "set", "lo", "up")
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for m, ns in enumerate(self.names):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", self.switch, "link", "add", f"v{m}", "mtu", str(self.mtu),
                "type", "veth", "peer", "name", IFNAME, "mtu", str(self.mtu), "netns", ns)
            _sh("ip", "-n", self.switch, "link", "set", f"v{m}", "master", "br0")
            _sh("ip", "-n", self.switch, "link", "set", f"v{m}", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.ip(m)}/24", "dev", IFNAME)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "link", "set", IFNAME, "up")
        # Every machine's link is up (the bridge runs without STP: its ports
        # forward at once).
        for ns in self.names:
            for _ in range(50):
                state = _sh("ip", "netns", "exec", ns, "cat",
                            f"/sys/class/net/{IFNAME}/operstate", check=False).stdout
                if state.strip() == "up":
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError(f"{ns}: {IFNAME} did not come up")
        return self

    def bytes_sent(self) -> int:
        r"""Bytes the machines have sent into the bridge so far."""
        total = 0
        for m in range(self.parts):
            out = _sh("ip", "netns", "exec", self.names[m], "cat",
                      f"/sys/class/net/{IFNAME}/statistics/tx_bytes", check=False)
            try:
                total += int(out.stdout.strip())
            except ValueError:
                pass
        return total

    def close(self) -> None:
        for ns in [f"{NS_PREFIX}-m{m}" for m in range(16)] + [self.switch]:
            _sh("ip", "netns", "del", ns, check=False)


def machine_info() -> Dict[str, Any]:
    import torch
    import torch_geometric
    import pyg_dist
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "cpus": os.cpu_count(), "memory_gib": round(pages * page_size / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
            "pyg_dist": pyg_dist.__version__}


def prepare(args) -> Dict[str, Any]:
    r"""The graph and pyg_dist's METIS partitions (``pyg-dist partition``),
    the arrays DGL reads, DGL's partitions of the same assignment, and the
    initial weights in both layouts. Reused when already in the workdir."""
    import numpy as np
    import torch
    from pyg_dist.config import TrainConfig, build_model
    from pyg_dist.datasets import load_reddit_shaped
    from pyg_dist.partition import PartitionBook
    from pyg_dist.partition.partition import graph_hash

    w = args.workdir
    data_dir = osp.join(w, "data")
    parts_root = osp.join(w, f"parts{args.parts}")
    if not osp.exists(osp.join(parts_root, "meta.json")):
        cli = osp.join(osp.dirname(sys.executable), "pyg-dist")
        cmd = [cli, "partition", "--dataset", "reddit-shaped", "--num-nodes",
               str(args.num_nodes), "--data-seed", str(args.data_seed), "--data-dir", data_dir,
               "--num-parts", str(args.parts), "--method", "metis", "--root", parts_root]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    data = load_reddit_shaped(root=data_dir, seed=args.data_seed, num_nodes=args.num_nodes)
    book = PartitionBook.load(parts_root)
    assert book.meta["graph_hash"] == graph_hash(data), "partitions of another graph"
    assignment = torch.empty(data.num_nodes, dtype=torch.long)
    assignment[book.perm] = book.owner(torch.arange(data.num_nodes))
    classes = int(data.y.max()) + 1

    graph_npz = osp.join(w, f"graph_parts{args.parts}.npz")
    if not osp.exists(graph_npz):
        np.savez(graph_npz, src=data.edge_index[0].numpy(), dst=data.edge_index[1].numpy(),
                 x=data.x.numpy(), y=data.y.numpy(), assignment=assignment.numpy(),
                 train_mask=data.train_mask.numpy(), val_mask=data.val_mask.numpy(),
                 test_mask=data.test_mask.numpy())
    dgl_parts = osp.join(w, f"dgl_parts{args.parts}")
    check_file = osp.join(dgl_parts, "assignment_check.json")
    if not osp.exists(check_file):
        shutil.rmtree(dgl_parts, ignore_errors=True)
        subprocess.run([args.dgl_python, SCRIPT, "dgl-partition", "--graph", graph_npz,
                        "--out", dgl_parts], check=True, env=_dgl_env())
    check = _read_json(check_file)
    if not all(check["identical_parts"]):
        raise SystemExit(f"DGL's parts differ from pyg_dist's: {check}")

    # The initial weights: pyg_dist's model builder, seeded, in both layouts.
    config = pyg_config(args, classes)
    model = build_model(TrainConfig(**config), data.num_features, classes)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    weights_pyg = osp.join(w, f"init_seed{args.seed}.pt")
    torch.save(state, weights_pyg)
    weights_dgl = osp.join(w, f"init_seed{args.seed}_dgl.npz")
    np.savez(weights_dgl, **{k: v.numpy() for k, v in pyg_to_dgl(state, args.layers).items()})
    return {"data": data, "book": book, "classes": classes, "parts_root": parts_root,
            "dgl_part_config": check["part_config"], "assignment_check": check,
            "weights": {"pyg": weights_pyg, "dgl": weights_dgl},
            "partition": {k: book.meta.get(k) for k in
                          ("method", "objective", "edge_cut", "edge_cut_ratio",
                           "comm_volume", "num_nodes", "num_edges")}
            | {"parts": [{k: s.get(k) for k in ("num_inner", "num_halo", "num_train")}
                         for s in book.stats]}}


def pyg_config(args, classes: int) -> Dict[str, Any]:
    return {"model": "sage", "num_layers": args.layers, "hidden": args.hidden,
            "dropout": args.dropout, "lr": args.lr, "weight_decay": 0.0,
            "epochs": args.epochs, "seed": args.seed, "loader": "neighbor",
            "loader_args": {"fanout": list(args.fanout), "batch_size": args.batch_size},
            "eval_every": args.epochs if args.system_eval else 0, "progress": False,
            "overwrite": True}


def pyg_to_dgl(state: Dict[str, Any], layers: int) -> Dict[str, Any]:
    r"""PyG ``GraphSAGE`` (``SAGEConv``: ``lin_l`` on the neighbour mean, with
    the bias; ``lin_r`` on the node) to DGL ``SAGEConv('mean')`` (``fc_neigh``
    on the neighbour mean, ``fc_self`` on the node, with the bias)."""
    out = {}
    for i in range(layers):
        out[f"layers.{i}.fc_neigh.weight"] = state[f"convs.{i}.lin_l.weight"]
        out[f"layers.{i}.fc_self.weight"] = state[f"convs.{i}.lin_r.weight"]
        out[f"layers.{i}.fc_self.bias"] = state[f"convs.{i}.lin_l.bias"]
    assert len(out) == len(state), sorted(state)
    return out


def dgl_to_pyg(state: Dict[str, Any], layers: int) -> Dict[str, Any]:
    out = {}
    for i in range(layers):
        out[f"convs.{i}.lin_l.weight"] = state[f"layers.{i}.fc_neigh.weight"]
        out[f"convs.{i}.lin_l.bias"] = state[f"layers.{i}.fc_self.bias"]
        out[f"convs.{i}.lin_r.weight"] = state[f"layers.{i}.fc_self.weight"]
    assert len(out) == len(state), sorted(state)
    return out


def _dgl_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["DGLBACKEND"] = "pytorch"
    env.pop("PYTHONPATH", None)
    return env


def model_spec(args, prep) -> Dict[str, Any]:
    return {"in_feats": prep["data"].num_features, "hidden": args.hidden,
            "classes": prep["classes"], "layers": args.layers, "dropout": args.dropout}


def check_equivalence(args, prep) -> Dict[str, Any]:
    r"""Both models, with the initial weights, on one small directed graph
    (a node without in-edges included), evaluated whole: the largest
    difference of their outputs."""
    import numpy as np
    import torch
    from pyg_dist.config import TrainConfig, build_model
    w = args.workdir
    rng = np.random.default_rng(1)
    n, e = 200, 2000
    src, dst = rng.integers(0, n, e), rng.integers(1, n, e)  # node 0: no in-edge
    x = rng.standard_normal((n, prep["data"].num_features)).astype(np.float32)
    path = osp.join(w, "equivalence_graph.npz")
    np.savez(path, src=src, dst=dst, x=x)
    spec_path = osp.join(w, "equivalence_spec.json")
    _write_json(spec_path, model_spec(args, prep))
    out_path = osp.join(w, "equivalence_dgl.npy")
    subprocess.run([args.dgl_python, SCRIPT, "dgl-check", "--graph", path, "--spec", spec_path,
                    "--weights", prep["weights"]["dgl"], "--out", out_path], check=True,
                   env=_dgl_env())
    model = build_model(TrainConfig(**pyg_config(args, prep["classes"])), x.shape[1],
                        prep["classes"])
    model.load_state_dict(torch.load(prep["weights"]["pyg"], weights_only=True))
    model.eval()
    with torch.no_grad():
        ours = model(torch.from_numpy(x), torch.from_numpy(np.stack([src, dst]))).numpy()
    theirs = np.load(out_path)
    diff = float(np.abs(ours - theirs).max())
    scale = float(np.abs(ours).max())
    result = {"nodes": n, "edges": e, "max_abs_diff": diff, "max_abs_output": scale,
              "same_function": diff <= 1e-4 * max(scale, 1.0)}
    if not result["same_function"]:
        raise SystemExit(f"DGL's and PyG's GraphSAGE differ with the same weights: {result}")
    return result


def evaluate(state: Dict[str, Any], args, prep) -> Dict[str, float]:
    r"""Exact full-graph inference (every neighbour) of one single-process
    PyG GraphSAGE with :obj:`state`, on the whole graph: the same evaluation
    for both systems."""
    return full_graph_accuracies(pyg_config(args, prep["classes"]), prep["classes"],
                                 prep["data"], state)


def full_graph_accuracies(config: Dict[str, Any], classes: int, data,
                          state: Dict[str, Any]) -> Dict[str, float]:
    r"""Train, validation and test accuracy of pyg_dist's model of
    :obj:`config` (a ``TrainConfig``'s fields) with :obj:`state`, by exact
    single-process inference on the whole graph :obj:`data`."""
    import warnings
    import torch
    from torch_geometric.utils import to_torch_csr_tensor
    from pyg_dist.config import TrainConfig, build_model
    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
    model = build_model(TrainConfig(**config), data.num_features, classes)
    model.load_state_dict(state)
    model.eval()
    adj_t = to_torch_csr_tensor(data.edge_index.flip(0), size=(data.num_nodes,) * 2)
    with torch.no_grad():
        pred = model(data.x, adj_t).argmax(-1)
    return {f"{k}_acc": float((pred[m] == data.y[m]).float().mean())
            for k, m in (("train", data.train_mask), ("val", data.val_mask),
                         ("test", data.test_mask))}


def run_spec(args, prep, net: Network, system: str, index: int, run_dir: str) -> Dict[str, Any]:
    r"""What every machine of one run starts, with which environment."""
    p = args.parts
    base, workers = variant(system)
    master_port = 29600 + index % 200
    dgl_port = 30100 + 10 * (index % 100)
    threads = {"OMP_NUM_THREADS": args.threads, "MKL_NUM_THREADS": args.threads}
    cores = os.sched_getaffinity(0)
    machines = []
    ip_config = osp.join(run_dir, "ip_config.txt")
    if base == "dgl":
        with open(ip_config, "w") as f:
            f.writelines(f"{net.ip(m)} {dgl_port}\n" for m in range(p))
    for m in range(p):
        torchrun = ["-m", "torch.distributed.run", "--nnodes", str(p), "--nproc-per-node", "1",
                    "--node-rank", str(m), "--master-addr", net.ip(0),
                    "--master-port", str(master_port)]
        gloo = {"GLOO_SOCKET_IFNAME": IFNAME, "TP_SOCKET_IFNAME": IFNAME,
                "PYTHONUNBUFFERED": "1"}
        if base == "dgl":
            # launch.py's environment: every sampler process is an RPC client too
            common = {"DGLBACKEND": "pytorch", "DGL_NUM_SAMPLER": workers,
                      "DGL_NUM_CLIENT": p * (1 + workers),
                      "DGL_CONF_PATH": prep["dgl_part_config"], "DGL_IP_CONFIG": ip_config,
                      "DGL_NUM_SERVER": 1, "DGL_GRAPH_FORMAT": "csc", **gloo}
            server = {**common, "DGL_ROLE": "server", "DGL_SERVER_ID": m,
                      "OMP_NUM_THREADS": args.server_threads,
                      "MKL_NUM_THREADS": args.server_threads}
            client = {**common, **threads, "DGL_DIST_MODE": "distributed",
                      "DGL_ROLE": "client", "DGL_GROUP_ID": 0}
            cmd = [SCRIPT, "dgl-trainer", "--spec", osp.join(run_dir, "spec.json")]
            procs = [{"role": "server", "cmd": [args.dgl_python] + cmd, "env": server},
                     {"role": "launcher", "cmd": [args.dgl_python] + torchrun + cmd,
                      "env": client}]
        else:
            cmd = [SCRIPT, "pyg-trainer", "--spec", osp.join(run_dir, "spec.json")]
            procs = [{"role": "launcher", "cmd": [sys.executable] + torchrun + cmd,
                      "env": {**threads, **gloo}}]
        machine_cores = None
        if args.pin_cores:
            ordered = sorted(cores)
            share = max(1, len(ordered) // p)
            machine_cores = ordered[(m * share) % len(ordered):][:share] or ordered
        machines.append({"procs": procs, "cores": machine_cores})
    fanouts = list(args.fanout)
    config = pyg_config(args, prep["classes"])
    if base == "pyg" and workers is not None:
        config["loader_args"]["workers"] = workers
    return {"system": system, "run_dir": run_dir, "machines": machines,
            "timeout": args.timeout, "poll_interval": 0.5, "threads": args.threads,
            "seed": args.seed, "epochs": args.epochs, "batch_size": args.batch_size,
            "lr": args.lr, **model_spec(args, prep), "weights": prep["weights"],
            "dgl": {"ip_config": ip_config, "part_config": prep["dgl_part_config"],
                    "fanouts": fanouts[::-1] if args.dgl_fanout_order == "matched"
                    else fanouts},
            "pyg": {"root": osp.abspath(prep["parts_root"]), "out": osp.join(run_dir, "out"),
                    "config": config,
                    "timeout": min(args.timeout, 600)}}


def launch(spec: Dict[str, Any], net: Network) -> List[Dict[str, Any]]:
    r"""Starts every machine's agent in its namespaces and waits for all."""
    run_dir = spec["run_dir"]
    spec_path = osp.join(run_dir, "spec.json")
    _write_json(spec_path, spec)
    agents = []
    for m in range(len(spec["machines"])):
        cmd = ["ip", "netns", "exec", net.names[m], "unshare", "--mount",
               "--propagation", "private", sys.executable, SCRIPT, "machine",
               "--spec", spec_path, "--machine", str(m)]
        log = open(osp.join(run_dir, "logs", f"agent{m}.log"), "w")
        agents.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True))
    deadline = time.time() + spec["timeout"] + 120
    failed_at = None
    try:
        while any(a.poll() is None for a in agents):
            if failed_at is None and any(a.returncode not in (None, 0) for a in agents):
                failed_at = time.time()
            if time.time() > deadline or (failed_at and time.time() > failed_at + 60):
                for a in agents:
                    if a.poll() is None:
                        a.send_signal(signal.SIGTERM)
                deadline = failed_at = time.time() + 3600
                for a in agents:
                    try:
                        a.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        os.killpg(a.pid, signal.SIGKILL)
            time.sleep(0.5)
    except BaseException:
        for a in agents:
            if a.poll() is None:
                a.send_signal(signal.SIGTERM)
        for a in agents:
            try:
                a.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(a.pid, signal.SIGKILL)
        raise
    results = []
    for m, a in enumerate(agents):
        path = osp.join(run_dir, f"machine_{m}.json")
        results.append(_read_json(path) if osp.exists(path) else
                       {"machine": m, "missing": True, "returncode": a.returncode})
    return results


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def collect(system: str, spec, machines, args, prep) -> Dict[str, Any]:
    r"""One run's numbers from its trainers' files, the agents' polls and
    the common evaluation of its final weights."""
    import numpy as np
    import torch
    run_dir = spec["run_dir"]
    p = args.parts
    epochs: List[Dict[str, Any]] = []
    trainers: List[Dict[str, Any]] = []
    state = None
    if variant(system)[0] == "dgl":
        ranks = [_read_json(osp.join(run_dir, f"dgl_rank{r}.json")) for r in range(p)
                 if osp.exists(osp.join(run_dir, f"dgl_rank{r}.json"))]
        if len(ranks) != p:
            raise RuntimeError("missing trainer results")
        for e in range(args.epochs):
            rows = [r["epochs"][e] for r in ranks]
            epochs.append({"epoch": e + 1, "time": max(x["time"] for x in rows),
                           "seeds": sum(x["seeds"] for x in rows),
                           "steps": max(x["steps"] for x in rows),
                           "loss": sum(x["loss"] * x["seeds"] for x in rows)
                           / max(sum(x["seeds"] for x in rows), 1),
                           "input_nodes": sum(x["input_nodes"] for x in rows),
                           "blocks_of_first_step_rank0": rows[0].get("blocks_of_first_step"),
                           "peak_rss_per_trainer": [x["peak_rss"] for x in rows],
                           "rss_shmem_per_trainer": [x["rss_shmem"] for x in rows]})
        trainers = [{"rank": r["rank"], "torch_threads": r["torch_threads"],
                     "omp_num_threads": r["omp_num_threads"], "num_train": r["num_train"],
                     "local_seed_fraction": r["local_seed_fraction"],
                     "baseline_rss": r["baseline_rss"]} for r in ranks]
        arrays = np.load(osp.join(run_dir, "dgl_final.npz"))
        state = dgl_to_pyg({k: torch.from_numpy(arrays[k].copy()) for k in arrays.files},
                           args.layers)
        system_acc = None
    else:
        from pyg_dist.train import load_model
        out = spec["pyg"]["out"]
        with open(osp.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        seeds = int(prep["data"].train_mask.sum())
        for row in rows:
            epochs.append({"epoch": row["epoch"], "time": row["time"], "seeds": seeds,
                           "loss": row["loss"], "time_sample": row.get("time_sample"),
                           "time_reduce": row.get("time_reduce"),
                           "seeds_per_s_metric": row.get("seeds_per_s"),
                           "feature_bytes": row.get("feature_bytes"),
                           "peak_rss_per_trainer": row.get("peak_mem_per_rank")})
        trainers = [_read_json(osp.join(run_dir, f"pyg_rank{r}.json")) for r in range(p)]
        for t, base in zip(trainers, rows[0].get("baseline_mem_per_rank") or [None] * p):
            t["baseline_rss"] = base
        state = load_model(out).state_dict()
        system_acc = rows[-1].get("test_acc") if args.system_eval else None
    later = epochs[1:] if len(epochs) > 1 else epochs
    s_epoch = _median([e["time"] for e in later])
    seeds_s = _median([e["seeds"] / e["time"] for e in later])
    peak_window = [max(e["peak_rss_per_trainer"][r] or 0 for e in epochs) for r in range(p)]
    procs = [dict(x, machine=mach["machine"]) for mach in machines
             for x in mach.get("processes", [])]

    def lifetime(field: str) -> Dict[str, List[float]]:
        values = {role: [round(x.get(field, 0) / MiB, 1) for x in procs if x["role"] == role]
                  for role in ("trainer", "server", "launcher")}
        return {role: v for role, v in values.items() if v}

    return {"epochs": epochs, "s_per_epoch": s_epoch, "seeds_per_s": seeds_s,
            "epoch_times": [e["time"] for e in epochs],
            **evaluate(state, args, prep), "system_test_acc": system_acc,
            "peak_rss_per_trainer_mib": [round(b / MiB, 1) for b in peak_window],
            # Polled maxima per process (machine order): VmHWM, and the largest
            # anonymous, file-backed and shared-memory parts of the RSS seen.
            "lifetime_peak_rss_mib": lifetime("VmHWM"),
            "lifetime_rss_anon_mib": lifetime("RssAnon"),
            "lifetime_rss_file_mib": lifetime("RssFile"),
            "lifetime_rss_shmem_mib": lifetime("RssShmem"),
            "shm_peak_mib_per_machine": [round(mach.get("shm_peak_bytes", 0) / MiB, 1)
                                         for mach in machines],
            "trainers": trainers, "processes": procs}


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for system in dict.fromkeys(r["system"] for r in runs):
        ok = [r for r in runs if r["system"] == system and r.get("ok")]
        if not ok:
            continue
        s = [r["s_per_epoch"] for r in ok]
        q = [r["seeds_per_s"] for r in ok]
        out[system] = {
            "runs": len(ok), "s_per_epoch_median": _median(s), "s_per_epoch_range": [min(s), max(s)],
            "seeds_per_s_median": _median(q), "seeds_per_s_range": [min(q), max(q)],
            "test_acc_mean": statistics.mean(r["test_acc"] for r in ok),
            "test_acc_range": [min(r["test_acc"] for r in ok), max(r["test_acc"] for r in ok)],
            "peak_rss_per_trainer_mib_max": max(max(r["peak_rss_per_trainer_mib"]) for r in ok),
            "lifetime_trainer_mib_max": max(max(r["lifetime_peak_rss_mib"].get("trainer", [0]))
                                            for r in ok),
            "lifetime_trainer_anon_mib_max": max(
                max(r["lifetime_rss_anon_mib"].get("trainer", [0])) for r in ok),
            "lifetime_trainer_file_mib_max": max(
                max(r["lifetime_rss_file_mib"].get("trainer", [0])) for r in ok),
            "lifetime_server_mib_max": max((max(r["lifetime_peak_rss_mib"].get("server", [0]))
                                            for r in ok), default=0),
            "lifetime_server_anon_mib_max": max(
                (max(r["lifetime_rss_anon_mib"].get("server", [0])) for r in ok), default=0),
            "shm_mib_per_machine_max": max(max(r["shm_peak_mib_per_machine"]) for r in ok),
        }
    dgl = [k for k in out if variant(k)[0] == "dgl"]
    if dgl and "pyg" in out:  # pyg_dist as users run it against DGL at its best
        best = min(dgl, key=lambda k: out[k]["s_per_epoch_median"])
        out["dgl_best"] = best
        out["pyg_over_dgl_s_per_epoch"] = (out["pyg"]["s_per_epoch_median"]
                                           / out[best]["s_per_epoch_median"])
        out["pyg_over_dgl_seeds_per_s"] = (out["pyg"]["seeds_per_s_median"]
                                           / out[best]["seeds_per_s_median"])
    return out


def print_table(summary: Dict[str, Any], runs: List[Dict[str, Any]]) -> None:
    names = {r["system"]: system_name(r["system"]) for r in runs}
    print("\nper run (time order):")
    print(f"{'run':>3} {'system':<14} {'s/epoch':>8} {'seeds/s':>8} {'test acc':>8} "
          f"{'peak RSS/trainer MiB':>22} {'server MiB':>11} {'load before→after':>18}")
    for i, r in enumerate(runs):
        if not r.get("ok"):
            print(f"{i:>3} {names[r['system']]:<14} FAILED: {r.get('error', '')[:80]}")
            continue
        server = r["lifetime_peak_rss_mib"].get("server")
        print(f"{i:>3} {names[r['system']]:<14} {r['s_per_epoch']:>8.3f} "
              f"{r['seeds_per_s']:>8.0f} {100 * r['test_acc']:>7.2f}% "
              f"{'/'.join(f'{v:.0f}' for v in r['peak_rss_per_trainer_mib']):>22} "
              f"{'/'.join(f'{v:.0f}' for v in server) if server else '-':>11} "
              f"{r['loadavg_before'][0]:>8.2f}→{r['loadavg_after'][0]:<8.2f}")
    print("\nsummary (s/epoch: median of epochs 2..N per run, then median over runs):")
    print(f"{'system':<14} {'runs':>4} {'s/epoch':>8} {'range':>15} {'seeds/s':>8} "
          f"{'range':>13} {'test acc':>8} {'trainer MiB':>11} {'(anon)':>6} "
          f"{'server MiB':>10} {'(anon)':>6} {'shm MiB':>8}")
    for key, s in summary.items():
        if key not in names:
            continue
        lo, hi = s["s_per_epoch_range"]
        qlo, qhi = s["seeds_per_s_range"]
        print(f"{names[key]:<14} {s['runs']:>4} {s['s_per_epoch_median']:>8.3f} "
              f"{lo:>7.3f}-{hi:<7.3f} {s['seeds_per_s_median']:>8.0f} "
              f"{qlo:>6.0f}-{qhi:<6.0f} {100 * s['test_acc_mean']:>7.2f}% "
              f"{s['peak_rss_per_trainer_mib_max']:>11.0f} "
              f"{s['lifetime_trainer_anon_mib_max']:>6.0f} "
              f"{s['lifetime_server_mib_max']:>10.0f} {s['lifetime_server_anon_mib_max']:>6.0f} "
              f"{s['shm_mib_per_machine_max']:>8.0f}")
    print("trainer MiB: peak RSS of an epoch's training loop (max over trainers, epochs, "
          "runs); (anon): the largest anonymous RSS polled; server MiB: a DGL server's "
          "lifetime peak RSS; shm MiB: /dev/shm in use on a machine")
    if "pyg_over_dgl_s_per_epoch" in summary:
        print(f"pyg_dist (defaults) against {names[summary['dgl_best']]} (DGL's fastest "
              f"here): {summary['pyg_over_dgl_s_per_epoch']:.2f}x the s/epoch, "
              f"{summary['pyg_over_dgl_seeds_per_s']:.2f}x the seeds/s")


def driver(args) -> int:
    if os.geteuid() != 0:
        raise SystemExit("distdgl.py needs root (network and mount namespaces)")
    if not osp.exists(args.dgl_python):
        raise SystemExit(f"no DGL venv at '{args.dgl_python}': run `make bench-dgl-env` "
                         f"(or give --dgl-env)")
    os.makedirs(args.workdir, exist_ok=True)
    started = time.time()
    prep = prepare(args)
    equivalence = check_equivalence(args, prep)
    print(f"partitions identical: {prep['assignment_check']['identical_parts']}; "
          f"same function with the same weights: max |diff| "
          f"{equivalence['max_abs_diff']:.2e}", flush=True)
    order = [s for s in args.systems.split(",") if s]
    for s in order:
        variant(s)
    net = Network(args.parts, args.mtu).open()
    runs: List[Dict[str, Any]] = []
    header = {
        "machine": machine_info(), "args": vars(args),
        "dgl_env": {"python": args.dgl_python},
        "workload": {"graph": f"reddit_shaped(num_nodes={args.num_nodes}, "
                              f"seed={args.data_seed})",
                     "nodes": prep["data"].num_nodes, "edges": int(prep["data"].num_edges),
                     "features": prep["data"].num_features, "classes": prep["classes"],
                     "train_nodes": int(prep["data"].train_mask.sum()),
                     "parts": args.parts, "trainers": args.parts, "model":
                     f"GraphSAGE mean, {args.layers} layers, hidden {args.hidden}, "
                     f"dropout {args.dropout}", "fanout_pyg_order": args.fanout,
                     "fanout_dgl": (list(args.fanout)[::-1] if args.dgl_fanout_order
                                    == "matched" else list(args.fanout)),
                     "batch_size_per_trainer": args.batch_size, "optimizer":
                     f"Adam lr {args.lr}", "epochs": args.epochs,
                     "sampling": {s: system_name(s) for s in order}},
        "partition": prep["partition"], "assignment_check": prep["assignment_check"],
        "equivalence": equivalence,
        "fairness": {
            "partition": "pyg_dist's METIS assignment (pyg-dist partition --method metis) "
                         "given to dgl.distributed.partition_graph by replacing its METIS "
                         "call; parts checked identical",
            "initial_weights": "one PyG GraphSAGE (pyg_dist build_model, seed "
                               f"{args.seed}); DGL fc_neigh.weight=lin_l.weight, "
                               "fc_self.weight=lin_r.weight, fc_self.bias=lin_l.bias",
            "pyg_dist_path": "Python API: pyg_dist.preflight.check_training then "
                             "pyg_dist.launch.run_ranks(pyg_dist.train.train with "
                             "build_model wrapped to load the initial weights); the CLI "
                             "(pyg-dist train) cannot take initial weights",
            "evaluation": "both final models evaluated by one single-process PyG GraphSAGE "
                          "on the whole graph with full neighbourhoods (exact inference); "
                          "neither system evaluates during training",
            "threads": f"OMP_NUM_THREADS={args.threads} and torch.set_num_threads("
                       f"{args.threads}) per trainer on both sides; DGL servers "
                       f"OMP_NUM_THREADS={args.server_threads}",
            "machines": f"{args.parts} network namespaces (veth, MTU {args.mtu}, one "
                        "bridge), each with a private /dev/shm; DGL: 1 server + 1 trainer "
                        "per machine; pyg_dist: 1 rank per machine; trainers of both "
                        "under torch.distributed.run (static rendezvous)"
                        + (", each machine pinned to its share of the cores"
                           if args.pin_cores else ", no core pinning"),
            "timing": "epoch time = the max over trainers of its training loop "
                      "(sampling, feature fetch, forward, backward, all-reduce, step)",
            "memory": "peak RSS per trainer: VmHWM over each epoch's training loop "
                      "(reset by /proc/self/clear_refs at its start), max over epochs; "
                      "lifetime peaks polled every 0.5 s; RSS counts the shared-memory "
                      "pages a DGL trainer touched (rss_shmem)"},
    }
    out_path = args.out
    # here, not at the top: common imports pyg_dist, which the DGL venv (where this
    # script's other subcommands run) does not have
    from common import portable

    def save() -> None:
        _write_json(out_path, portable({**header, "minutes": (time.time() - started) / 60,
                                        "summary": summarize(runs), "runs": runs}))

    try:
        index = 0
        for rep in range(args.repeats):
            for system in order:
                run_dir = osp.abspath(osp.join(args.workdir, "runs", f"{index:02d}_{system}"))
                shutil.rmtree(run_dir, ignore_errors=True)
                os.makedirs(osp.join(run_dir, "logs"))
                spec = run_spec(args, prep, net, system, index, run_dir)
                print(f"\n[{index}] {system} (repeat {rep + 1}/{args.repeats}) ...", flush=True)
                record: Dict[str, Any] = {"system": system, "repeat": rep, "index": index,
                                          "run_dir": run_dir, "loadavg_before": _loadavg()}
                t0, sent = time.time(), net.bytes_sent()
                machines = launch(spec, net)
                record["wall_s"] = time.time() - t0
                record["link_bytes"] = net.bytes_sent() - sent
                record["loadavg_after"] = _loadavg()
                try:
                    record.update(collect(system, spec, machines, args, prep))
                    record["ok"] = True
                    print(f"[{index}] {system}: {record['s_per_epoch']:.3f} s/epoch, "
                          f"{record['seeds_per_s']:.0f} seeds/s, test acc "
                          f"{100 * record['test_acc']:.2f}%, epochs "
                          f"{[round(t, 3) for t in record['epoch_times']]}", flush=True)
                except Exception as e:  # noqa: BLE001: recorded, the others still run
                    record.update(ok=False, error=f"{type(e).__name__}: {e}",
                                  machines=machines)
                    print(f"[{index}] {system} FAILED: {record['error']}", flush=True)
                    for m in range(args.parts):
                        for name in sorted(os.listdir(osp.join(run_dir, "logs"))):
                            if name.startswith((f"machine{m}_", f"agent{m}")):
                                print(f"--- {name}:\n{_tail(osp.join(run_dir, 'logs', name))}")
                runs.append(record)
                save()
                index += 1
    finally:
        net.close()
    summary = summarize(runs)
    print_table(summary, runs)
    print(f"\nwrote {out_path}")
    return 0 if all(r.get("ok") for r in runs) else 1


def _fanout(text: str) -> List[int]:
    return [int(k) for k in text.split(",")]


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("machine", "pyg-trainer", "dgl-trainer", "dgl-partition",
                            "dgl-check"):
        sub = argparse.ArgumentParser(prog=f"distdgl.py {argv[0]}")
        sub.add_argument("--spec")
        sub.add_argument("--machine", type=int)
        sub.add_argument("--graph")
        sub.add_argument("--out")
        sub.add_argument("--weights")
        a = sub.parse_args(argv[1:])
        if argv[0] == "machine":
            return machine_main(a.spec, a.machine)
        if argv[0] == "pyg-trainer":
            return pyg_trainer_main(a.spec)
        if argv[0] == "dgl-trainer":
            return dgl_trainer_main(a.spec)
        if argv[0] == "dgl-partition":
            return dgl_partition_main(a)
        return dgl_check_main(a)

    parser = argparse.ArgumentParser(
        description="DistDGL 2.1 against pyg_dist on the same graph, partitions, model, "
                    "fan-outs, batch size and initial weights")
    parser.add_argument("--quick", action="store_true",
                        help=f"a short check: {QUICK} (explicit flags still win)")
    parser.add_argument("--num-nodes", type=int, help=f"reddit_shaped nodes "
                        f"(full {FULL['num_nodes']}, quick {QUICK['num_nodes']})")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--parts", type=int, default=2,
                        help="METIS parts = emulated machines = trainers")
    parser.add_argument("--epochs", type=int, help=f"full {FULL['epochs']}")
    parser.add_argument("--repeats", type=int,
                        help=f"runs of each system, alternated (full {FULL['repeats']})")
    parser.add_argument("--systems", default="dgl,dgl-s1,pyg",
                        help="the runs of a repeat, in order: dgl (no sampler processes), "
                             "dgl-sN (N per trainer), pyg (its defaults), pyg-wN (N "
                             "sampling workers)")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--fanout", type=_fanout, default=[15, 10, 5],
                        help="per hop from the seeds (pyg_dist's/PyG's order)")
    parser.add_argument("--dgl-fanout-order", choices=("matched", "literal"),
                        default="matched",
                        help="matched: DGL gets the list reversed (its order is input "
                             "layer first), so both sample the same fan-out per hop; "
                             "literal: the same list unreversed")
    parser.add_argument("--batch-size", type=int, default=1024,
                        help="seeds per trainer and step")
    parser.add_argument("--seed", type=int, default=0,
                        help="initial weights (pyg_dist's build_model) and shuffles")
    parser.add_argument("--threads", type=int,
                        help="OMP/torch threads per trainer, both systems "
                             "(default: cores / parts, at least 1)")
    parser.add_argument("--server-threads", type=int, default=1,
                        help="OMP threads of each DGL server (launch.py's default: 1)")
    parser.add_argument("--pin-cores", action="store_true",
                        help="pin each emulated machine to its share of the cores")
    parser.add_argument("--mtu", type=int, default=1500, help="of the veth links")
    parser.add_argument("--system-eval", action="store_true",
                        help="also let pyg_dist evaluate itself after the last epoch "
                             "(recorded as system_test_acc)")
    parser.add_argument("--dgl-env", default=os.environ.get("DGL_ENV") or DGL_ENV,
                        help="the venv of `make bench-dgl-env` (default $DGL_ENV, else "
                             ".bench/dgl-env in the repository)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    parser.add_argument("--workdir", help="default runs/distdgl_{parts}parts[_quick]")
    parser.add_argument("--out", help="default benchmarks/results/distdgl_{parts}parts[_quick].json")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.threads is None:
        args.threads = max(1, len(os.sched_getaffinity(0)) // args.parts)
    if len(args.fanout) != args.layers:
        parser.error(f"--fanout has {len(args.fanout)} hops for {args.layers} layers")
    name = f"distdgl_{args.parts}parts" + ("_quick" if args.quick else "")
    args.workdir = osp.abspath(args.workdir or osp.join(REPO, "runs", name))
    args.out = osp.abspath(args.out or osp.join(RESULTS_DIR, name + ".json"))
    args.dgl_python = osp.join(args.dgl_env, "bin", "python")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
