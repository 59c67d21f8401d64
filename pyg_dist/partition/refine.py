r"""Label-propagation refinement of a partition, out of core: the last
step of a multilevel partitioner (KaMinPar refines every level this way),
run on the whole graph when the partitioner saw only a sample of its edges.

Every node wants the part that holds most of its neighbours. Parts hold at
most :math:`\lceil (1 + \epsilon) N / K \rceil` nodes, and a partitioner
leaves them nearly full, so moves from part :math:`i` to :math:`j` are
paired with moves from :math:`j` to :math:`i` (best gain first; the sizes
stay as they are) and the rest fill the room left. A part's *load*, the
degrees of its nodes in the symmetrised graph (a measure of the edges its
rank aggregates over), may not grow past the largest load given or
:math:`(1 + \epsilon)` times the mean: without that bound, refinement of
R-MAT graphs cut far fewer edges by gathering the hubs' edges in one part
(measured at 2^20 nodes: two thirds of all edges in one of 8 parts).

Nodes are read in chunks of neighbour lists from the ParHIP file; a
chunk's nodes decide together from the parts of the chunks before them, so
memory holds the assignment, :math:`K` part sizes and loads, and one chunk.
"""
from typing import Tuple

import numpy as np

from pyg_dist.partition.parhip import neighbour_chunks, read_offsets


def refine(path: str, part: np.ndarray, num_parts: int, tolerance: float = 0.03,
           rounds: int = 10, chunk_entries: int = 1 << 23) -> np.ndarray:
    r"""Improves the assignment :obj:`part` (int64, one part per node of the
    ParHIP file :obj:`path`; changed in place and returned) by up to
    :obj:`rounds` rounds of label propagation under the balance
    constraint of :obj:`tolerance` :math:`\epsilon` (see the module),
    stopping after a round that moves fewer than 0.1% of the nodes."""
    n = part.size
    size = np.bincount(part, minlength=num_parts)
    cap = max(int(np.ceil((1 + tolerance) * n / num_parts)), int(size.max()))
    # A part's load (the symmetrised degrees of its nodes) may not grow past
    # the largest given or the balanced one.
    degree = np.diff(read_offsets(path)[0])
    load = np.bincount(part, weights=degree, minlength=num_parts).astype(np.int64)
    load_cap = max(int(np.ceil((1 + tolerance) * degree.sum() / num_parts)), int(load.max()))
    del degree
    for _ in range(rounds):
        moved = 0
        for a, b, deg, nbr in neighbour_chunks(path, chunk_entries):
            if nbr.size == 0:
                continue
            # (node, part) pairs with their neighbour counts, sorted by node.
            key = np.repeat(np.arange(b - a, dtype=np.int64), deg) * num_parts + part[nbr]
            key.sort()
            key, count = _runs(key)
            row, target = np.divmod(key, num_parts)
            home = target == part[a:b][row]
            home_count = np.zeros(b - a, dtype=np.int64)
            home_count[row[home]] = count[home]
            # Most neighbours wins, home wins a tie; the gain is the cut saved.
            first = _starts(row)
            winner = first + _first_max(2 * count + home, first)
            winner = winner[~home[winner]]
            node, target = a + row[winner], target[winner]
            gain = count[winner] - home_count[row[winner]]
            weight = deg[node - a]
            light = _within(target, gain, weight, load_cap - load)
            node, target = _balanced(part[node[light]], target[light], node[light],
                                     gain[light], size, cap)
            weight = deg[node - a]
            np.subtract.at(size, part[node], 1)
            np.add.at(size, target, 1)
            np.subtract.at(load, part[node], weight)
            np.add.at(load, target, weight)
            part[node] = target
            moved += node.size
        if moved * 1000 < n:
            break
    return part


def _balanced(source: np.ndarray, target: np.ndarray, node: np.ndarray, gain: np.ndarray,
              size: np.ndarray, cap: int) -> Tuple[np.ndarray, np.ndarray]:
    r"""The moves of :obj:`node` from :obj:`source` to :obj:`target` parts
    that keep every part within :obj:`cap`, best :obj:`gain` first: as many
    moves from part :math:`i` to :math:`j` as from :math:`j` to :math:`i`
    (swaps leave the sizes as they are), then what room is left."""
    k = size.size
    order = np.lexsort((-gain, target, source))
    source, target, node = source[order], target[order], node[order]
    pair = source * k + target
    pairs = np.bincount(pair, minlength=k * k).reshape(k, k)
    swaps = np.minimum(pairs, pairs.T)
    swapped = _rank_in_group(pair) < swaps[source, target]
    rest = np.flatnonzero(~swapped)
    fits = rest[_within(target[rest], gain[order][rest], np.ones(rest.size, np.int64),
                        cap - size)]
    accepted = np.concatenate((np.flatnonzero(swapped), fits))
    return node[accepted], target[accepted]


def _within(target: np.ndarray, gain: np.ndarray, weight: np.ndarray,
            room: np.ndarray) -> np.ndarray:
    r"""A mask of the moves whose :obj:`weight`, added to their
    :obj:`target` best :obj:`gain` first, stays within its :obj:`room`."""
    if target.size == 0:
        return np.zeros(0, dtype=bool)
    order = np.lexsort((-gain, target))
    target, weight = target[order], weight[order]
    total = np.cumsum(weight)
    first = _starts(target)
    before = np.repeat(total[first] - weight[first], np.diff(first, append=target.size))
    keep = np.zeros(order.size, dtype=bool)
    keep[order] = total - before <= room[target]
    return keep


def _rank_in_group(group: np.ndarray) -> np.ndarray:
    r"""The position of every element among equal neighbours of the grouped
    (sorted) array :obj:`group`."""
    if group.size == 0:
        return group
    first = _starts(group)
    return np.arange(group.size) - np.repeat(first, np.diff(first, append=group.size))


def _runs(key: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    r"""The distinct values of the sorted :obj:`key` and their multiplicities."""
    first = _starts(key)
    return key[first], np.diff(first, append=key.size)


def _starts(grouped: np.ndarray) -> np.ndarray:
    r"""Where each run of equal values of the non-empty :obj:`grouped` starts."""
    return np.flatnonzero(np.concatenate(([True], grouped[1:] != grouped[:-1])))


def _first_max(score: np.ndarray, first: np.ndarray) -> np.ndarray:
    r"""For each segment of :obj:`score` starting at :obj:`first`, the
    offset of its first maximum."""
    segment = np.repeat(np.arange(first.size), np.diff(first, append=score.size))
    hit = np.flatnonzero(score == np.maximum.reduceat(score, first)[segment])
    keep = np.concatenate(([True], segment[hit][1:] != segment[hit][:-1]))
    return hit[keep] - first
