r"""Writing a graph's cohesive mini-batches next to its partitions (what
``pyg-dist partition --num-batches`` does)."""
from typing import Any, Dict, Optional

import torch
from torch_geometric.data import Data

from pyg_dist.loader.cohesive.balance import BALANCE_RULES, save_batch_parts
from pyg_dist.loader.cohesive.batch_partition import cohesive_batches, random_batches
from pyg_dist.loader.cohesive.cost import CostModel, HopGraph, imbalance, rank_costs
from pyg_dist.loader.cohesive.loader import save_batches
from pyg_dist.partition import PartitionBook


def write_batches(data: Data, root: str, book: PartitionBook, num_batches: int, num_layers: int,
                  hidden: int = 64, seed: int = 0, balance: bool = False,
                  cost: Optional[CostModel] = None, model: str = "sage",
                  balance_rule: str = "owner", threads: Optional[int] = None) -> Dict[str, Any]:
    r"""Splits the training nodes of :obj:`data` (partitioned as
    :obj:`book` into :obj:`root`) into :obj:`num_batches` CM-GCN cohesive mini-batches for a
    :obj:`num_layers`-layer :obj:`model`-kind model of width :obj:`hidden`,
    saves them next to the partitions with their cost model (with
    :obj:`balance`, also each batch's cost-balanced split over the ranks by
    :obj:`balance_rule`, :func:`~pyg_dist.loader.cohesive.balance.balance_work`)
    and reports: ``path``, the cost model ``cost`` (:meth:`CostModel.to_dict`),
    the batches' cost ``j`` and random batches' ``j_random``, and the
    largest per-rank cost of a batch over the mean (``imbalance``,
    ``imbalance_random``, ``imbalance_balanced``).

    The cost model's constants are :obj:`cost`'s (e.g. measured on the GPU
    that will train, :meth:`CostModel.load`) or, without it, measured here
    (:meth:`CostModel.calibrate` with :obj:`threads` threads, on the
    graph's mean in-degree); its widths are always
    :math:`[F, h, \dots, h, C]` of this graph and model."""
    if balance_rule not in BALANCE_RULES:  # before any work
        raise ValueError(f"Unknown balance rule '{balance_rule}' (choose from "
                         f"{', '.join(BALANCE_RULES)})")
    nodes = data.train_mask.nonzero().view(-1)
    num_classes = int(data.y.max()) + 1
    dims = [data.num_features] + [hidden] * (num_layers - 1) + [num_classes]
    if cost is None:
        cost = CostModel.calibrate(dims, model=model, threads=threads,
                                   degree=max(data.num_edges / max(data.num_nodes, 1), 1.0))
    else:
        cost = CostModel.from_dict(cost.to_dict(), dims=dims)
    graph = HopGraph(data.edge_index, data.num_nodes, cost)
    assignment = cohesive_batches(graph, data.edge_index, nodes, num_batches, seed=seed)
    batch_of = torch.full((data.num_nodes, ), -1, dtype=torch.long)
    batch_of[nodes] = assignment
    report: Dict[str, Any] = {"path": save_batches(root, batch_of, cost),
                              "cost": cost.to_dict()}
    rand = random_batches(nodes.numel(), num_batches, seed)
    report.update(j=graph.partition_cost(assignment, nodes),
                  j_random=graph.partition_cost(rand, nodes))
    part_of = book.owner(book.inv_perm)  # original id -> part
    report["imbalance"], report["imbalance_random"] = [
        max(imbalance(rank_costs(graph, nodes[a == b], part_of, book.num_parts))
            for b in range(num_batches)) for a in (assignment, rand)]
    if balance:
        loads = save_batch_parts(root, data, graph, batch_of, part_of, book.num_parts,
                                 book.meta["graph_hash"], rule=balance_rule)
        report["imbalance_balanced"] = max(imbalance(load) for load in loads)
        report["balance_rule"] = balance_rule
    return report
