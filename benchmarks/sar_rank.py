r"""The SAR side of ``benchmarks/sar.py``, run by the SAR venv's python
(``make bench-sar-env``: IntelLabs' SAR on DGL 2.1 and torch 2.2.1; pyg_dist
is not installed there, so this file, and ``benchmarks/distdgl.py`` it loads,
import only the standard library at module level and read everything else from
the files ``sar.py`` writes).

Subcommands:

* ``partition``: DGL's partitions (``dgl.distributed.partition_graph``, one
  hop of halo, as SAR's ``examples/partition_graph.py`` makes them) of the
  graph arrays, with pyg_dist's METIS assignment in place of DGL's METIS
  call, then checked to hold exactly pyg_dist's parts, node for node: the
  DistDGL benchmark's (``benchmarks/distdgl.py``'s ``dgl_partition_main``).
* ``train``: one SAR rank, as SAR's ``examples/train_homogeneous_graph_*``
  train: ``sar.load_dgl_partition_data``, ``sar.construct_full_graph`` (the
  whole graph in every layer), DGL ``SAGEConv('mean')`` layers with ReLU and
  dropout between them (PyG's ``GraphSAGE`` order), cross-entropy summed over
  the rank's training nodes over all ranks' training nodes,
  ``sar.gather_grads``, Adam. Mode ``sar``: SAR's default, sequential
  aggregation and rematerialisation; ``one-shot``: every remote row a layer
  needs at once (``get_full_partition_graph``).
* ``profile``: one process, the same step under ``torch.profiler``.
"""
import argparse
import importlib.util
import os
import os.path as osp
import sys
import time
from typing import Any, Dict, List

HERE = osp.dirname(osp.abspath(__file__))
# This folder holds benchmarks/sar.py, which would shadow the SAR package.
sys.path[:] = [p for p in sys.path if osp.abspath(p or os.getcwd()) != HERE]


