r"""Writing a graph's cohesive mini-batches next to its partitions (what
``pyg-dist partition --num-batches`` does)."""
from typing import Any, Dict

import torch
from torch_geometric.data import Data

from pyg_dist.loader.cohesive.balance import save_batch_parts
from pyg_dist.loader.cohesive.batch_partition import cohesive_batches, random_batches
from pyg_dist.loader.cohesive.cost import CostModel, HopGraph, imbalance, rank_costs
from pyg_dist.loader.cohesive.loader import save_batches
from pyg_dist.partition import PartitionBook


def write_batches(data: Data, root: str, book: PartitionBook, num_batches: int, num_layers: int,
                  hidden: int = 64, seed: int = 0, balance: bool = False) -> Dict[str, Any]:
    r"""Splits the training nodes of :obj:`data` (partitioned as
    :obj:`book` into :obj:`root`) into :obj:`num_batches` CM-GCN cohesive mini-batches for a
    :obj:`num_layers`-layer model of width :obj:`hidden`, saves them next
    to the partitions (with :obj:`balance`, also each batch's cost-balanced
    split over the ranks) and reports: ``path``, the batches' cost
    ``j`` and random batches' ``j_random``, and the largest per-rank cost
    of a batch over the mean (``imbalance``, ``imbalance_random``,
    ``imbalance_balanced``)."""
    nodes = data.train_mask.nonzero().view(-1)
    num_classes = int(data.y.max()) + 1
    cost = CostModel(dims=[data.num_features] + [hidden] * (num_layers - 1) + [num_classes])
    graph = HopGraph(data.edge_index, data.num_nodes, cost)
    assignment = cohesive_batches(graph, data.edge_index, nodes, num_batches, seed=seed)
    batch_of = torch.full((data.num_nodes, ), -1, dtype=torch.long)
    batch_of[nodes] = assignment
    report: Dict[str, Any] = {"path": save_batches(root, batch_of)}
    rand = random_batches(nodes.numel(), num_batches, seed)
    report.update(j=graph.partition_cost(assignment, nodes),
                  j_random=graph.partition_cost(rand, nodes))
    part_of = book.owner(book.inv_perm)  # original id -> part
    report["imbalance"], report["imbalance_random"] = [
        max(imbalance(rank_costs(graph, nodes[a == b], part_of, book.num_parts))
            for b in range(num_batches)) for a in (assignment, rand)]
    if balance:
        loads = save_batch_parts(root, data, graph, batch_of, part_of, book.num_parts,
                                 book.meta["graph_hash"])
        report["imbalance_balanced"] = max(imbalance(load) for load in loads)
    return report
