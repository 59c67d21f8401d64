r"""How do partitioning, epoch time and memory grow?

Generated community graphs (:func:`pyg_dist.datasets.synthetic_communities`,
communities of 500 nodes, a fixed average in-degree of 20) are partitioned
with METIS and trained for a few epochs (3-layer GraphSAGE, hidden 64,
evaluation in the last epoch only; the first epoch is a warm-up):

1. **graph size** (``--sizes``, default 50K to 1M nodes) with ``--ranks``
   ranks (default 2): generation and partitioning time (METIS, relabelling
   and writing the parts), epoch time, peak memory of every rank;
2. **number of partitions** (``--parts``, default 1 2 4 8) on one graph of
   ``--parts-nodes`` nodes.

Every step runs in a fresh process (its own peak RSS). A least-squares line
through the log-log points gives the growth exponent :math:`b` of
:math:`t \propto |E|^b` (partitioning, epochs) and of memory per rank. The
target of the suite is 1M nodes / 20M edges partitioned in under 60 s.
Writes ``results/scaling.json`` and ``results/scaling.png``; prints a table.

On a machine with fewer cores than ranks, ranks share the cores: the
partition sweep then shows the overhead of more ranks, not a speed-up.

Usage::

    python benchmarks/scaling.py                     # full sweep (~10 min on 2 cores)
    python benchmarks/scaling.py --sizes 20000 50000 --parts 1 2 --parts-nodes 20000
"""
import argparse
import datetime
import json
import os
import os.path as osp
import platform
import sys
import tempfile
import time
from typing import Any, Dict, List, Sequence

import numpy as np
import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from overhead import isolated, run_dist  # noqa: E402

from pyg_dist.train import TrainConfig  # noqa: E402

MiB = 2**20
RESULTS = osp.join(osp.dirname(osp.abspath(__file__)), "results")
AVG_DEGREE = 20


