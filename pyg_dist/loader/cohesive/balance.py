r"""Balanced workloads (CM-GCN §III-B): each batch's computational graph
split over the ranks by cost, stored as one partition per batch and rank."""
import heapq
import os
import os.path as osp
import shutil
from typing import List, Tuple

import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_dist.data import DistData
from pyg_dist.integrity import save_checked
from pyg_dist.loader.cohesive.cost import HopGraph
from pyg_dist.partition.book import add_files, read_meta
from pyg_dist.partition.partition import build_parts

BATCH_PARTS_DIR = "batch_parts"


def computational_graph(graph: HopGraph, batch: Tensor) -> Tuple[Tensor, Tensor]:
    r"""The nodes of :obj:`batch`'s K-hop computational graph in BFS order
    from the batch (hop by hop, ids ascending within a hop) and the work
    :math:`\sum_k c_f(v, k) + c_b(v, k)` each does over the layers it
    computes in (0 for the nodes only read as input features)."""
    K = graph.cost.num_layers
    hops = graph.hops(batch)  # within 0..K-1 hops: computed at layers K..1
    reached = torch.stack(hops + [graph.expand(hops[-1])])  # [K + 1, N]
    work = sum(graph.layer_cost[K - h] * hops[h] for h in range(K))
    first_hop = torch.where(reached.any(0), reached.int().argmax(0), K + 1)
    nodes = reached[-1].nonzero().view(-1)
    order = torch.argsort(first_hop[nodes] * graph.num_nodes + nodes)
    return nodes[order], work[nodes[order]]


BALANCE_RULES = ("owner", "greedy")


def balance_work(work: Tensor, owner: Tensor, num_parts: int,
                 tolerance: float = 0.05, rule: str = "owner") -> Tensor:
    r"""The rank that computes each node of a computational graph (given in
    BFS order from the batch, with its work :math:`nc(v)` and owner).

    * ``"greedy"``: CM-GCN's rule (§III-B): every node, in BFS order, goes
      to the rank with the lowest total work so far (the lowest such rank
      on ties), so the ranks' work differs by at most one node's
      :math:`nc(v)`. Nodes only read as input features (:math:`nc(v) = 0`)
      stay with their owner: they change no rank's work, and the paper
      leaves their place open.
    * ``"owner"``: each node stays with its owner, unless that rank's work
      exceeds the mean by more than :obj:`tolerance`; an overloaded rank
      hands its outermost nodes (last in BFS order, which the batch reads
      least deep) to the least loaded ranks until every rank is within
      :obj:`tolerance` of the mean, or within one node's work when single
      nodes are larger than that. Starting from the owners keeps most of
      the graph where its features and edges already are, so a balanced
      batch exchanges little more than an unbalanced one.
    """
    if rule not in BALANCE_RULES:
        raise ValueError(f"Unknown balance rule '{rule}' (choose from "
                         f"{', '.join(BALANCE_RULES)})")
    if rule == "greedy":
        return _greedy(work, owner, num_parts)
    rank = owner.clone()
    load = torch.zeros(num_parts, dtype=torch.double).index_add_(0, rank, work.double())
    high = load.mean() * (1 + tolerance)
    for r in torch.argsort(load, descending=True).tolist():
        excess = float(load[r] - high)
        if excess <= 0:
            continue
        mine = ((rank == r) & (work > 0)).nonzero().view(-1).flip(0)  # outermost first
        moved = mine[torch.cumsum(work[mine].double(), 0) - work[mine].double() < excess]
        for v in moved.tolist():
            to = int(torch.argmin(load))
            if to == r or load[to] + work[v] > load[r] - work[v]:
                break
            rank[v] = to
            load[to] += work[v]
            load[r] -= work[v]
    return rank


def _greedy(work: Tensor, owner: Tensor, num_parts: int) -> Tensor:
    r"""CM-GCN's list scheduling: each computing node in order to the least
    loaded rank (a heap of (work, rank): the lowest rank wins ties)."""
    rank = owner.clone()
    heap = [(0.0, r) for r in range(num_parts)]
    computing = (work > 0).nonzero().view(-1)
    chosen = []
    for w in work[computing].double().tolist():
        load, r = heapq.heappop(heap)
        chosen.append(r)
        heapq.heappush(heap, (load + w, r))
    rank[computing] = torch.tensor(chosen, dtype=rank.dtype)
    return rank


