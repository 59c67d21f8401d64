r"""CM-GCN's cohesive mini-batches: training nodes split into :math:`M`
batches minimising :math:`J(P) = \sum_B C(B)` (Eq. 14), the cost of the
batches' K-hop computational graphs (:class:`~pyg_dist.loader.cohesive.cost.HopGraph`)."""
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from pyg_dist.loader.cohesive.cost import HopGraph
from pyg_dist.partition.metis import metis_assignment
from pyg_dist.utils import gather_neighbours


def queyranne_bisection(graph: HopGraph, nodes: Tensor) -> Tuple[Tensor, float]:
    r"""The exact minimum of the symmetric submodular function
    :math:`f(U) = C(U) + C(B \setminus U)` over the non-empty proper subsets
    :math:`U` of :math:`B` = :obj:`nodes` (Eq. 15), by Queyranne's
    algorithm (Alg. 2): :math:`|B| - 1` phases, each ordering the current
    (merged) items greedily by :math:`f(W \cup \{v\}) - f(\{v\})`; the last
    item :math:`u` of the order gives the candidate :math:`\{u\}`, and the
    last two are merged. :math:`O(|B|^3)` evaluations of :math:`C`, each
    vectorised over the graph: a reference for small graphs.

    Returns the mask of :math:`U` over :obj:`nodes` and :math:`f(U)`."""
    n = nodes.numel()
    if n < 2:
        raise ValueError("a batch of fewer than 2 nodes cannot be split")
    K = graph.cost.num_layers
    cost = torch.stack([graph.layer_cost[K - h] for h in range(K)])  # [H, N]
    # balls[h, i]: the nodes within h hops of item i (items merge by OR).
    balls = torch.stack([torch.stack(graph.hops(nodes[i:i + 1])) for i in range(n)], 1)
    members = [[i] for i in range(n)]
    best_value, best_set = float("inf"), None

    def value(cover: Tensor) -> Tensor:  # [H, ..., N] bool -> [...]
        return (cover.double() * cost.view((K, ) + (1, ) * (cover.dim() - 2) + (-1, ))
                ).sum(-1).sum(0)

    while len(members) > 1:
        m = len(members)
        total = balls.sum(1)  # [H, N] items covering each node
        single = value(balls) + value((total.unsqueeze(1) - balls.long()) > 0)
        order, in_w = [0], torch.zeros(m, dtype=torch.bool)
        in_w[0] = True
        count_w = balls[:, 0].long()
        for _ in range(m - 1):
            cand = (~in_w).nonzero().view(-1)
            union = count_w.unsqueeze(1) + balls[:, cand].long()
            rest = total.unsqueeze(1) - union
            key = value(union > 0) + value(rest > 0) - single[cand]
            v = int(cand[torch.argmin(key)])
            order.append(v)
            in_w[v] = True
            count_w = count_w + balls[:, v]
        t, u = order[-2], order[-1]
        if float(single[u]) < best_value:
            best_value, best_set = float(single[u]), list(members[u])
        balls[:, t] |= balls[:, u]
        members[t] += members[u]
        keep = [i for i in range(m) if i != u]
        balls, members = balls[:, keep], [members[i] for i in keep]
    mask = torch.zeros(n, dtype=torch.bool)
    mask[best_set] = True
    return mask, best_value


def recursive_bisection(graph: HopGraph, nodes: Tensor, num_batches: int) -> Tensor:
    r"""Alg. 1: starting from one batch, repeatedly applies the best exact
    bisection (:func:`queyranne_bisection`) of any current batch until there
    are :obj:`num_batches`; within :math:`2 - 2/M` of the optimal
    :math:`J(P)`. Returns the batch of every node."""
    batches: List[Tensor] = [torch.arange(nodes.numel())]
    splits: dict = {}
    for _ in range(num_batches - 1):
        best = None
        for j, batch in enumerate(batches):
            if batch.numel() < 2:
                continue
            if j not in splits:
                mask, f = queyranne_bisection(graph, nodes[batch])
                splits[j] = (mask, f - graph.batch_cost(nodes[batch]))
            if best is None or splits[j][1] < splits[best][1]:
                best = j
        if best is None:
            raise ValueError(f"cannot make {num_batches} batches of {nodes.numel()} nodes")
        mask = splits.pop(best)[0]
        batch = batches.pop(best)
        batches += [batch[mask], batch[~mask]]
        splits = {}  # positions moved: recompute lazily (small graphs only)
    assignment = torch.empty(nodes.numel(), dtype=torch.long)
    for b, batch in enumerate(batches):
        assignment[batch] = b
    return assignment


def random_batches(num_nodes: int, num_batches: int, seed: int = 0) -> Tensor:
    r"""Batches of (nearly) equal sizes drawn uniformly at random."""
    g = torch.Generator().manual_seed(seed)
    return torch.arange(num_nodes)[torch.randperm(num_nodes, generator=g)] % num_batches