def make_parts(num_nodes: int, num_parts: int, root: str) -> Dict[str, float]:
    r"""Generates the graph and partitions it into :obj:`root` (timed apart)."""
    from pyg_dist import partition_graph
    from pyg_dist.datasets import synthetic_communities
    torch.set_num_threads(os.cpu_count() or 1)
    start = time.perf_counter()
    data = synthetic_communities(num_nodes=num_nodes, avg_degree=AVG_DEGREE,
                                 num_communities=max(num_nodes // 500, 2))
    generated = time.perf_counter()
    partition_graph(data, num_parts, root=root)
    return {"num_nodes": num_nodes, "num_edges": int(data.num_edges),
            "generate_s": generated - start, "partition_s": time.perf_counter() - generated}


def measure(num_nodes: int, num_parts: int, epochs: int, workdir: str) -> Dict[str, Any]:
    root = osp.join(workdir, f"parts_{num_nodes}_{num_parts}")
    graph, _ = isolated(make_parts, num_nodes, num_parts, root)
    config = TrainConfig(epochs=epochs, eval_every=epochs, progress=False, overwrite=True)
    history, load = isolated(run_dist, root, config, osp.join(root, "run"), num_parts)
    timed = history[1:] or history
    per_rank = [max(r["peak_mem_per_rank"][i] for r in history) / MiB
                for i in range(num_parts)]
    print(f"  {num_nodes:>9,} nodes {graph['num_edges']:>11,} edges {num_parts} parts: "
          f"partition {graph['partition_s']:.1f} s, epoch "
          f"{np.mean([r['time'] for r in timed]):.2f} s, peak {max(per_rank):.0f} MiB/rank",
          flush=True)
    return {**graph, "ranks": num_parts,
            "epoch_time": float(np.mean([r["time"] for r in timed])),
            "time_comm": float(np.mean([r["time_comm"] for r in timed])),
            "peak_mem_mib_per_rank": per_rank, "test_acc": history[-1]["test_acc"],
            "epoch_times": [r["time"] for r in history], "load_avg_before_after": load}


def exponent(x: Sequence[float], y: Sequence[float]) -> float:
    r"""The slope of the least-squares line through :math:`(\log x, \log y)`."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0]) if len(x) > 1 else float("nan")


def plot(sizes: List[Dict[str, Any]], parts: List[Dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    edges = [r["num_edges"] for r in sizes]
    for ax, key, label in ((axes[0], "partition_s", "partitioning (s)"),
                           (axes[1], "epoch_time", "epoch time (s)")):
        values = [r[key] for r in sizes]
        ax.loglog(edges, values, "o-", label=f"measured (exponent {exponent(edges, values):.2f})")
        ax.set(xlabel="edges", ylabel=label, title=f"{label} vs graph size")
        ax.legend()
    axes[0].axhline(60, color="grey", ls="--", lw=0.8)
    memory = [max(r["peak_mem_mib_per_rank"]) for r in sizes]
    axes[2].loglog(edges, memory, "o-",
                   label=f"max over ranks (exponent {exponent(edges, memory):.2f})")
    axes[2].set(xlabel="edges", ylabel="peak memory per rank (MiB)", title="memory vs size")
    axes[2].legend()
    ranks = [r["ranks"] for r in parts]
    axes[3].plot(ranks, [r["epoch_time"] for r in parts], "o-", label="epoch time (s)")
    twin = axes[3].twinx()
    twin.plot(ranks, [max(r["peak_mem_mib_per_rank"]) for r in parts], "s--", color="C1",
              label="peak MiB per rank (max)")
    axes[3].set(xlabel="partitions (ranks)", ylabel="epoch time (s)",
                title=f"{parts[0]['num_nodes']:,} nodes vs partitions" if parts else "")
    twin.set_ylabel("peak memory per rank (MiB)")
    axes[3].legend(loc="upper left")
    twin.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(rows: List[Dict[str, Any]]) -> str:
    lines = ["| nodes | edges | ranks | generate s | partition s | epoch s | halo wait s "
             "| peak MiB/rank (max) | test acc |", "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['num_nodes']:,} | {r['num_edges']:,} | {r['ranks']} | "
                     f"{r['generate_s']:.1f} | {r['partition_s']:.1f} | {r['epoch_time']:.2f} | "
                     f"{r['time_comm']:.2f} | {max(r['peak_mem_mib_per_rank']):.0f} | "
                     f"{r['test_acc']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[50_000, 100_000, 200_000, 500_000, 1_000_000])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--parts", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--parts-nodes", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="pyg_dist_scaling_")
    print(f"graph size ({args.ranks} ranks):")
    sizes = [measure(n, args.ranks, args.epochs, workdir) for n in args.sizes]
    print(f"partitions ({args.parts_nodes:,} nodes):")
    parts = [measure(args.parts_nodes, k, args.epochs, workdir) for k in args.parts]
    edges = [r["num_edges"] for r in sizes]
    fits = {"partition_s_vs_edges": exponent(edges, [r["partition_s"] for r in sizes]),
            "epoch_time_vs_edges": exponent(edges, [r["epoch_time"] for r in sizes]),
            "peak_mem_vs_edges": exponent(edges, [max(r["peak_mem_mib_per_rank"])
                                                  for r in sizes])}
    print(markdown(sizes + parts))
    print("growth exponents (t ~ |E|^b): " + ", ".join(f"{k} {v:.2f}" for k, v in fits.items()))
    os.makedirs(args.out, exist_ok=True)
    plot(sizes, parts, osp.join(args.out, "scaling.png"))
    with open(osp.join(args.out, "scaling.json"), "w") as f:
        json.dump({"date": datetime.date.today().isoformat(),
                   "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                               "torch": torch.__version__},
                   "command": " ".join(sys.argv), "avg_degree": AVG_DEGREE,
                   "sizes": sizes, "parts": parts, "exponents": fits}, f, indent=1)
    print(f"wrote {args.out}/scaling.json and scaling.png")


if __name__ == "__main__":
    main()
