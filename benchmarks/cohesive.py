r"""CM-GCN cohesive mini-batches side by side: what cohesion saves in cost,
what balance and overlap save in waiting, against random batches and PyG's
own mini-batch loaders.

On the embedded default graph (``--num-nodes``), METIS-partitioned once into
``--parts`` parts, this reports:

1. **Cost** (Fig. 6): :math:`J(P) = \sum_B C(B)` of the cohesive batches
   (METIS + greedy refinement, ``pyg_dist.loader.cohesive_batches``)
   against random batches of the same sizes for every ``--costs`` M, the
   seconds batching took, and the per-rank cost imbalance of a batch
   (max/mean over ranks, worst batch) with the nodes' owners computing and
   with the balanced split of ``--balance-batches`` (§III-B, Fig. 7).
2. **Training** (Table III): ``pyg-dist train --loader cohesive`` with M =
   ``--num-batches`` cohesive batches (owners, and balanced), random batches
   (owners, and balanced), each for ``--epochs`` epochs (3-layer GraphSAGE,
   hidden 64): epoch time, halo wait, MB per epoch, test accuracy; and, in a
   Python that has torch-sparse (``--pyg-python``, see ``make bench-env``),
   PyG's ``ClusterLoader`` (ClusterGCN, 4M clusters, 4 per batch) and
   ``NeighborLoader`` (fan-out 10 per layer, M batches) single-process on
   the same graph, model and epochs.
3. **Overlap** (§III-C): full-graph exact epochs with and without
   ``--overlap`` on every ``--link`` (see :mod:`netem`).

Times are means over the epochs after the first (max over ranks). Results
go to ``benchmarks/results/cohesive.json`` (``--out``), saved after every
run; the issue's targets are checked at the end.

Usage::

    python benchmarks/cohesive.py                                  # the full run
    python benchmarks/cohesive.py --num-nodes 20000 --costs 5 10 --epochs 3 \
        --link loopback --out /tmp/cohesive.json                   # a quick one
"""
import argparse
import os.path as osp
import shutil
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import pyg_baselines  # noqa: E402
from common import MiB, RESULTS_DIR, run, save, summarize  # noqa: E402
from netem import network_for, parse_link  # noqa: E402

import pyg_dist  # noqa: E402
from pyg_dist.datasets import load_default  # noqa: E402
from pyg_dist.loader import (CostModel, HopGraph, cohesive_batches,  # noqa: E402
                             random_batches, save_batches)
from pyg_dist.loader.cohesive.balance import save_batch_parts, split_batch  # noqa: E402
from pyg_dist.loader.cohesive.cost import imbalance, rank_costs  # noqa: E402
from pyg_dist.partition import PartitionBook  # noqa: E402

RESULTS = osp.join(RESULTS_DIR, "cohesive.json")


def cost_model(data) -> CostModel:
    return CostModel(dims=[data.num_features, 64, 64, int(data.y.max()) + 1])


def balanced_loads(graph: HopGraph, nodes: torch.Tensor, batch_of: torch.Tensor,
                   owner: torch.Tensor, parts: int) -> List[torch.Tensor]:
    r"""Per batch, the per-rank work of the balanced split (as
    ``save_batch_parts`` computes it, without writing anything)."""
    return [split_batch(graph, nodes[batch_of == b], owner, parts)[3]
            for b in range(int(batch_of.max()) + 1)]


