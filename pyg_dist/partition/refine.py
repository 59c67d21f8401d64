r"""Label-propagation refinement of a partition, out of core: the last
step of a multilevel partitioner (KaMinPar refines every level this way),
run on the whole graph when the partitioner saw only a sample of its edges.

Every node moves to the part that holds most of its neighbours when that
part has room: with parts of at most
:math:`\lceil (1 + \epsilon) N / K \rceil` nodes, the balance the
partitioner kept is kept. Nodes are read in chunks of neighbour lists from
the ParHIP file; a chunk's nodes decide together from the parts of the
chunks before them, so memory holds the assignment, :math:`K` part sizes
and one chunk.
"""
from typing import Tuple

import numpy as np

from pyg_dist.partition.parhip import neighbour_chunks


def refine(path: str, part: np.ndarray, num_parts: int, tolerance: float = 0.03,
           rounds: int = 3, chunk_entries: int = 1 << 23) -> np.ndarray:
    r"""Improves the assignment :obj:`part` (int64, one part per node of the
    ParHIP file :obj:`path`; changed in place and returned) by
    :obj:`rounds` rounds of label propagation under the balance
    constraint of :obj:`tolerance` :math:`\epsilon` (see the module)."""
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
            # Most neighbours wins; home wins a tie; full parts cannot win.
            score = np.where(home | (size[target] < cap), 2 * count + home, -1)
            first = np.flatnonzero(np.concatenate(([True], row[1:] != row[:-1])))
            winner = first + _first_max(score, first)
            move = ~home[winner] & (score[winner] > 0)
            node, target = a + row[winner[move]], target[winner[move]]
            node, target = _within_capacity(node, target, size, cap)
            np.subtract.at(size, part[node], 1)
            np.add.at(size, target, 1)
            part[node] = target
            moved += node.size
        if moved == 0:
            break
    return part


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


def _within_capacity(node: np.ndarray, target: np.ndarray, size: np.ndarray,
                     cap: int) -> Tuple[np.ndarray, np.ndarray]:
    r"""The moves (in node order per target) that keep every target part
    within :obj:`cap` nodes."""
    order = np.argsort(target, kind="stable")
    node, target = node[order], target[order]
    first = np.flatnonzero(np.concatenate(([True], target[1:] != target[:-1])))
    rank = np.arange(target.size) - np.repeat(first, np.diff(first, append=target.size))
    fits = size[target] + rank < cap
    return node[fits], target[fits]