class CoverCounts:
    r"""For every batch :math:`b`, hop :math:`h` and node :math:`v`, how many
    nodes of :math:`b` have :math:`v` within :math:`h` hops: :math:`C(B)`
    and the change of :math:`J(P)` when one node moves, in time
    proportional to the node's K-hop ball."""

    def __init__(self, graph: HopGraph, nodes: Tensor, assignment: Tensor,
                 num_batches: int) -> None:
        K = graph.cost.num_layers
        self.graph, self.nodes, self.assignment = graph, nodes, assignment.clone()
        self.cost = torch.stack([graph.layer_cost[K - h] for h in range(K)])  # [H, N]
        order = torch.argsort(graph.dst, stable=True)
        self.rowptr = torch.zeros(graph.num_nodes + 1, dtype=torch.long)
        self.rowptr[1:] = torch.bincount(graph.dst, minlength=graph.num_nodes).cumsum(0)
        self.col = graph.src[order]  # in-neighbours, CSR by target
        self.balls = [self.ball(int(v)) for v in nodes]
        self.counts = torch.zeros(num_batches, K, graph.num_nodes, dtype=torch.int32)
        for i, balls in enumerate(self.balls):
            for h, ball in enumerate(balls):
                self.counts[self.assignment[i], h, ball] += 1

    def ball(self, v: int) -> List[Tensor]:
        r"""The nodes within :math:`0, \dots, K-1` hops of :obj:`v`."""
        balls = [torch.tensor([v])]
        for _ in range(self.cost.size(0) - 1):
            prev = balls[-1]
            balls.append(torch.unique(torch.cat([prev, gather_neighbours(
                self.rowptr, self.col, prev)])))
        return balls

    def total(self) -> float:
        r""":math:`J(P)`."""
        return float(((self.counts > 0).double() * self.cost.unsqueeze(0)).sum())

    def move_gain(self, i: int, targets: Tensor) -> Tuple[float, Tensor]:
        r"""(cost removed from node :obj:`i`'s batch, cost added to each of
        :obj:`targets`) when node :obj:`i` moves."""
        home = int(self.assignment[i])
        removed, added = 0.0, torch.zeros(targets.numel(), dtype=torch.double)
        for h, ball in enumerate(self.balls[i]):
            cost = self.cost[h, ball]
            removed += float(cost[self.counts[home, h, ball] == 1].sum())
            added += ((self.counts[targets.unsqueeze(1), h, ball] == 0).double() * cost).sum(1)
        return removed, added

    def move(self, i: int, batch: int) -> None:
        home = int(self.assignment[i])
        for h, ball in enumerate(self.balls[i]):
            self.counts[home, h, ball] -= 1
            self.counts[batch, h, ball] += 1
        self.assignment[i] = batch


def refine(counts: CoverCounts, num_batches: int, tolerance: float = 0.1,
           passes: int = 2, seed: int = 0) -> Tensor:
    r"""Greedy moves that lower :math:`J(P)`: each node, in a seeded random
    order, moves to the batch (among those already covering it) where it
    adds the least cost, if that is less than it removes from its own and
    both batches stay within :obj:`tolerance` of the mean size."""
    n = counts.nodes.numel()
    mean = n / num_batches
    low, high = int(mean * (1 - tolerance)), int(mean * (1 + tolerance)) + 1
    sizes = torch.bincount(counts.assignment, minlength=num_batches)
    g = torch.Generator().manual_seed(seed)
    last_hop = counts.cost.size(0) - 1
    for _ in range(passes):
        moved = 0
        for i in torch.randperm(n, generator=g).tolist():
            home, v = int(counts.assignment[i]), int(counts.nodes[i])
            if sizes[home] <= low:
                continue
            covering = (counts.counts[:, last_hop, v] > 0) & (sizes < high)
            covering[home] = False
            targets = covering.nonzero().view(-1)
            if targets.numel() == 0:
                continue
            removed, added = counts.move_gain(i, targets)
            j = int(torch.argmin(added))
            if float(added[j]) < removed - 1e-12:
                counts.move(i, int(targets[j]))
                sizes[home] -= 1
                sizes[targets[j]] += 1
                moved += 1
        if moved == 0:
            break
    return counts.assignment


def cohesive_batches(graph: HopGraph, edge_index: Tensor, nodes: Tensor,
                     num_batches: int, method: str = "auto", seed: int = 0,
                     tolerance: float = 0.1, passes: int = 2,
                     exact_limit: int = 64) -> Tensor:
    r"""Splits the training nodes :obj:`nodes` into :obj:`num_batches`
    cohesive mini-batches; returns the batch of every node.

    * ``"exact"``: CM-GCN's recursive bisection with Queyranne's exact
      bisection (:func:`recursive_bisection`); :math:`O(M |V|^3)`
      evaluations of :math:`C`, for small graphs.
    * ``"metis"``: the scalable method: METIS (edge cut) on the whole graph
      with the training nodes balanced over the parts, a node's batch being
      its part, then :func:`refine` (greedy moves that lower the same
      objective :math:`J(P)`, sizes within :obj:`tolerance`).
    * ``"auto"``: exact up to :obj:`exact_limit` nodes, METIS beyond.
    """
    if not 1 <= num_batches <= nodes.numel():
        raise ValueError(f"num_batches must be in [1, {nodes.numel()}] (got {num_batches})")
    if method == "auto":
        method = "exact" if nodes.numel() <= exact_limit else "metis"
    if method == "exact":
        return recursive_bisection(graph, nodes, num_batches)
    if method != "metis":
        raise ValueError(f"Unknown batching method '{method}' (exact, metis, auto)")
    trained = np.zeros((graph.num_nodes, 1), dtype=np.int64)
    trained[nodes.numpy()] = 1
    parts = metis_assignment(edge_index, graph.num_nodes, num_batches, objective="cut",
                             weights=trained, seed=seed, tolerance=tolerance)[nodes]
    counts = CoverCounts(graph, nodes, parts, num_batches)
    return refine(counts, num_batches, tolerance, passes, seed)


def batch_cost_report(graph: HopGraph, nodes: Tensor, assignment: Tensor,
                      reference: Optional[Tensor] = None) -> dict:
    r""":math:`J(P)` of :obj:`assignment` and, if given, of the
    :obj:`reference` batches (e.g. random ones of the same sizes)."""
    report = {"J": graph.partition_cost(assignment, nodes)}
    if reference is not None:
        report["J_reference"] = graph.partition_cost(reference, nodes)
        report["reduction"] = 1 - report["J"] / report["J_reference"]
    return report
