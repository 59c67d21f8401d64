r"""Label-propagation refinement of a partition, out of core: the last
step of a multilevel partitioner (KaMinPar refines every level this way),
run on the whole graph when the partitioner saw only a sample of its edges.

Every node wants the part that holds most of its neighbours. Parts hold at
most :math:`\lceil (1 + \epsilon) N / K \rceil` nodes, and a partitioner
leaves them nearly full, so moves from part :math:`i` to :math:`j` are
paired with moves from :math:`j` to :math:`i` (best gain first; the sizes
stay as they are) and the rest fill the room left. Nodes are read in chunks
of neighbour lists from the ParHIP file; a chunk's nodes decide together
from the parts of the chunks before them, so memory holds the assignment,
:math:`K` part sizes and one chunk.
"""
from typing import Tuple

import numpy as np

from pyg_dist.partition.parhip import neighbour_chunks


def refine(path: str, part: np.ndarray, num_parts: int, tolerance: float = 0.03,
           rounds: int = 10, chunk_entries: int = 1 << 23) -> np.ndarray:
    r"""Improves the assignment :obj:`part` (int64, one part per node of the
    ParHIP file :obj:`path`; changed in place and returned) by up to
    :obj:`rounds` rounds of label propagation under the balance
    constraint of :obj:`tolerance` :math:`\epsilon` (see the module),
    stopping after a round that moves fewer than 0.1% of the nodes."""
    n = part.size
    cap = max(int(np.ceil((1 + tolerance) * n / num_parts)),
              int(np.bincount(part, minlength=num_parts).max()))  # never tighter than given
    size = np.bincount(part, minlength=num_parts).astype(np.int64)
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
            first = np.flatnonzero(np.concatenate(([True], row[1:] != row[:-1])))
            winner = first + _first_max(2 * count + home, first)
            winner = winner[~home[winner]]
            node = a + row[winner]
            node, target = _balanced(part[node], target[winner], node,
                                     count[winner] - home_count[row[winner]], size, cap)
            np.subtract.at(size, part[node], 1)
            np.add.at(size, target, 1)
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
    rest = rest[np.lexsort((-gain[order][rest], target[rest]))]  # by target, best first
    room = np.maximum(cap - size, 0)
    fits = rest[_rank_in_group(target[rest]) < room[target[rest]]]
    accepted = np.concatenate((np.flatnonzero(swapped), fits))
    return node[accepted], target[accepted]


def _rank_in_group(group: np.ndarray) -> np.ndarray:
    r"""The position of every element among equal neighbours of the grouped
    (sorted) array :obj:`group`."""
    if group.size == 0:
        return group
    first = np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))
    return np.arange(group.size) - np.repeat(first, np.diff(first, append=group.size))


def _runs(key: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    r"""The distinct values of the sorted :obj:`key` and their multiplicities."""
    first = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    return key[first], np.diff(first, append=key.size)


def _first_max(score: np.ndarray, first: np.ndarray) -> np.ndarray:
    r"""For each segment of :obj:`score` starting at :obj:`first`, the
    offset of its first maximum."""
    segment = np.repeat(np.arange(first.size), np.diff(first, append=score.size))
    hit = np.flatnonzero(score == np.maximum.reduceat(score, first)[segment])
    keep = np.concatenate(([True], segment[hit][1:] != segment[hit][:-1]))
    return hit[keep] - first
