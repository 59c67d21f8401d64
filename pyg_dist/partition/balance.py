r"""Multi-constraint balance of a node-to-part assignment: every part holds
at most :math:`(1 + \epsilon)` times the mean of each balanced quantity,
as DistDGL balances nodes, edges and node types.

The quantities (:data:`QUANTITIES`) are a part's inner nodes, its in-edges
(the edges its rank aggregates over, which set its step's pace and much of
its memory) and its nodes of each mask (training, validation, test: each
rank's share of the loss and of evaluation). A partitioner balances one
weight per node: :func:`partitioner_weights` gives it the in-degree beside
the node count, then :func:`balance` moves nodes until every quantity is
within its cap. A move goes from a part above a cap the node adds to, to
the part holding most of its neighbours where every cap the node adds to
holds (else to the part with the most room), best gain first (neighbours
at the destination minus those at home), in three passes:

1. the in-edges alone, to a cap a little below theirs, so that room is
   left for the nodes of few in-edges the next pass moves;
2. the nodes and masks of the nodes that have in-edges;
3. the nodes without in-edges (40% of R-MAT's), which go wherever the
   in-edges allow: into the room the others left, so that a part full of
   in-edges takes the nodes of a part full of nodes.

Where nodes still cannot move (every part with room for them full of
in-edges), the passes run again with more room below the in-edges' cap;
a mask whose nodes still cannot move at all moves under the nodes' and
in-edges' caps relaxed to :data:`RELAXED` times the mean.

On power-law graphs the balance costs cut: the hubs' in-edges, all in one
part when only nodes are balanced, are spread (R-MAT, 2^20 nodes, 2^24
edges, 4 parts from disk: the largest part's in-edges from 2.83x to 1.02x
the mean, the edge cut from 40.5% to 71.8% of the edges, the halo rows
from 0.51 to 0.91 per node; ``benchmarks/balance.py``).
"""
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from pyg_dist.utils import gather_neighbours

#: What ``balance`` may name: the inner nodes (always balanced), the
#: in-edges, and masks.
QUANTITIES = ("nodes", "edges", "train_mask", "val_mask", "test_mask")
# The in-degree's share of a partitioner's node weight: weight 1 + EDGE_WEIGHT
# * in-degree * N / E. Measured on `pyg-dist rmat --scale 17` (4 and 8 parts,
# METIS and KaMinPar): 4 left the largest part's in-edges at 1.11-1.13x the mean
# before balancing (node weights: 2.4-5.9x), and the cut after balancing 5-8%
# lower than from a node-only start.
EDGE_WEIGHT = 4.0
# The nodes and in-edges a part may hold, times the mean, where a mask's
# nodes can be balanced no other way.
RELAXED = 1.08


def check_balance(balance: Sequence[str]) -> Tuple[str, ...]:
    r""":obj:`balance` as a tuple of known quantities; raises
    :class:`ValueError` naming an unknown one."""
    names = tuple(balance)
    unknown = [name for name in names if name not in QUANTITIES]
    if unknown:
        raise ValueError(f"balance names {', '.join(map(repr, unknown))}: choose from "
                         f"{', '.join(QUANTITIES)} (none: nodes only)")
    return names


def weight_columns(balance: Sequence[str], in_degree: np.ndarray,
                   masks: Mapping[str, np.ndarray]) -> Tuple[List[str], np.ndarray]:
    r"""The names and the ``[N, C]`` int32 weights of the quantities to
    balance: always the nodes (a partitioner's own constraint), then the
    in-edges and the masks :obj:`balance` names, masks the graph lacks
    skipped."""
    names, columns = ["nodes"], [np.ones(in_degree.size, dtype=np.int32)]
    if "edges" in balance:
        names.append("edges")
        columns.append(np.asarray(in_degree, dtype=np.int32))
    for name in balance:
        if name.endswith("_mask") and masks.get(name) is not None:
            names.append(name)
            columns.append(np.asarray(masks[name], dtype=bool).astype(np.int32))
    return names, np.stack(columns, 1)


def partitioner_weights(in_degree: np.ndarray) -> np.ndarray:
    r"""A node's weight for a partitioner that balances one weight:
    :math:`1 + w \, d_i N / E` with the in-degree :math:`d_i` (:data:`EDGE_WEIGHT`
    :math:`w`), so a part's weight counts its nodes and its in-edges alike."""
    total = max(int(in_degree.sum()), 1)
    scaled = np.rint(in_degree * (EDGE_WEIGHT * in_degree.size / total))
    return 1 + scaled.astype(np.int64)


