r"""The single-process PyG baselines of the benchmarks: full-graph training,
``NeighborLoader`` and ``ClusterLoader``, with the model pyg_dist trains
(:func:`pyg_dist.train.build_model`, same seed and optimizer).

Every epoch is one pass over the train nodes followed by an untimed
full-graph evaluation, so the per-epoch rows have the keys of pyg-dist's
``metrics.jsonl`` (no communication: those times and bytes are 0) and feed
the same tables and plots. ``time_sample`` is the time spent waiting on the
loader for its next batch.

``NeighborLoader`` and ``ClusterLoader`` need torch-sparse or pyg-lib, which
have no wheels here: run this module in a Python that has them
(``make bench-env``); :func:`run` launches it there and returns the rows.

Usage (one baseline, one JSON row per epoch on stdout)::

    /work/bench-env/bin/python benchmarks/pyg_baselines.py --kind cluster \
        --num-nodes 10000 --epochs 5 --num-batches 10
"""
import argparse
import functools
import json
import math
import os
import os.path as osp
import subprocess
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.utils import to_torch_csr_tensor

from pyg_dist.datasets import load_default
from pyg_dist.metrics import peak_memory_bytes, reset_peak_memory
from pyg_dist.train import MASKS, TrainConfig, build_model, num_classes_of

KINDS = ("full", "neighbor", "cluster")


def batches(data: Data, kind: str, num_batches: int, fanout: Sequence[int],
            workdir: str) -> Iterable[Data]:
    r"""One epoch's training batches of :obj:`kind`: the whole graph (with a
    fused CSR ``adj_t``, PyG's fastest full-graph path), ``NeighborLoader``
    (fan-out :obj:`fanout`, the train nodes in :obj:`num_batches` seed
    batches) or ``ClusterLoader`` (ClusterGCN: ``4 * num_batches`` METIS
    clusters, 4 per batch)."""
    if kind == "full":
        adj_t = to_torch_csr_tensor(data.edge_index.flip(0), size=(data.num_nodes, ) * 2)
        return [Data(x=data.x, adj_t=adj_t, y=data.y, train_mask=data.train_mask)]
    from torch_geometric.loader import ClusterData, ClusterLoader, NeighborLoader
    if kind == "neighbor":
        train = data.train_mask.nonzero().view(-1)
        return NeighborLoader(data, num_neighbors=list(fanout), input_nodes=train,
                              batch_size=math.ceil(train.numel() / num_batches),
                              shuffle=True)
    clusters = ClusterData(data, num_parts=4 * num_batches, log=False,
                           save_dir=osp.join(workdir, "pyg_clusters"))
    return ClusterLoader(clusters, batch_size=4, shuffle=True)


def train(data: Data, kind: str, config: TrainConfig, num_batches: int = 10,
          fanout: Sequence[int] = (10, 10, 10), workdir: str = ".") -> List[Dict[str, Any]]:
    r"""Trains for ``config.epochs`` epochs; returns one metrics row per
    epoch. The loss is the mean over a batch's train nodes (its seeds for
    ``NeighborLoader``)."""
    model = build_model(config, data.num_features, num_classes_of(data.y))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay)
    loader = batches(data, kind, num_batches, fanout, workdir)
    full_adj_t = to_torch_csr_tensor(data.edge_index.flip(0), size=(data.num_nodes, ) * 2)
    rows = []
    for epoch in range(1, config.epochs + 1):
        reset_peak_memory()
        model.train()
        waited, loss_sum, steps = 0.0, 0.0, 0
        start = wait_start = time.perf_counter()
        for batch in loader:
            waited += time.perf_counter() - wait_start
            optimizer.zero_grad(set_to_none=True)
            adj = batch.adj_t if "adj_t" in batch else batch.edge_index
            out = model(batch.x, adj)
            if "batch_size" in batch:  # NeighborLoader: the seeds come first
                mask = torch.arange(batch.num_nodes) < batch.batch_size
            else:
                mask = batch.train_mask
            loss = F.cross_entropy(out[mask], batch.y[mask])
            loss.backward()
            optimizer.step()
            loss_sum, steps = loss_sum + loss.item(), steps + 1
            wait_start = time.perf_counter()
        seconds = time.perf_counter() - start
        peak = peak_memory_bytes()
        model.eval()
        with torch.no_grad():
            pred = model(data.x, full_adj_t).argmax(-1)
        accuracy = {f"{m}_acc": float((pred[mask] == data.y[mask]).float().mean())
                    for m in MASKS for mask in [data[f"{m}_mask"]]}
        rows.append({"epoch": epoch, "loss": loss_sum / max(steps, 1), "time": seconds,
                     "time_compute": seconds - waited, "time_comm": 0.0,
                     "time_reduce": 0.0, "time_sample": waited, "bytes_sent": 0,
                     "bytes_saved": 0, "cache_hit_rate": None, "halo_rows": 0,
                     "halo_rows_total": 0, "peak_mem_bytes": peak,
                     "peak_mem_bytes_mean": peak, "peak_mem_per_rank": [peak],
                     "steps": steps, **accuracy})
    return rows


def run(python: str, kind: str, args: argparse.Namespace, seed: int) -> List[Dict[str, Any]]:
    r"""Runs baseline :obj:`kind` in :obj:`python` (a fresh process: its
    own peak memory and all the machine's cores) with the graph, model and
    epochs of :obj:`args`; returns its rows. Raises ``RuntimeError`` with
    the reason when :obj:`python` lacks the loaders' backend, or with the
    last line of its error output when it fails."""
    missing = None if kind == "full" else has_loader_backend(python)
    if missing:
        raise RuntimeError(missing)
    cmd = [python, osp.abspath(__file__), "--kind", kind, "--epochs", str(args.epochs),
           "--hidden", str(args.hidden), "--seed", str(seed), "--workdir", args.workdir,
           "--num-batches", str(args.num_batches),
           "--fanout", ",".join(map(str, args.fanout))]
    if args.num_nodes:
        cmd += ["--num-nodes", str(args.num_nodes)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit code {proc.returncode}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@functools.lru_cache(maxsize=None)
def has_loader_backend(python: str) -> Optional[str]:
    r"""``None`` when :obj:`python` has a backend of ``NeighborLoader`` and
    ``ClusterLoader`` (torch-sparse or pyg-lib), else why not (probed once
    per Python)."""
    if not osp.exists(python):
        return f"{python} not found (make bench-env)"
    probe = ("import torch_geometric.typing as t; "
             "assert t.WITH_TORCH_SPARSE or t.WITH_PYG_LIB, 'no torch-sparse or pyg-lib'")
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    return None if proc.returncode == 0 else (lines[-1] if lines else "probe failed")


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-nodes", type=int, default=None)
    parser.add_argument("--num-batches", type=int, default=10)
    parser.add_argument("--fanout", type=lambda s: [int(k) for k in s.split(",")],
                        default=[10, 10, 10])
    parser.add_argument("--workdir", default="runs/bench_suite")
    args = parser.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    data = load_default(osp.join(args.workdir, "data"),
                        **({"num_nodes": args.num_nodes} if args.num_nodes else {}))
    config = TrainConfig(num_layers=len(args.fanout), hidden=args.hidden, epochs=args.epochs,
                         seed=args.seed, progress=False)
    for row in train(data, args.kind, config, args.num_batches, args.fanout, args.workdir):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