def split_batch(graph: HopGraph, batch: Tensor, owner: Tensor, num_parts: int,
                tolerance: float = 0.05, rule: str = "owner"
                ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The nodes of :obj:`batch`'s computational graph (BFS order), their
    work, the rank that computes each (:func:`balance_work` by
    :obj:`rule`; :obj:`owner` over the whole graph) and each rank's total
    work."""
    nodes, work = computational_graph(graph, batch)
    rank = balance_work(work, owner[nodes], num_parts, tolerance, rule)
    load = torch.zeros(num_parts, dtype=torch.double).index_add_(0, rank, work.double())
    return nodes, work, rank, load


def save_batch_parts(root: str, data: Data, graph: HopGraph, batch_of: Tensor,
                     owner: Tensor, num_parts: int, graph_hash: str,
                     tolerance: float = 0.05, rule: str = "owner") -> List[Tensor]:
    r"""Writes, for every batch :math:`b` and rank :math:`r`,
    ``root/batch_parts/{b}/part_{r}.pt``: the part of :math:`b`'s
    computational graph that rank :math:`r` computes (:func:`balance_work`
    by :obj:`rule`)
    as a partition of that graph (inner nodes, halo, exchange plan, input
    features of its inner nodes, ``batch_mask`` of its batch nodes),
    with the whole graph's degrees, each described (size and checksum) in
    ``meta.json``. Returns each batch's per-rank work.

    Every rank then holds the input features of the nodes it computes in
    any batch, as in CM-GCN: up to :math:`M` copies of a row, the price of
    balance."""
    if rule not in BALANCE_RULES:  # before anything is removed
        raise ValueError(f"Unknown balance rule '{rule}' (choose from "
                         f"{', '.join(BALANCE_RULES)})")
    shutil.rmtree(osp.join(root, BATCH_PARTS_DIR), ignore_errors=True)
    src, dst = data.edge_index
    deg_in = torch.bincount(dst, minlength=data.num_nodes)
    has_loop = torch.zeros(data.num_nodes, dtype=torch.bool)
    has_loop[dst[src == dst]] = True
    node_keys = [k for k in data.keys() if data.is_node_attr(k) and k != "edge_index"]
    loads, described = [], {}
    for b in range(int(batch_of.max()) + 1):
        batch = (batch_of == b).nonzero().view(-1)
        nodes, work, rank, load = split_batch(graph, batch, owner, num_parts, tolerance, rule)
        loads.append(load)
        local = torch.full((data.num_nodes, ), -1, dtype=torch.long)
        local[nodes] = torch.arange(nodes.numel())
        computes = torch.zeros(data.num_nodes, dtype=torch.bool)
        computes[nodes[work > 0]] = True
        keep = computes[dst]  # the in-edges of the nodes any layer computes
        sub = Data(edge_index=local[data.edge_index[:, keep]], num_nodes=nodes.numel(),
                   **{k: data[k][nodes] for k in node_keys})
        sub.batch_mask = batch_of[nodes] == b
        parts = build_parts(sub, rank, num_parts)[0]
        os.makedirs(osp.join(root, BATCH_PARTS_DIR, str(b)), exist_ok=True)
        for r, item in enumerate(parts):
            original = nodes[item["n_id"]]
            item.update(n_id=original, deg_in=deg_in[original], has_loop=has_loop[original],
                        batch_index=b, num_layers=graph.cost.num_layers,
                        graph_hash=graph_hash)
            path = batch_part_file(root, b, r)
            described[osp.relpath(path, root)] = save_checked(item, path)
    add_files(root, described, replace=BATCH_PARTS_DIR)  # DistData.read checks them
    return loads


def batch_part_file(root: str, batch: int, rank: int) -> str:
    return osp.join(root, BATCH_PARTS_DIR, str(batch), f"part_{rank}.pt")


def has_batch_parts(root: str) -> bool:
    return osp.isdir(osp.join(root, BATCH_PARTS_DIR))


def load_batch_part(root: str, batch: int, rank: int, num_layers: int) -> DistData:
    r"""The part :func:`save_batch_parts` wrote for :obj:`batch` and
    :obj:`rank`, checked against the partitioning in :obj:`root` and the
    depth of the model that will run it."""
    path = batch_part_file(root, batch, rank)
    if not osp.exists(path):
        raise FileNotFoundError(f"'{path}' is missing: write the balanced batches with "
                                f"pyg-dist partition --num-batches M --balance-batches")
    data = DistData.read(path, root, read_meta(root), rank=rank, batch_index=batch)
    if data.num_layers < num_layers:
        raise ValueError(f"'{path}' holds {data.num_layers}-layer computational graphs, "
                         f"the model has {num_layers} layers: re-run pyg-dist partition "
                         f"--balance-batches --batch-layers {num_layers}")
    return data
