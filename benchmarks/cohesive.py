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
   with the balanced split of ``--balance-batches`` (§III-B, Fig. 7), by
   both rules (``owner``: today's owner-first; ``greedy``: CM-GCN's, every
   node in BFS order to the least loaded rank): worst and mean imbalance,
   computing nodes moved off their owner, and the halo rows the split
   exchanges (modelled: the (row, reading rank) pairs of every layer).
   The cost model's constants are measured first
   (``CostModel.calibrate`` for the trained 3-layer GraphSAGE, with a
   training rank's threads) and reported.
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
4. **Model against measurement** (``timing``): for every ``--timing`` M,
   cohesive and random batches trained by ``--parts`` spawned ranks
   (loopback, GraphSAGE as above, ``--timing-epochs``, the first not
   timed; all runs in one process group, their epochs interleaved), each
   step timed from a barrier: the measured epoch time and
   halo bytes beside the modelled :math:`J(P)` and
   :math:`\sum_B \max_r C_r(B)` (the slowest rank per batch), and the
   rank correlation (Spearman) of modelled :math:`C(B)` and measured
   batch seconds; for M = ``--num-batches`` also both balance rules.

``--sections`` picks which of ``cost``, ``training`` (2), ``overlap`` (3)
and ``timing`` (4) run (default: all).

Times are means over the epochs after the first (max over ranks). Results
go to ``benchmarks/results/cohesive.json`` (``--out``), saved after every
run; the targets are checked at the end.

Usage::

    python benchmarks/cohesive.py                                  # the full run
    python benchmarks/cohesive.py --num-nodes 20000 --costs 5 10 --epochs 3 \
        --link loopback --out runs/cohesive.json                   # a quick one
    python benchmarks/cohesive.py --sections cost timing \
        --out benchmarks/results/cohesive_cost.json                # the cost model
"""
import argparse
import os.path as osp
import shutil
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from scipy.stats import spearmanr
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import pyg_baselines  # noqa: E402
from common import MiB, RESULTS_DIR, run, save, summarize  # noqa: E402
from netem import network_for, parse_link  # noqa: E402

import pyg_dist  # noqa: E402
from pyg_dist.datasets import load_default  # noqa: E402
from pyg_dist.distributed import rank_threads  # noqa: E402
from pyg_dist.loader import (CohesiveBatchLoader, CostModel, HopGraph,  # noqa: E402
                             cohesive_batches, load_batches,
                             random_batches, save_batches)
from pyg_dist.loader.cohesive.balance import save_batch_parts, split_batch  # noqa: E402
from pyg_dist.loader.cohesive.cost import imbalance, rank_costs  # noqa: E402
from pyg_dist.partition import PartitionBook  # noqa: E402

RESULTS = osp.join(RESULTS_DIR, "cohesive.json")
SECTIONS = ("cost", "training", "overlap", "timing")


_CALIBRATED: Dict[Tuple, CostModel] = {}
RULES = ("owner", "greedy")


def cost_model(data, hidden: int = 64, parts: int = 2,
               constants: Optional[str] = None) -> CostModel:
    r"""CM-GCN's cost model of the runs' 3-layer GraphSAGE of width
    :obj:`hidden`: the constants of the file :obj:`constants`
    (``pyg-dist calibrate --out``), else measured once per process
    (:meth:`CostModel.calibrate` on the graph's mean in-degree) with the
    threads of one of :obj:`parts` local training ranks."""
    dims = [data.num_features, hidden, hidden, int(data.y.max()) + 1]
    key = (tuple(dims), parts)
    if constants is not None:
        _CALIBRATED[key] = CostModel.load(constants, dims)
    if key not in _CALIBRATED:
        _CALIBRATED[key] = CostModel.calibrate(dims, model="sage", threads=rank_threads(parts),
                                               degree=data.num_edges / data.num_nodes)
    return _CALIBRATED[key]


def balanced_loads(graph: HopGraph, nodes: torch.Tensor, batch_of: torch.Tensor,
                   owner: torch.Tensor, parts: int, rule: str = "owner") -> List[torch.Tensor]:
    r"""Per batch, the per-rank work of the balanced split by :obj:`rule`
    (as ``save_batch_parts`` computes it, without writing anything)."""
    return [split_batch(graph, nodes[batch_of == b], owner, parts, rule=rule)[3]
            for b in range(int(batch_of.max()) + 1)]


def split_stats(graph: HopGraph, batch: torch.Tensor, owner: torch.Tensor, parts: int,
                rule: Optional[str]) -> Tuple[torch.Tensor, int, int]:
    r"""One batch's per-rank work, its computing nodes moved off their owner
    and its modelled halo rows: per layer, the distinct (row, reading rank)
    pairs its targets read from another rank; on the owners
    (:obj:`rule` ``None``) or split by :obj:`rule`."""
    if rule is None:
        load = rank_costs(graph, batch, owner, parts)
        where, moved = owner, 0
    else:
        nodes, work, rank, load = split_batch(graph, batch, owner, parts, rule=rule)
        moved = int(((rank != owner[nodes]) & (work > 0)).sum())
        where = torch.full((graph.num_nodes, ), -1, dtype=torch.long)
        where[nodes] = rank
    rows = 0
    for reach in graph.hops(batch):  # the targets of one layer
        keep = reach[graph.dst]
        src, dst = graph.src[keep], graph.dst[keep]
        cross = where[src] != where[dst]
        rows += torch.unique(src[cross] * parts + where[dst][cross]).numel()
    return load, moved, rows


def rule_columns(graph: HopGraph, nodes: torch.Tensor, assignment: torch.Tensor,
                 owner: torch.Tensor, parts: int, label: str) -> Dict[str, Any]:
    r"""The cost-table columns of one batching: per placement (owners, and
    each balance rule) the worst and mean per-rank imbalance of a batch,
    the nodes moved off their owners and the halo rows, summed over the
    batches."""
    out: Dict[str, Any] = {}
    for rule in (None, ) + RULES:
        stats = [split_stats(graph, nodes[assignment == b], owner, parts, rule)
                 for b in range(int(assignment.max()) + 1)]
        name = label if rule is None else f"{label}_{rule}"
        ratios = [imbalance(load) for load, _, _ in stats]
        out[f"imbalance_{name}_mean"] = statistics.fmean(ratios)
        out[f"halo_rows_{name}"] = sum(rows for _, _, rows in stats)
        if rule is not None:
            out[f"imbalance_{name}"] = max(ratios)
            out[f"moved_rows_{name}"] = sum(moved for _, moved, _ in stats)
    return out


def costs(data, book, parts: int, num_batches: List[int], seed: int,
          made: Dict[int, torch.Tensor], hidden: int = 64,
          placeholder: bool = False) -> List[Dict[str, Any]]:
    r"""The cost table (:math:`J` in modelled seconds, :func:`cost_model`);
    the cohesive batches of each M go into :obj:`made`. With
    :obj:`placeholder`, also the :math:`J` (same constants) of the batches
    that minimise the placeholder constants (every constant
    :math:`10^{-9}`: what the batching optimised before calibration)."""
    graph = HopGraph(data.edge_index, data.num_nodes, cost_model(data, hidden, parts))
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
        if placeholder:
            flat = HopGraph(data.edge_index, data.num_nodes,
                            CostModel(dims=list(graph.cost.dims)))
            start = time.perf_counter()
            old = cohesive_batches(flat, data.edge_index, nodes, m, seed=seed)
            row["seconds_placeholder"] = time.perf_counter() - start
            row["J_placeholder_batches"] = graph.partition_cost(old, nodes)
            row["placeholder_excess"] = row["J_placeholder_batches"] / row["J_cohesive"] - 1
            print(f"  M={m}: the placeholder constants' batches cost "
                  f"{row['J_placeholder_batches']:.4g} s ({100 * row['placeholder_excess']:+.1f}%"
                  f" against the calibrated batches)", flush=True)
        for label, assignment in (("cohesive", cohesive), ("random", rand)):
            row[f"imbalance_{label}"] = max(imbalance(rank_costs(
                graph, nodes[assignment == b], owner, parts)) for b in range(m))
            row.update(rule_columns(graph, nodes, assignment, owner, parts, label))
            row[f"imbalance_{label}_balanced"] = row[f"imbalance_{label}_owner"]
        print(f"  M={m}: J cohesive {row['J_cohesive']:.4g} s vs random {row['J_random']:.4g} s "
              f"({100 * row['reduction']:.1f}% less, {seconds:.1f} s); worst batch "
              f"imbalance {row['imbalance_cohesive']:.2f}x (balanced: owner rule "
              f"{row['imbalance_cohesive_owner']:.2f}x, greedy "
              f"{row['imbalance_cohesive_greedy']:.2f}x; halo rows "
              f"{row['halo_rows_cohesive']} on owners, {row['halo_rows_cohesive_owner']} owner "
              f"rule, {row['halo_rows_cohesive_greedy']} greedy)", flush=True)
        rows.append(row)
    return rows


VARIANTS = (("cohesive", False), ("cohesive", True), ("random", False), ("random", True))


def batch_roots(workdir: str, parts_root: str, data, book, parts: int, m: int,
                seed: int, made: Dict[int, torch.Tensor],
                variants: Sequence[Tuple[str, Union[bool, str]]] = VARIANTS,
                hidden: int = 64) -> Dict[str, str]:
    r"""A partition directory per batching of :obj:`variants` ((cohesive or
    random, balanced or not, or the balance rule)): the same part files,
    its own ``batches.pt`` with the cost model (and balanced batch parts;
    ``True`` is the owner rule); cohesive batches already in :obj:`made`
    are reused, and a directory holding other batches is rewritten."""
    cost = cost_model(data, hidden, parts)
    graph = HopGraph(data.edge_index, data.num_nodes, cost)
    nodes = data.train_mask.nonzero().view(-1)
    if m not in made:
        made[m] = cohesive_batches(graph, data.edge_index, nodes, m, seed=seed)
    assignments = {"cohesive": made[m], "random": random_batches(nodes.numel(), m, seed)}
    roots = {}
    for label, balanced in variants:
        assignment = assignments[label]
        rule = "owner" if balanced is True else balanced or None
        suffix = {None: "", "owner": "-balanced", "greedy": "-greedy"}[rule]
        root = osp.join(workdir, f"M{m}-{label}{suffix}")
        batch_of = torch.full((data.num_nodes, ), -1, dtype=torch.long)
        batch_of[nodes] = assignment
        if not osp.exists(osp.join(root, "batches.pt")) or not torch.equal(
                load_batches(root), batch_of):
            shutil.copytree(parts_root, root, dirs_exist_ok=True)
            save_batches(root, batch_of, cost)
            if rule is not None:
                save_batch_parts(root, data, graph, batch_of, book.owner(book.inv_perm),
                                 parts, book.meta["graph_hash"], rule=rule)
        roots[label + {None: "", "owner": " balanced", "greedy": " greedy"}[rule]] = root
    return roots


def batch_times(roots: List[Tuple[str, bool]], hidden: int, epochs: int, seed: int):
    r"""One rank's training on the stored batches of each of :obj:`roots`
    (``(root, balanced)``; 3-layer GraphSAGE as ``pyg-dist train`` builds
    it, Adam, synchronous SGD per batch), their epochs interleaved (epoch
    :math:`e` of every root, then epoch :math:`e + 1`) so that load from
    other processes falls on all alike. Per root: per batch, the seconds of
    its step in every epoch, each timed from a barrier; and the halo bytes
    this rank sent per epoch."""
    from pyg_dist.config import TrainConfig, build_model, num_classes_of
    from pyg_dist.train import batch_loss
    config = TrainConfig(hidden=hidden, seed=seed)
    runs = []
    for root, balanced in roots:
        part = pyg_dist.DistData.load(root, dist.get_rank())
        classes = torch.tensor([num_classes_of(part.y)])
        dist.all_reduce(classes, op=dist.ReduceOp.MAX)
        model = pyg_dist.nn.distribute(build_model(config, part.num_features, int(classes)),
                                       part)
        loader = CohesiveBatchLoader(part, load_batches(root), config.num_layers, seed=seed,
                                     stats=model.comm_stats,
                                     balanced_root=root if balanced else None)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
        runs.append((model, loader, params, optimizer, {"times": {}, "bytes_sent": []}))
    for _ in range(epochs):
        for model, loader, params, optimizer, out in runs:
            ctx, stats = model.dist_context, model.comm_stats
            stats.reset()
            for batch in loader:  # the first epoch also builds each batch's graph
                dist.barrier()
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                model.train()
                with ctx.use(batch.plans):
                    batch_loss(model(batch.x, batch.adj_t), batch).backward()
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                flat = _flatten_dense_tensors(grads)
                dist.all_reduce(flat)
                for p, g in zip(params, _unflatten_dense_tensors(flat, grads)):
                    p.grad = g
                optimizer.step()
                out["times"].setdefault(batch.extra["index"], []).append(
                    time.perf_counter() - start)
            out["bytes_sent"].append(stats.total_bytes_sent)
    return [out for *_, out in runs]


def timing(args, data, book, parts_root: str, made: Dict[int, torch.Tensor]
           ) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    r"""Section 4: per ``--timing`` M, cohesive and random batches on the
    owners (and for M = ``--num-batches`` both balance rules), all trained
    by one set of spawned ranks with their epochs interleaved
    (:func:`batch_times`); per run the measured epoch time (mean over the
    timed epochs of the per-batch seconds, max over ranks, summed), halo MB
    per epoch, the modelled :math:`J(P)` and :math:`\sum_B \max_r C_r(B)`,
    and per batch the modelled and measured seconds with their Spearman
    correlation. Returns the runs and the agreement over all runs: Spearman
    correlations, and the least-squares fit
    :math:`t \approx a M + b \sum_B \max_r C_r(B)` of the epoch times
    (:math:`a`: seconds per batch the model leaves out)."""
    graph = HopGraph(data.edge_index, data.num_nodes, cost_model(data, args.hidden, args.parts))
    owner = book.owner(book.inv_perm)
    plan = []  # (M, label, rule, name, root)
    for m in args.timing:
        variants = [("cohesive", False), ("random", False)]
        if m == args.num_batches:
            variants += [(label, rule) for rule in RULES for label in ("cohesive", "random")]
        roots = batch_roots(args.workdir, parts_root, data, book, args.parts, m, args.seed,
                            made, variants, args.hidden)
        plan += [(m, label, rule, name, root)
                 for (label, rule), (name, root) in zip(variants, roots.items())]
    print(f"  {len(plan)} runs, {args.timing_epochs} epochs each, interleaved", flush=True)
    ranks = pyg_dist.spawn(batch_times, args.parts, ([(root, bool(rule)) for *_, rule, _, root
                                                      in plan], args.hidden,
                                                     args.timing_epochs, args.seed),
                           timeout=args.timeout)
    runs = []
    for i, (m, label, rule, name, root) in enumerate(plan):
        batch_of = load_batches(root)
        per_batch = []
        for b in range(m):
            batch = (batch_of == b).nonzero().view(-1)
            if rule:
                load = split_batch(graph, batch, owner, args.parts, rule=rule)[3]
            else:
                load = rank_costs(graph, batch, owner, args.parts)
            seconds = [max(r[i]["times"][b][e] for r in ranks)
                       for e in range(1, args.timing_epochs)]
            per_batch.append({"C": float(load.sum()), "max_rank": float(load.max()),
                              "seconds": statistics.fmean(seconds)})
        run_row = {"M": m, "batches": label, "balance": rule or "none", "method": name,
                   "epoch_time": sum(b["seconds"] for b in per_batch),
                   "J": sum(b["C"] for b in per_batch),
                   "J_max_rank": sum(b["max_rank"] for b in per_batch),
                   "bytes_sent": statistics.fmean(
                       sum(r[i]["bytes_sent"][e] for r in ranks)
                       for e in range(1, args.timing_epochs)),
                   "per_batch": per_batch}
        if m > 2:
            run_row["spearman_C"] = _spearman([b["C"] for b in per_batch],
                                              [b["seconds"] for b in per_batch])
            run_row["spearman_max_rank"] = _spearman(
                [b["max_rank"] for b in per_batch], [b["seconds"] for b in per_batch])
        runs.append(run_row)
        print(f"  M={m} {name}: {run_row['epoch_time']:.3f} s/epoch measured, J(P) "
              f"{run_row['J']:.3f} s, sum of slowest ranks {run_row['J_max_rank']:.3f} s "
              f"modelled; {run_row['bytes_sent'] / MiB:.1f} MB/epoch; per batch Spearman "
              f"{run_row.get('spearman_C', float('nan')):.2f} (C), "
              f"{run_row.get('spearman_max_rank', float('nan')):.2f} (slowest rank)",
              flush=True)
    plain = [r for r in runs if r["balance"] == "none"]
    pooled = [b for r in plain for b in r["per_batch"]]
    design = torch.tensor([[r["M"], r["J_max_rank"]] for r in runs], dtype=torch.double)
    measured = torch.tensor([r["epoch_time"] for r in runs], dtype=torch.double)
    fit = torch.linalg.lstsq(design, measured.unsqueeze(1)).solution.view(-1)
    residual = measured - design @ fit
    summary = {
        "spearman_runs_J": _spearman([r["J"] for r in runs], [r["epoch_time"] for r in runs]),
        "spearman_runs_J_max_rank": _spearman([r["J_max_rank"] for r in runs],
                                              [r["epoch_time"] for r in runs]),
        "spearman_batches_C": _spearman([b["C"] for b in pooled],
                                        [b["seconds"] for b in pooled]),
        "spearman_batches_max_rank": _spearman([b["max_rank"] for b in pooled],
                                               [b["seconds"] for b in pooled]),
        "seconds_per_modelled_second": statistics.fmean(
            r["epoch_time"] / r["J_max_rank"] for r in runs),
        "fit_seconds_per_batch": float(fit[0]), "fit_scale": float(fit[1]),
        "fit_r2": float(1 - (residual ** 2).sum() / ((measured - measured.mean()) ** 2).sum()),
    }
    return runs, summary


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    return float(spearmanr(a, b).statistic) if len(a) > 2 else float("nan")


def timing_table(runs: List[Dict[str, Any]]) -> str:
    lines = ["| M | batches | balance | measured s/epoch | modelled J(P) s | modelled "
             "sum of slowest ranks s | halo MB/epoch | Spearman C(B) vs batch s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        rho = f"{r['spearman_C']:.2f}" if "spearman_C" in r else "-"
        lines.append(f"| {r['M']} | {r['batches']} | {r['balance']} | {r['epoch_time']:.3f} | "
                     f"{r['J']:.3f} | {r['J_max_rank']:.3f} | {r['bytes_sent'] / MiB:.1f} | "
                     f"{rho} |")
    return "\n".join(lines)


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


def targets(costs_rows, runs, timing_runs: Sequence[Dict[str, Any]] = (),
            agreement: Optional[Dict[str, Any]] = None) -> List[str]:
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
    return out + model_lines(timing_runs, agreement)


def model_lines(runs: Sequence[Dict[str, Any]],
                agreement: Optional[Dict[str, Any]]) -> List[str]:
    r"""Whether the calibrated cost model predicts the measured order: of
    cohesive against random batches per M, of all runs, of the batches."""
    if not runs or agreement is None:
        return []
    by = {(r["M"], r["batches"], r["balance"]): r for r in runs}
    pairs = [(by[m, "cohesive", "none"], by[m, "random", "none"]) for m, b, bal in by
             if b == "cohesive" and bal == "none" and (m, "random", "none") in by]
    same = sum((c["J"] < r["J"]) == (c["epoch_time"] < r["epoch_time"]) for c, r in pairs)
    out = [f"model: J(P) orders cohesive vs random batches as measured at {same} of "
           f"{len(pairs)} M (" + ", ".join(
               f"M={c['M']}: {c['epoch_time']:.3f} vs {r['epoch_time']:.3f} s/epoch, "
               f"modelled {c['J']:.3f} vs {r['J']:.3f} s" for c, r in pairs) + ")",
           f"model: Spearman over the {len(runs)} runs: J(P) vs epoch time "
           f"{agreement['spearman_runs_J']:.2f}, sum of slowest ranks vs epoch time "
           f"{agreement['spearman_runs_J_max_rank']:.2f}; over the batches (owners): C(B) vs "
           f"batch time {agreement['spearman_batches_C']:.2f}, slowest rank "
           f"{agreement['spearman_batches_max_rank']:.2f}; measured/modelled "
           f"{agreement['seconds_per_modelled_second']:.2f}x",
           f"model: epoch time ~ {agreement['fit_seconds_per_batch'] * 1000:.1f} ms x M + "
           f"{agreement['fit_scale']:.2f} x sum of slowest ranks (least squares over the runs, "
           f"R^2 {agreement['fit_r2']:.2f}): the per-batch time the cost model leaves out"]
    for label in ("cohesive", "random"):
        rules = [r for r in runs if r["batches"] == label and r["balance"] != "none"]
        if rules:
            out.append(f"balance rules ({label}, M={rules[0]['M']}): " + "; ".join(
                f"{r['balance']} {r['epoch_time']:.3f} s/epoch, {r['bytes_sent'] / MiB:.1f} "
                f"MB/epoch" for r in rules))
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
    parser.add_argument("--pyg-python", default=pyg_baselines.PYG_PYTHON,
                        help="a Python with torch-sparse for the PyG loaders (default "
                             "$PYG_ENV/bin/python, .bench/pyg-env; skipped when missing)")
    parser.add_argument("--workdir", default="runs/bench_cohesive")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS,
                        help="which parts run (default: all)")
    parser.add_argument("--timing", type=int, nargs="*", default=[5, 10, 20, 100],
                        help="M of the model-against-measurement runs")
    parser.add_argument("--timing-epochs", type=int, default=4,
                        help="epochs per timing run (the first not timed)")
    parser.add_argument("--cost-constants", default=None, metavar="FILE",
                        help="the cost model's constants (pyg-dist calibrate --out) instead "
                             "of measuring them (so that runs share one batching)")
    parser.add_argument("--placeholder-batches", action="store_true",
                        help="cost: also batch with the placeholder constants and report "
                             "those batches' J(P) under the measured ones")
    args = parser.parse_args()
    args.fanout = [10, 10, 10]  # PyG NeighborLoader's, one per layer
    if args.timing_epochs < 2:
        parser.error("--timing-epochs must be >= 2 (the first is not timed)")

    started = time.time()
    data = load_default(osp.join(args.workdir, "data"),
                        **({"num_nodes": args.num_nodes} if args.num_nodes else {}))
    parts_root = osp.join(args.workdir, f"parts{args.parts}")
    if not osp.exists(osp.join(parts_root, "meta.json")):
        pyg_dist.partition_graph(data, args.parts, root=parts_root)
    book = PartitionBook.load(parts_root)
    results: Dict[str, Any] = {"costs": [], "runs": [], "timing": [], "agreement": None}
    cost = cost_model(data, args.hidden, args.parts, args.cost_constants)
    results["cost_model"] = cost.to_dict()
    print(f"cost model: {cost.describe()}", flush=True)

    def checkpoint():
        save(args, [results], started, targets(results["costs"], results["runs"],
                                               results["timing"], results["agreement"]))

    print("cost of the batches (J(P), Eq. 14):", flush=True)
    made: Dict[int, torch.Tensor] = {}  # cohesive batches per M, computed once
    if "cost" in args.sections:
        results["costs"] = costs(data, book, args.parts, args.costs, args.seed, made,
                                 args.hidden, args.placeholder_batches)
    checkpoint()

    if "timing" in args.sections:
        print("the cost model against measured batch times:", flush=True)
        results["timing"], results["agreement"] = timing(args, data, book, parts_root, made)
        print("\n" + timing_table(results["timing"]) + "\n")
        checkpoint()
    roots = batch_roots(args.workdir, parts_root, data, book, args.parts, args.num_batches,
                        args.seed, made, hidden=args.hidden) if "training" in args.sections \
        else {}
    with network_for(args.parts, parse_link("loopback")) as net:
        for label, root in roots.items():
            out = osp.join(args.workdir, "runs", f"M{args.num_batches}-{label}")
            rows = run(net, root, out, ["--loader", "cohesive", "--seed", str(args.seed)],
                       args)
            results["runs"].append({"method": label, "link": net.label, **summarize(rows)})
            print(f"  {label}: {results['runs'][-1]['epoch_time']:.3f} s/epoch, "
                  f"acc {results['runs'][-1]['test_acc']:.4f}", flush=True)
            checkpoint()
    for kind in ("cluster", "neighbor") if "training" in args.sections else ():
        try:
            row = summarize(pyg_baselines.run(args.pyg_python, kind, args, args.seed))
        except RuntimeError as e:
            row = {"error": str(e)}
        results["runs"].append({"method": f"PyG {kind}", "link": "single process", **row})
        print(f"  PyG {kind}: {row}", flush=True)
        checkpoint()
    for spec in args.links if "overlap" in args.sections else ():
        with network_for(args.parts, parse_link(spec)) as net:
            for method, flags in (("full exact", []), ("full exact +overlap", ["--overlap"])):
                out = osp.join(args.workdir, "runs", f"{method}-{spec}".replace(" ", "_"))
                rows = run(net, parts_root, out, flags + ["--seed", str(args.seed)], args)
                results["runs"].append({"method": method, "link": net.label,
                                        **summarize(rows)})
                print(f"  {method} {net.label}: {results['runs'][-1]['epoch_time']:.3f} "
                      f"s/epoch, wait {results['runs'][-1]['time_comm']:.3f} s", flush=True)
                checkpoint()
    if results["runs"]:
        print("\n" + table(results["runs"]) + "\n")
    print("\n".join(targets(results["costs"], results["runs"], results["timing"],
                           results["agreement"])))
    checkpoint()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
