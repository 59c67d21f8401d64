r"""What the checksums of partition files cost at load time.

Partitions the embedded default graph (1M nodes unless ``--num-nodes``) into
``--parts`` METIS parts, then loads every part with
:meth:`pyg_dist.DistData.load` twice per repetition: as written (size and
CRC32 checked against ``meta.json``, tensors validated) and with the
checksums left out of ``meta.json`` (as for a partitioning written before
them). Reports the fastest of ``--repeats`` loads per part and the ratio.

Usage::

    python benchmarks/integrity.py                     # 1M nodes, 4 parts
    python benchmarks/integrity.py --num-nodes 100000
"""
import argparse
import json
import os
import os.path as osp
import tempfile
import time

import pyg_dist
from pyg_dist.datasets import load_default
from pyg_dist.partition.book import read_meta

RESULTS = osp.join(osp.dirname(osp.abspath(__file__)), "results", "integrity.json")


def _fastest_load(root: str, rank: int, parts: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        pyg_dist.DistData.load(root, rank, world_size=parts)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    data = load_default(num_nodes=args.num_nodes)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        checked, unchecked = osp.join(workdir, "checked"), osp.join(workdir, "unchecked")
        pyg_dist.partition_graph(data, args.parts, root=checked)
        pyg_dist.partition_graph(data, args.parts, root=unchecked)
        meta = read_meta(unchecked)
        del meta["files"]
        with open(osp.join(unchecked, "meta.json"), "w") as f:
            json.dump(meta, f)
        for rank in range(args.parts):
            size = os.path.getsize(osp.join(checked, f"part_{rank}.pt"))
            with_sums = _fastest_load(checked, rank, args.parts, args.repeats)
            without = _fastest_load(unchecked, rank, args.parts, args.repeats)
            rows.append({"part": rank, "mib": size / 2**20, "load_s": with_sums,
                         "load_unchecked_s": without, "ratio": with_sums / without})
    print(f"{args.num_nodes:,} nodes, {data.num_edges:,} edges, {args.parts} parts; "
          f"fastest of {args.repeats} loads")
    print("| part | MiB | load s (checked) | load s (no checksums) | ratio |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['part']} | {r['mib']:.0f} | {r['load_s']:.3f} | "
              f"{r['load_unchecked_s']:.3f} | {r['ratio']:.3f} |")
    total = sum(r["load_s"] for r in rows) / sum(r["load_unchecked_s"] for r in rows)
    print(f"all parts: {total:.3f}x the load time without checksums")
    os.makedirs(osp.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "num_edges": int(data.num_edges), "parts": rows,
                   "ratio": total}, f, indent=1)


if __name__ == "__main__":
    main()