def part_loads(part: np.ndarray, weights: np.ndarray, num_parts: int) -> np.ndarray:
    r"""``[K, C]``: each part's sum of each weight column."""
    loads = np.zeros((num_parts, weights.shape[1]), dtype=np.int64)
    np.add.at(loads, part, weights)
    return loads


def balance(part: np.ndarray, rowptr: np.ndarray, col: np.ndarray, weights: np.ndarray,
            num_parts: int, tolerance: float = 0.03, edges: Optional[int] = None,
            rounds: int = 8, chunk: int = 1 << 22) -> np.ndarray:
    r"""Moves nodes of :obj:`part` (int64, changed in place and returned)
    until every part holds at most :math:`\lceil (1 + \epsilon) W_c / K
    \rceil` of every column :math:`c` of :obj:`weights` (:math:`W_c` its
    total), moving as few neighbours apart as it can (see the module).
    :obj:`rowptr`/:obj:`col` is the symmetrised graph (may be memory-mapped;
    read in chunks of at most :obj:`chunk` neighbour entries and as many
    histogram cells); :obj:`edges` is the column of the in-edges, balanced
    alone first. A cap is never below the heaviest node's weight (a part
    may hold its hub); a node that fits no part stays where it is."""
    if num_parts == 1:
        return part
    caps = _caps(weights, 1 + tolerance, num_parts)
    if (part_loads(part, weights, num_parts) <= caps).all():
        return part
    if edges is None:
        _balance(part, rowptr, col, weights, caps, num_parts, rounds, chunk)
        return _relaxed(part, rowptr, col, weights, caps, num_parts, rounds, chunk, edges)
    # The in-edges first, below their cap: the room left takes the nodes of
    # few in-edges that the node count then moves. Nodes without in-edges go
    # anywhere the in-edges allow: the others first, as if those were not
    # there, then those, into the room left. Where nodes still cannot move
    # (every part with room for them full of in-edges), again with more room.
    free = weights[:, edges] == 0
    for slack in (2, 4, 8):
        tight = _caps(weights[:, [edges]], 1 + tolerance / slack, num_parts)
        _balance(part, rowptr, col, weights[:, [edges]], tight, num_parts, rounds, chunk)
        _balance(part, rowptr, col, np.where(free[:, None], 0, weights), caps, num_parts,
                 rounds, chunk)
        _balance(part, rowptr, col, weights, caps, num_parts, rounds, chunk, movable=free)
        if (part_loads(part, weights, num_parts) <= caps).all():
            return part
    return _relaxed(part, rowptr, col, weights, caps, num_parts, rounds, chunk, edges)


def _relaxed(part: np.ndarray, rowptr: np.ndarray, col: np.ndarray, weights: np.ndarray,
             caps: np.ndarray, num_parts: int, rounds: int, chunk: int,
             edges: Optional[int]) -> np.ndarray:
    r"""Where a mask still exceeds its cap (its nodes clustered in parts
    that every other part's nodes or in-edges leave no room for, and no
    move swaps), its nodes move under caps of the nodes and in-edges
    relaxed to :data:`RELAXED` times the mean."""
    if (part_loads(part, weights, num_parts) <= caps).all():
        return part
    relaxed = caps.copy()
    for j in (0, edges) if edges is not None else (0, ):
        relaxed[j] = max(caps[j], int(np.ceil(RELAXED * weights[:, j].sum() / num_parts)))
    _balance(part, rowptr, col, weights, relaxed, num_parts, rounds, chunk)
    return part


def _caps(weights: np.ndarray, factor: float, num_parts: int) -> np.ndarray:
    r"""Each column's cap: :obj:`factor` times the mean part's weight, or,
    where one node alone weighs more (a hub whose in-edges exceed a mean
    part's), that node and :obj:`factor` times a mean part's share of the
    rest: otherwise its part, above the cap whatever it sheds, would shed
    every other node that adds to the column."""
    total = weights.sum(0).astype(np.float64)
    heaviest = weights.max(0).astype(np.float64)
    caps = np.ceil(factor * total / num_parts)
    hub = heaviest > caps
    caps[hub] = np.ceil(heaviest[hub] + factor * (total[hub] - heaviest[hub]) / num_parts)
    return caps.astype(np.int64)


