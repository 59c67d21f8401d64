r"""Neighbour-sampled mini-batches (DistDGL / ByteGNN) side by side: partition
methods, rank counts and pipelined sampling, against PyG's ``NeighborLoader``.

On the embedded default graph (``--num-nodes``), partitioned by METIS and by
ByteGNN's block partitioner (``--methods``) into each of ``--parts`` parts,
this trains the same 3-layer GraphSAGE (hidden 64) with ``pyg-dist train
--loader neighbor`` (fan-outs ``--fanout``; ``--batch-size`` seeds per step
over all ranks, so every run takes as many SGD steps per epoch), with sampling in the training loop and with ``--workers``
background sampler workers (adaptive depth), on every ``--link`` (see
:mod:`netem`). Reported per run (means over the epochs after the first; times
are the max over ranks): seeds per second, epoch time, the trainer's idle
share (waiting for batches), the mean ready-queue length and depth, the
node-row bytes received from other ranks per epoch (the remote feature
traffic), all bytes sent, and the test accuracy after ``--epochs`` epochs
(exact full-graph inference). Per partitioning: edge cut and the remote
nodes the training nodes' full 1- and 2-hop neighbourhoods reach.

In a Python that has torch-sparse (``--pyg-python``, ``make bench-env``), PyG's
``NeighborLoader`` trains the same model, fan-outs and batch size single
process. PyG's own ``torch_geometric.distributed.PartitionNeighborLoader`` is not
compared: it is deprecated, and in PyG 2.8.1 its sampler fails to construct;
the benchmark records the error it raises.

Results go to ``benchmarks/results/minibatch.json`` (``--out``), saved after
every run.

Usage::

    python benchmarks/minibatch.py                                   # the full run
    python benchmarks/minibatch.py --num-nodes 20000 --parts 2 --epochs 3 \
        --link loopback --out runs/minibatch.json                    # a quick one
"""
import argparse
import json
import math
import os.path as osp
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import pyg_baselines  # noqa: E402
from common import MiB, RESULTS_DIR, run, save  # noqa: E402
from netem import network_for, parse_link  # noqa: E402

import pyg_dist  # noqa: E402
from pyg_dist.datasets import load_default  # noqa: E402
from pyg_dist.partition import PartitionBook  # noqa: E402
from pyg_dist.partition.block import khop_remote_volume  # noqa: E402

RESULTS = osp.join(RESULTS_DIR, "minibatch.json")


def partition(data, args, parts: int, method: str) -> Dict[str, Any]:
    r"""The partitions of one method (reused when on disk) and their quality."""
    root = osp.join(args.workdir, f"{method}{parts}")
    started = time.perf_counter()
    if not osp.exists(osp.join(root, "meta.json")):
        pyg_dist.partition_graph(data, parts, method=method, root=root,
                                 block_hops=len(args.fanout))
    seconds = time.perf_counter() - started
    book = PartitionBook.load(root)
    part_of = book.owner(book.inv_perm)
    src, dst = data.edge_index
    volume = {hops: sum(khop_remote_volume(data.edge_index, data.num_nodes, part_of,
                                           data.train_mask, hops)) for hops in (1, 2)}
    return {"root": root, "parts": parts, "method": method, "seconds": seconds,
            "edge_cut": int((part_of[src] != part_of[dst]).sum()),
            "remote_1hop": volume[1], "remote_2hop": volume[2],
            "inner": [s["num_inner"] for s in book.stats]}


def summarize(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    timed = rows[1:] or rows
    mean = lambda k: sum(r[k] for r in timed) / len(timed)  # noqa: E731
    return {"epoch_time": mean("time"), "seeds_per_s": mean("seeds_per_s"),
            "trainer_idle_frac": mean("trainer_idle_frac"),
            "queue_len": mean("queue_len"), "in_flight": mean("in_flight"),
            "feature_bytes": mean("feature_bytes"), "bytes_sent": mean("bytes_sent"),
            "local_seed_fraction": rows[-1]["local_seed_fraction"],
            "test_acc": rows[-1]["test_acc"], "epoch_times": [r["time"] for r in rows]}


def pyg_dist_neighbor_loader_error() -> None:
    r"""Tries to build PyG's distributed neighbour sampler; prints the error."""
    from torch_geometric.distributed import (HaloContext, PartitionNeighborSampler,
                                             LocalFeatureStore, LocalGraphStore)
    ctx = HaloContext(rank=0, global_rank=0, world_size=1, global_world_size=1,
                      group_name="probe")
    try:
        PartitionNeighborSampler(ctx, (LocalFeatureStore(), LocalGraphStore()), num_neighbors=[2])
        print(json.dumps({"error": None}))
    except Exception as e:  # the point: record what it raises
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))


def run_pyg_neighbor_loader(args, num_train: int) -> Dict[str, Any]:
    r"""PyG's ``NeighborLoader`` single process, with the fan-outs and as
    many steps per epoch as the pyg_dist runs."""
    try:
        rows = pyg_baselines.run(args.pyg_python, "neighbor", argparse.Namespace(
            **vars(args), num_batches=math.ceil(num_train / args.batch_size)), args.seed)
    except RuntimeError as e:
        return {"error": str(e)}
    epoch = statistics.fmean(r["time"] for r in rows[1:] or rows)
    return {"epoch_time": epoch, "seeds_per_s": num_train / epoch,
            "test_acc": rows[-1]["test_acc"], "epoch_times": [r["time"] for r in rows]}


