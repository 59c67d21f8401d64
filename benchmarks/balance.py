r"""What balancing in-edges and masks beside nodes costs and buys.

On an R-MAT graph (``pyg-dist rmat --scale S``, edge factor 16) each
``--parts`` count is partitioned from disk with ``pyg-dist partition --from``
twice: with the default balance (nodes, in-edges, masks) and with
``--balance none`` (nodes only), each command in its own process (wall time,
peak resident set of it and its children from ``wait4``). For each, the
largest part over the mean part of inner nodes, halo rows, inner + halo
rows and in-edges, the edge cut and the halo rows per layer are recorded;
with ``--train``, two full-graph epochs (defaults, one rank per part, on
this machine) give the slowest rank's epoch time (``time`` of the second
epoch, the maximum over ranks) and every rank's peak memory.

``--in-memory-scale`` partitions a generated R-MAT graph in memory with
METIS and KaMinPar, default balance and nodes only, the same way.

Usage::

    python benchmarks/balance.py                          # 2^20, 4 and 8 parts, training
    python benchmarks/balance.py --scale 17 --no-train    # a minute
"""
import argparse
import json
import os
import os.path as osp
import sys
import tempfile
import time
from typing import Any, Dict, List

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from common import RESULTS_DIR, machine, portable  # noqa: E402
from out_of_core import measured  # noqa: E402

CLI = [sys.executable, "-m", "pyg_dist.cli"]
BALANCES = {"default": [], "nodes only": ["--balance", "none"]}


def _shape(meta: Dict[str, Any]) -> Dict[str, Any]:
    r"""What a partitioning's ``meta.json`` says of its balance and cut."""
    return {"imbalance": meta.get("imbalance"), "edge_cut_ratio": meta["edge_cut_ratio"],
            "halo_rows_per_node": meta["comm_volume"] / meta["num_nodes"]}


def from_disk(folder: str, parts: int, work: str, train: bool) -> List[Dict[str, Any]]:
    rows = []
    for name, flags in BALANCES.items():
        root = osp.join(work, f"parts{parts}_{name.replace(' ', '_')}")
        run, _ = measured([*CLI, "partition", "--from", folder, "--num-parts", str(parts),
                           "--root", root, *flags], root + ".log")
        row = {"graph": osp.basename(folder), "parts": parts, "balance": name,
               "partition_seconds": run["seconds"], "partition_peak_rss_gib":
               run["peak_rss_gib"], **_shape(json.load(open(osp.join(root, "meta.json"))))}
        if train:
            out = root + "_run"
            trained, _ = measured([*CLI, "train", "--root", root, "--out", out, "--epochs",
                                   "2", "--eval-every", "0", "--no-progress", "--no-plots"],
                                  out + ".log")
            if trained.get("error") is None and osp.exists(osp.join(out, "metrics.jsonl")):
                last = [json.loads(line) for line in open(osp.join(out, "metrics.jsonl"))][-1]
                row.update(epoch_seconds_slowest_rank=last["time"],
                           peak_mem_gib_per_rank=[b / 2**30 for b in last["peak_mem_per_rank"]])
            else:
                row["train_error"] = trained.get("error")
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def in_memory(scale: int, parts: int) -> List[Dict[str, Any]]:
    import pyg_dist
    from pyg_dist.datasets.regime import rmat
    graph = rmat(scale=scale, edge_factor=16, seed=0)
    rows = []
    for method in ("metis", "kaminpar"):
        for name, balance in (("default", None), ("nodes only", ())):
            start = time.perf_counter()
            book = pyg_dist.partition_graph(graph, parts, method=method, balance=balance)
            from pyg_dist.partition.book import part_imbalance
            row = {"graph": f"rmat-{scale} in memory ({method})", "parts": parts,
                   "balance": name, "partition_seconds": time.perf_counter() - start,
                   **_shape({**book.meta, "imbalance": part_imbalance(book.meta["parts"])})}
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def _line(row: Dict[str, Any]) -> str:
    ratio = row["imbalance"]
    text = (f"{row['graph']:>28} {row['parts']:>3} {row['balance']:>11}  inner "
            f"{ratio['num_inner']:.3f}  edges {ratio['num_edges']:.3f}  rows "
            f"{ratio['num_rows']:.3f}  cut {row['edge_cut_ratio']:.3f}  halo/node "
            f"{row['halo_rows_per_node']:.3f}  {row['partition_seconds']:.1f} s")
    if "partition_peak_rss_gib" in row:
        text += f" {row['partition_peak_rss_gib']:.2f} GiB"
    if "epoch_seconds_slowest_rank" in row:
        text += (f"  epoch {row['epoch_seconds_slowest_rank']:.2f} s, peak "
                 f"{max(row['peak_mem_gib_per_rank']):.2f} GiB max")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=int, default=20)
    parser.add_argument("--parts", default="4,8")
    parser.add_argument("--in-memory-scale", type=int, default=17)
    parser.add_argument("--no-train", dest="train", action="store_false")
    parser.add_argument("--work", default=None, help="folder for the graph and the parts "
                        "(default: a temporary one, removed)")
    parser.add_argument("--out", default=osp.join(RESULTS_DIR, "balance.json"))
    args = parser.parse_args()
    parts = [int(p) for p in args.parts.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or scratch
        folder = osp.join(work, f"rmat{args.scale}")
        if not osp.exists(osp.join(folder, "graph.json")):
            measured([*CLI, "rmat", "--scale", str(args.scale), "--out", folder],
                     folder + ".log")
        rows = [row for k in parts for row in from_disk(folder, k, work, args.train)]
    rows += [row for k in parts for row in in_memory(args.in_memory_scale, k)]
    os.makedirs(osp.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(portable({"machine": machine(), "rows": rows}), f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