def _balance(part: np.ndarray, rowptr: np.ndarray, col: np.ndarray, weights: np.ndarray,
             caps: np.ndarray, num_parts: int, rounds: int, chunk: int,
             movable: Optional[np.ndarray] = None) -> None:
    r"""Moves the :obj:`movable` nodes (default: all) of parts above a cap
    (rounds of :func:`_apply`, each on the gains of the assignment before it)."""
    loads = part_loads(part, weights, num_parts)
    for _ in range(rounds):
        over = loads > caps
        if not over.any():
            return
        # Candidates: nodes that carry a quantity their part holds too much of.
        carries = ((weights > 0) & over[part]).any(1)
        candidates = np.flatnonzero(carries if movable is None else carries & movable)
        node, dest, gain = _preferred(part, rowptr, col, candidates, num_parts, chunk)
        # The nodes that take least room where they go first (a part's scarce
        # room then holds the most of them; on a log scale), best gain first
        # among them.
        share = (np.where(over[part[node]], 0, weights[node]) / np.maximum(caps, 1)).sum(1)
        order = np.lexsort((-gain, np.floor(np.log2(1 + share * (1 << 20)))))
        if not _apply(part, loads, caps, weights, node[order], dest[order]):
            return


def _preferred(part: np.ndarray, rowptr: np.ndarray, col: np.ndarray,
               candidates: np.ndarray, num_parts: int, chunk: int):
    r"""For every candidate node, the other part holding most of its
    neighbours and the gain of moving there (neighbours there minus
    neighbours at home; an isolated node's is 0, towards part 0)."""
    dest = np.empty(candidates.size, dtype=np.int64)
    gain = np.empty(candidates.size, dtype=np.int64)
    # Chunks of at most `chunk` neighbour entries and `chunk` histogram cells.
    degree = (np.asarray(rowptr[candidates + 1], dtype=np.int64)
              - np.asarray(rowptr[candidates], dtype=np.int64))
    ends = np.cumsum(degree)
    start = 0
    while start < candidates.size:
        stop = int(np.searchsorted(ends, (ends[start - 1] if start else 0) + chunk, "right"))
        stop = min(max(stop, start + 1), start + max(1, chunk // num_parts), candidates.size)
        nodes = candidates[start:stop]
        hist = _histograms(part, rowptr, col, nodes, num_parts)
        home = hist[np.arange(nodes.size), part[nodes]]
        hist[np.arange(nodes.size), part[nodes]] = -1  # another part
        best = hist.argmax(1)
        dest[start:start + nodes.size] = best
        gain[start:start + nodes.size] = np.maximum(hist[np.arange(nodes.size), best], 0) - home
        start = stop
    return candidates, dest, gain


def _histograms(part: np.ndarray, rowptr: np.ndarray, col: np.ndarray, nodes: np.ndarray,
                num_parts: int) -> np.ndarray:
    r"""``[len(nodes), K]``: how many neighbours of each node each part holds."""
    degree = np.asarray(rowptr[nodes + 1], dtype=np.int64) - np.asarray(rowptr[nodes])
    rows = np.repeat(np.arange(nodes.size), degree)
    owners = part[gather_neighbours(torch.from_numpy(np.asarray(rowptr)),
                                    torch.from_numpy(col), torch.from_numpy(nodes)).numpy()]
    counts = np.bincount(rows * num_parts + owners, minlength=nodes.size * num_parts)
    return counts.reshape(nodes.size, num_parts)


def _apply(part: np.ndarray, loads: np.ndarray, caps: np.ndarray, weights: np.ndarray,
           nodes: np.ndarray, dest: np.ndarray) -> int:
    r"""Moves :obj:`nodes` in order, each from a part above a cap it
    contributes to, to its preferred part where every cap the node adds to
    holds, else to the part with the most room left; returns the moves.
    (A loop over nodes: each move changes what the next may do; its state
    is K x C Python integers.)"""
    k, c = loads.shape
    load = loads.tolist()
    cap = caps.tolist()
    moved = 0
    for v, q in zip(nodes.tolist(), dest.tolist()):
        p = part[v]
        w = weights[v].tolist()
        home = load[p]
        if not any(w[j] and home[j] > cap[j] for j in range(c)):
            continue  # its part holds no excess this node carries (any more)

        def fits(r: int) -> bool:
            return r != p and all(not w[j] or load[r][j] + w[j] <= cap[j] for j in range(c))

        if not fits(q):
            room = [min(cap[j] - load[r][j] - w[j] for j in range(c)) if fits(r) else None
                    for r in range(k)]
            if all(x is None for x in room):
                continue
            q = max((x, r) for r, x in enumerate(room) if x is not None)[1]
        for j in range(c):
            home[j] -= w[j]
            load[q][j] += w[j]
        part[v] = q
        moved += 1
    loads[:] = np.array(load, dtype=np.int64).reshape(k, c)
    return moved


def imbalance(part: np.ndarray, weights: np.ndarray, names: Sequence[str],
              num_parts: int) -> Dict[str, float]:
    r"""Each quantity's largest part over its mean part (1.0: even)."""
    loads = part_loads(part, weights, num_parts)
    mean = np.maximum(loads.mean(0), 1e-12)
    return {name: float(loads[:, j].max() / mean[j]) for j, name in enumerate(names)}