def pyg_dist_neighbor_loader(args) -> Dict[str, Any]:
    r"""Whether PyG's own distributed neighbour sampler can be built."""
    if not osp.exists(args.pyg_python):
        return {"error": f"{args.pyg_python} not found (make bench-env)"}
    cmd = [args.pyg_python, osp.abspath(__file__), "--pyg-baseline", "dist"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: Dict[str, Any]) -> str:
    lines = ["| partitions | ranks | link | sampling | seeds/s | s/epoch | trainer idle "
             "| queue | depth | remote rows MB/epoch | MB sent/epoch | test acc |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        lines.append(
            f"| {r['method']} | {r['parts']} | {r['link']} | {r['sampling']} | "
            f"{r['seeds_per_s']:,.0f} | {r['epoch_time']:.2f} | "
            f"{100 * r['trainer_idle_frac']:.1f}% | {r['queue_len']:.2f} | "
            f"{r['in_flight']:.2f} | {r['feature_bytes'] / MiB:.1f} | "
            f"{r['bytes_sent'] / MiB:.1f} | {100 * r['test_acc']:.2f} |")
    pyg = results.get("pyg_neighbor_loader")
    if pyg and "error" not in pyg:
        lines.append(f"| PyG NeighborLoader | 1 | - | in loop | {pyg['seeds_per_s']:,.0f} | "
                     f"{pyg['epoch_time']:.2f} | - | - | - | - | - | "
                     f"{100 * pyg['test_acc']:.2f} |")
    elif pyg:
        lines.append(f"| PyG NeighborLoader | not run: {pyg['error']} |")
    lines += ["", "| partitions | parts | edge cut | remote nodes 1-hop | 2-hop "
              "| inner nodes | seconds |", "|---|---|---|---|---|---|---|"]
    for p in results["partitions"]:
        lines.append(f"| {p['method']} | {p['parts']} | {p['edge_cut']:,} | "
                     f"{p['remote_1hop']:,} | {p['remote_2hop']:,} | {p['inner']} | "
                     f"{p['seconds']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-nodes", type=int, default=50000)
    parser.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--methods", nargs="+", default=["metis", "block"],
                        choices=["metis", "block", "random"])
    parser.add_argument("--fanout", type=lambda s: [int(k) for k in s.split(",")],
                        default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024,
                        help="seeds per step over all ranks (PyG: per batch)")
    parser.add_argument("--workers", type=int, default=2,
                        help="background sampler workers of the pipelined runs")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--link", "--links", dest="links", nargs="+",
                        default=["loopback", "1gbit,0.1ms"])
    parser.add_argument("--pyg-python", default=pyg_baselines.PYG_PYTHON,
                        help="a Python with torch-sparse for PyG's NeighborLoader "
                             "(default $PYG_ENV/bin/python, .bench/pyg-env: make bench-env)")
    parser.add_argument("--workdir", default="runs/bench_minibatch")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--pyg-baseline", choices=["dist"],
                        help=argparse.SUPPRESS)  # internal: probe PyG's distributed sampler
    args = parser.parse_args()
    if args.pyg_baseline == "dist":
        return pyg_dist_neighbor_loader_error()

    started = time.time()
    data = load_default(osp.join(args.workdir, "data"), num_nodes=args.num_nodes)
    results: Dict[str, Any] = {"partitions": [], "runs": []}
    for parts in args.parts:
        flags = ["--loader", "neighbor", "--fanout", ",".join(map(str, args.fanout)),
                 "--batch-size", str(args.batch_size // parts),
                 "--layers", str(len(args.fanout)), "--seed", str(args.seed)]
        for method in args.methods:
            info = partition(data, args, parts, method)
            results["partitions"].append(info)
            for spec in args.links:
                with network_for(parts, parse_link(spec)) as net:
                    for workers in (0, args.workers):
                        label = "in loop" if workers == 0 else f"{workers} workers"
                        out = osp.join(args.workdir, "runs",
                                       f"{method}{parts}-{spec}-{workers}")
                        rows = run(net, info["root"], out,
                                   flags + ["--loader-workers", str(workers)], args)
                        results["runs"].append({"method": method, "parts": parts,
                                                "link": net.label, "sampling": label,
                                                **summarize(rows)})
                        r = results["runs"][-1]
                        print(f"  {method} x{parts} {net.label} {label}: "
                              f"{r['seeds_per_s']:,.0f} seeds/s, idle "
                              f"{100 * r['trainer_idle_frac']:.1f}%, acc "
                              f"{r['test_acc']:.4f}", flush=True)
                        save(args, [results], started, [])
    results["pyg_neighbor_loader"] = run_pyg_neighbor_loader(args, int(data.train_mask.sum()))
    results["pyg_dist_neighbor_loader"] = pyg_dist_neighbor_loader(args)
    save(args, [results], started, [])
    print("\n" + table(results))
    print(f"\nPyG PartitionNeighborLoader (2.8.1): "
          f"{results['pyg_dist_neighbor_loader'].get('error')}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