def _load_distdgl():
    r"""``benchmarks/distdgl.py``, loaded from its file (this folder is off
    ``sys.path``): its standard-library helpers, and DGL's partitioning with
    pyg_dist's assignment, which SAR runs on as DistDGL does."""
    spec = importlib.util.spec_from_file_location("distdgl", osp.join(HERE, "distdgl.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


distdgl = _load_distdgl()
_read_json, _write_json = distdgl._read_json, distdgl._write_json


def _reset_peak() -> None:
    r"""A new resident high-water-mark window (as pyg_dist's metrics do)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def build_model(spec: Dict[str, Any]):
    r"""GraphSAGE of DGL ``SAGEConv('mean')`` layers (as SAR's examples build
    it), ReLU then dropout between layers, the initial weights loaded."""
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import dgl.nn.pytorch as dglnn

    class SAGE(nn.Module):
        def __init__(self):
            super().__init__()
            dims = [spec["in_feats"]] + [spec["hidden"]] * (spec["layers"] - 1) + \
                [spec["classes"]]
            self.convs = nn.ModuleList(dglnn.SAGEConv(a, b, "mean")
                                       for a, b in zip(dims[:-1], dims[1:]))
            self.dropout = nn.Dropout(spec["dropout"])

        def forward(self, blocks, h):
            for i, (conv, block) in enumerate(zip(self.convs, blocks)):
                h = conv(block, h)
                if i != len(self.convs) - 1:
                    h = self.dropout(F.relu(h))
            return h

    model = SAGE()
    arrays = np.load(spec["weights"])
    # the driver writes DGL's layout with "layers." keys; this model names them "convs."
    state = {k.replace("layers.", "convs.", 1): torch.from_numpy(arrays[k].copy())
             for k in arrays.files}
    model.load_state_dict(state)  # strict
    return model


class Rank:
    r"""One SAR rank's partition, graph, model and optimiser."""

    def __init__(self, spec: Dict[str, Any], rank: int, world: int, mode: str) -> None:
        os.environ.setdefault("DGLBACKEND", "pytorch")
        import torch
        import torch.distributed as dist
        import sar
        self.torch, self.dist, self.sar = torch, dist, sar
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        torch.manual_seed(spec["seed"] + rank)  # dropout
        os.environ.setdefault("SAR_SOCKET_NAME", "lo")  # every rank on this machine
        sar.initialize_comms(rank, world, "127.0.0.1", "gloo",
                             master_port_number=spec["master_port"])
        device = torch.device("cpu")
        data = sar.load_dgl_partition_data(spec["part_config"], rank, device)
        self.features = sar.suffix_key_lookup(data.node_features, "features")
        self.labels = sar.suffix_key_lookup(data.node_features, "labels").long()
        self.train = sar.suffix_key_lookup(data.node_features, "train_mask").bool()
        graph = sar.construct_full_graph(data)
        if mode == "one-shot":
            graph = graph[None].get_full_partition_graph()
        elif mode != "sar":
            raise ValueError(f"unknown SAR mode '{mode}': sar or one-shot")
        del data
        self.blocks = [graph] * spec["layers"]
        self.model = build_model(spec)
        sar.sync_params(self.model)
        n_train = torch.tensor([int(self.train.sum())])
        sar.comm.all_reduce(n_train, op=dist.ReduceOp.SUM, move_to_comm_device=True)
        self.n_train = int(n_train)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=spec["lr"])

    def step(self):
        r"""One full-graph training step; returns this rank's loss term."""
        F = self.torch.nn.functional
        self.model.train()
        logits = self.model(self.blocks, self.features)
        loss = F.cross_entropy(logits[self.train], self.labels[self.train],
                               reduction="sum") / self.n_train
        self.optimizer.zero_grad()
        loss.backward()
        self.sar.gather_grads(self.model)
        self.optimizer.step()
        return loss.detach()


def train_main(args) -> int:
    spec = _read_json(args.spec)
    rank, world = args.rank, spec["world"]
    r = Rank(spec, rank, world, spec["mode"])
    torch, dist = r.torch, r.dist
    baseline = distdgl._proc_status()
    rows: List[Dict[str, Any]] = []
    for epoch in range(1, spec["epochs"] + 1):
        _reset_peak()
        start = time.perf_counter()
        loss = r.step()
        seconds = time.perf_counter() - start
        mem = distdgl._proc_status()
        total = loss.reshape(1).clone()
        r.sar.comm.all_reduce(total, op=dist.ReduceOp.SUM, move_to_comm_device=True)
        rows.append({"epoch": epoch, "time": seconds, "loss": float(total),
                     "peak_rss": mem["VmHWM"], "rss": mem["VmRSS"]})
        print(f"rank {rank} epoch {epoch}: {seconds:.3f} s, loss {float(total):.6f}, "
              f"peak RSS {mem['VmHWM'] / 2**20:.0f} MiB", flush=True)
    if rank == 0:
        import numpy as np
        state = {k.replace("convs.", "layers.", 1): v.detach().numpy()
                 for k, v in r.model.state_dict().items()}
        np.savez(osp.join(spec["run_dir"], "sar_final.npz"), **state)
    import dgl
    import sar
    _write_json(osp.join(spec["run_dir"], f"sar_rank{rank}.json"),
                {"rank": rank, "world": world, "pid": os.getpid(), "mode": spec["mode"],
                 "torch_threads": torch.get_num_threads(),
                 "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                 "num_local_train": int(r.train.sum()), "num_train": r.n_train,
                 "baseline_rss": baseline["VmRSS"], "epochs": rows,
                 "sar": getattr(sar, "__version__", None), "dgl": dgl.__version__,
                 "torch": torch.__version__})
    dist.barrier()
    dist.destroy_process_group()
    return 0


def profile_main(args) -> int:
    r"""One process: ``warmup`` steps, then ``steps`` steps under
    ``torch.profiler``; writes every event's name, self CPU time and phase
    (the driver classifies them, the same way for both systems)."""
    spec = _read_json(args.spec)
    r = Rank(spec, 0, 1, spec["mode"])
    torch = r.torch
    wrap_kernels(torch)
    for _ in range(spec["warmup"]):
        r.step()
    from torch.profiler import ProfilerActivity, profile
    walls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(spec["steps"]):
            start = time.perf_counter()
            with torch.profiler.record_function("## step ##"):
                r.step()
            walls.append(time.perf_counter() - start)
    _write_json(args.out, {"walls": walls, "events": event_rows(prof),
                           "torch": torch.__version__})
    return 0


def wrap_kernels(torch) -> None:
    r"""DGL's C kernels (its sparse products, ``gspmm`` and ``gsddmm``, and
    the rest of ``dgl._sparse_ops``) are not torch operators, so the
    profiler does not see them: each gets a ``record_function`` named
    ``dgl::<name>`` where DGL's autograd functions call it."""
    import functools
    import dgl._sparse_ops as ops
    import dgl.backend.pytorch.sparse as bsparse
    for name in dir(ops):
        fn = getattr(ops, name)
        if not (name.startswith("_") and callable(fn) and getattr(fn, "__module__", "")
                == ops.__name__ and hasattr(bsparse, name)):
            continue

        def wrapped(*a, __fn=fn, __name=name, **k):
            with torch.profiler.record_function(f"dgl::{__name.lstrip('_')}"):
                return __fn(*a, **k)
        setattr(bsparse, name, functools.wraps(fn)(wrapped))
    # SAR's aggregation (its autograd function's forward, and the
    # rematerialisation in its backward) around those kernels.
    import sar.core.sar_aggregation as aggregation
    do_aggregation = aggregation.do_aggregation

    def recorded(*a, **k):
        with torch.profiler.record_function("sar::do_aggregation"):
            return do_aggregation(*a, **k)
    aggregation.do_aggregation = functools.wraps(do_aggregation)(recorded)


def event_rows(prof) -> List[Dict[str, Any]]:
    r"""Every profiled CPU event as ``{name, self_us, ancestors}`` (names from
    the parent up), for the driver to classify."""
    rows = []
    for e in prof.events():
        names, p = [], e.cpu_parent
        while p is not None:
            names.append(p.name)
            p = p.cpu_parent
        rows.append({"name": e.name, "self_us": e.self_cpu_time_total, "ancestors": names,
                     "thread": e.thread})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="sar_rank.py")
    parser.add_argument("command", choices=("partition", "train", "profile"))
    parser.add_argument("--graph")
    parser.add_argument("--out")
    parser.add_argument("--spec")
    parser.add_argument("--rank", type=int, default=0)
    args = parser.parse_args(argv)
    return {"partition": distdgl.dgl_partition_main, "train": train_main,
            "profile": profile_main}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