def costs(data, book, parts: int, num_batches: List[int], seed: int,
          made: Dict[int, torch.Tensor]) -> List[Dict[str, Any]]:
    r"""The cost table; the cohesive batches of each M go into :obj:`made`."""
    graph = HopGraph(data.edge_index, data.num_nodes, cost_model(data))
    nodes = data.train_mask.nonzero().view(-1)
    owner = book.owner(book.inv_perm)
    rows = []
    for m in num_batches:
        start = time.perf_counter()
        cohesive = cohesive_batches(graph, data.edge_index, nodes, m, seed=seed)
        seconds = time.perf_counter() - start
        made[m] = cohesive
        rand = random_batches(nodes.numel(), m, seed)
        row = {"M": m, "seconds": seconds,
               "J_cohesive": graph.partition_cost(cohesive, nodes),
               "J_random": graph.partition_cost(rand, nodes)}
        row["reduction"] = 1 - row["J_cohesive"] / row["J_random"]
        for label, assignment in (("cohesive", cohesive), ("random", rand)):
            row[f"imbalance_{label}"] = max(imbalance(rank_costs(
                graph, nodes[assignment == b], owner, parts)) for b in range(m))
            row[f"imbalance_{label}_balanced"] = max(imbalance(load) for load in balanced_loads(
                graph, nodes, assignment, owner, parts))
        print(f"  M={m}: J cohesive {row['J_cohesive']:.4g} vs random {row['J_random']:.4g} "
              f"({100 * row['reduction']:.1f}% less, {seconds:.1f} s); worst batch "
              f"imbalance {row['imbalance_cohesive']:.2f}x (balanced "
              f"{row['imbalance_cohesive_balanced']:.2f}x)", flush=True)
        rows.append(row)
    return rows


VARIANTS = (("cohesive", False), ("cohesive", True), ("random", False), ("random", True))


def batch_roots(workdir: str, parts_root: str, data, book, parts: int, m: int,
                seed: int, made: Dict[int, torch.Tensor],
                variants: Sequence[Tuple[str, bool]] = VARIANTS) -> Dict[str, str]:
    r"""A partition directory per batching of :obj:`variants` ((cohesive or
    random, balanced or not)): the same part files, its own ``batches.pt``
    (and balanced batch parts); cohesive batches already in :obj:`made` are
    reused."""
    graph = HopGraph(data.edge_index, data.num_nodes, cost_model(data))
    nodes = data.train_mask.nonzero().view(-1)
    if m not in made:
        made[m] = cohesive_batches(graph, data.edge_index, nodes, m, seed=seed)
    assignments = {"cohesive": made[m], "random": random_batches(nodes.numel(), m, seed)}
    roots = {}
    for label, balanced in variants:
        assignment = assignments[label]
        root = osp.join(workdir, f"M{m}-{label}{'-balanced' if balanced else ''}")
        if not osp.exists(osp.join(root, "batches.pt")):
            shutil.copytree(parts_root, root, dirs_exist_ok=True)
            batch_of = torch.full((data.num_nodes, ), -1, dtype=torch.long)
            batch_of[nodes] = assignment
            save_batches(root, batch_of)
            if balanced:
                save_batch_parts(root, data, graph, batch_of, book.owner(book.inv_perm),
                                 parts, book.meta["graph_hash"])
        roots[label + (" balanced" if balanced else "")] = root
    return roots


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| run | link | s/epoch | halo wait s | MB/epoch | test acc |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['method']} | - | not run: {r['error']} | | | |")
            continue
        wait = f"{r['time_comm']:.3f}" if r.get("time_comm") is not None else "-"
        mb = f"{r['bytes_sent'] / MiB:.1f}" if r.get("bytes_sent") is not None else "-"
        lines.append(f"| {r['method']} | {r.get('link', '-')} | {r['epoch_time']:.3f} | "
                     f"{wait} | {mb} | {100 * r['test_acc']:.2f} |")
    return "\n".join(lines)


def targets(costs_rows, runs) -> List[str]:
    out = []
    if costs_rows:
        worst = min(r["reduction"] for r in costs_rows)
        out.append(f"cost: cohesive J(P) is {100 * worst:.1f}-"
                   f"{100 * max(r['reduction'] for r in costs_rows):.1f}% below random "
                   f"(target >= 40%): {'met' if worst >= 0.4 else 'NOT met'}")
    by = {r["method"]: r for r in runs if "error" not in r}
    for label in ("cohesive", "cohesive balanced"):
        if label in by and "random" in by:
            speed = by["random"]["epoch_time"] / by[label]["epoch_time"]
            gap = 100 * (by[label]["test_acc"] - by["random"]["test_acc"])
            out.append(f"speed: {label} epochs {speed:.2f}x faster than random batches "
                       f"(target >= 1.5x), accuracy {gap:+.2f} pp: "
                       f"{'met' if speed >= 1.5 and gap > -0.5 else 'NOT met'}")
    for label in ("cohesive", "random"):
        if label in by and f"{label} balanced" in by:
            out.append(f"balance: {label} batches {by[label]['epoch_time']:.3f} -> "
                       f"{by[label + ' balanced']['epoch_time']:.3f} s/epoch balanced")
    for link in {r.get("link") for r in runs if r["method"].startswith("full")}:
        rows = {r["method"]: r for r in runs if r.get("link") == link}
        if "full exact" in rows and "full exact +overlap" in rows:
            a, b = rows["full exact"], rows["full exact +overlap"]
            out.append(f"overlap ({link}): {a['epoch_time']:.3f} -> {b['epoch_time']:.3f} "
                       f"s/epoch, halo wait {a['time_comm']:.3f} -> {b['time_comm']:.3f} s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=None)
    parser.add_argument("--costs", type=int, nargs="*", default=[5, 10, 20, 100])
    parser.add_argument("--num-batches", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--link", "--links", dest="links", nargs="+",
                        default=["loopback", "1gbit,0.1ms"])
    parser.add_argument("--pyg-python", default="/work/bench-env/bin/python",
                        help="a Python with torch-sparse for the PyG loaders "
                             "(skipped when missing)")
    parser.add_argument("--workdir", default="runs/bench_cohesive")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    args.fanout = [10, 10, 10]  # PyG NeighborLoader's, one per layer

    started = time.time()
    data = load_default(osp.join(args.workdir, "data"),
                        **({"num_nodes": args.num_nodes} if args.num_nodes else {}))
    parts_root = osp.join(args.workdir, f"parts{args.parts}")
    if not osp.exists(osp.join(parts_root, "meta.json")):
        pyg_dist.partition_graph(data, args.parts, root=parts_root)
    book = PartitionBook.load(parts_root)
    results: Dict[str, Any] = {"costs": [], "runs": []}

    def checkpoint():
        save(args, [results], started, targets(results["costs"], results["runs"]))

    print("cost of the batches (J(P), Eq. 14):", flush=True)
    made: Dict[int, torch.Tensor] = {}  # cohesive batches per M, computed once
    results["costs"] = costs(data, book, args.parts, args.costs, args.seed, made)
    checkpoint()

    roots = batch_roots(args.workdir, parts_root, data, book, args.parts, args.num_batches,
                        args.seed, made)
    with network_for(args.parts, parse_link("loopback")) as net:
        for label, root in roots.items():
            out = osp.join(args.workdir, "runs", f"M{args.num_batches}-{label}")
            rows = run(net, root, out, ["--loader", "cohesive", "--seed", str(args.seed)],
                       args)
            results["runs"].append({"method": label, "link": net.label, **summarize(rows)})
            print(f"  {label}: {results['runs'][-1]['epoch_time']:.3f} s/epoch, "
                  f"acc {results['runs'][-1]['test_acc']:.4f}", flush=True)
            checkpoint()
    for kind in ("cluster", "neighbor"):
        try:
            row = summarize(pyg_baselines.run(args.pyg_python, kind, args, args.seed))
        except RuntimeError as e:
            row = {"error": str(e)}
        results["runs"].append({"method": f"PyG {kind}", "link": "single process", **row})
        print(f"  PyG {kind}: {row}", flush=True)
        checkpoint()
    for spec in args.links:
        with network_for(args.parts, parse_link(spec)) as net:
            for method, flags in (("full exact", []), ("full exact +overlap", ["--overlap"])):
                out = osp.join(args.workdir, "runs", f"{method}-{spec}".replace(" ", "_"))
                rows = run(net, parts_root, out, flags + ["--seed", str(args.seed)], args)
                results["runs"].append({"method": method, "link": net.label,
                                        **summarize(rows)})
                print(f"  {method} {net.label}: {results['runs'][-1]['epoch_time']:.3f} "
                      f"s/epoch, wait {results['runs'][-1]['time_comm']:.3f} s", flush=True)
                checkpoint()
    print("\n" + table(results["runs"]) + "\n")
    print("\n".join(targets(results["costs"], results["runs"])))
    checkpoint()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
