r"""The symmetrised, loop-free, de-duplicated graph a partitioner needs,
built from edge chunks on disk in bounded memory and stored in KaMinPar's
(ParHIP) binary format, which METIS reads back memory-mapped.

The file is a 24-byte header ``[version, n, m]``, then ``n + 1`` byte
offsets of the neighbour lists, then the ``m`` neighbour ids, all
``uint64`` (version 3: no weights, 64-bit ids, the id width of the
``kaminpar`` wheel).
"""
import math
import os
import os.path as osp
from typing import Callable, Iterable, Sequence, Tuple

import numpy as np

from pyg_dist.utils import distinct

HEADER_BYTES = 24
VERSION = 3
ID = np.dtype("<u8")


def write_symmetric(edge_chunks: Callable[[], Iterable[Tuple[np.ndarray, np.ndarray]]],
                    num_nodes: int, num_edges: int, path: str, workdir: str,
                    bucket_entries: int = 1 << 25) -> int:
    r"""Writes the undirected, loop-free, duplicate-free graph of the
    directed edges that :obj:`edge_chunks` yields (``(src, dst)`` int64
    chunks) to the ParHIP file :obj:`path`; returns its number of
    neighbour entries :math:`m` (twice the undirected edges).

    Both directions of every edge go to buckets of consecutive source
    nodes, spilled to :obj:`workdir`; each bucket (about
    :obj:`bucket_entries` entries, 8 bytes each) is then sorted,
    de-duplicated and appended in turn, so memory holds one chunk or one
    bucket at a time plus :math:`8 (N + 1)` bytes of offsets.
    """
    num_buckets = max(1, math.ceil(2 * num_edges / bucket_entries))
    per_bucket = max(1, math.ceil(num_nodes / num_buckets))
    num_buckets = math.ceil(num_nodes / per_bucket) if num_nodes else 1
    spills = [osp.join(workdir, f"sym_{b}.bin") for b in range(num_buckets)]
    first_keys = np.arange(num_buckets + 1, dtype=np.int64) * per_bucket * num_nodes
    first_keys[-1] = num_nodes * num_nodes

    def both_directions():
        for src, dst in edge_chunks():
            keep = src != dst
            yield np.concatenate([src[keep] * num_nodes + dst[keep],
                                  dst[keep] * num_nodes + src[keep]])

    spill_by_range(both_directions(), first_keys, spills)

    degree = np.zeros(num_nodes, dtype=np.int64)
    entries = 0
    with open(path + ".tmp", "wb") as out:
        out.seek(HEADER_BYTES + (num_nodes + 1) * ID.itemsize)
        for b, spill in enumerate(spills):
            key = distinct(np.fromfile(spill, dtype=np.int64))
            os.remove(spill)
            lo = b * per_bucket
            hi = min(lo + per_bucket, num_nodes)
            degree[lo:hi] = np.bincount(key // num_nodes - lo, minlength=hi - lo)
            out.write((key % num_nodes).astype(ID).tobytes())
            entries += key.size
            del key
        offsets = np.zeros(num_nodes + 1, dtype=ID)
        np.cumsum(degree, out=offsets[1:])
        offsets *= ID.itemsize
        offsets += HEADER_BYTES + (num_nodes + 1) * ID.itemsize
        out.seek(0)
        out.write(np.array([VERSION, num_nodes, entries], dtype=ID).tobytes())
        out.write(offsets.tobytes())
    os.replace(path + ".tmp", path)
    return entries


def spill_by_range(keys: Iterable[np.ndarray], first_keys: np.ndarray,
                   paths: Sequence[str]) -> None:
    r"""Appends every chunk of :obj:`keys` to the files :obj:`paths` by
    range: keys in ``[first_keys[i], first_keys[i + 1])`` to ``paths[i]``.
    A chunk is sorted (in place) and cut into slices: faster than grouping
    it by an argsort and a gather."""
    files = [open(p, "wb") for p in paths]
    try:
        for key in keys:
            key.sort()
            bounds = np.searchsorted(key, first_keys)
            for i in np.flatnonzero(np.diff(bounds)):
                files[i].write(key[bounds[i]:bounds[i + 1]].tobytes())
    finally:
        for f in files:
            f.close()


def write_csr(rowptr: np.ndarray, col: np.ndarray, path: str) -> None:
    r"""Writes an in-memory symmetric CSR (``rowptr``, ``col``) as ParHIP."""
    num_nodes = rowptr.size - 1
    offsets = rowptr.astype(ID) * ID.itemsize + HEADER_BYTES + (num_nodes + 1) * ID.itemsize
    with open(path + ".tmp", "wb") as out:
        out.write(np.array([VERSION, num_nodes, col.size], dtype=ID).tobytes())
        out.write(offsets.tobytes())
        out.write(col.astype(ID).tobytes())
    os.replace(path + ".tmp", path)


def read_csr(path: str) -> Tuple[np.ndarray, np.ndarray]:
    r"""``(rowptr, col)`` of the ParHIP file :obj:`path`: ``rowptr`` in
    memory, ``col`` memory-mapped copy-on-write (int64 views)."""
    version, num_nodes, entries = np.fromfile(path, dtype=ID, count=3)
    if version != VERSION:
        raise ValueError(f"'{path}' is a ParHIP file of version {version}, not {VERSION}")
    start = HEADER_BYTES + (int(num_nodes) + 1) * ID.itemsize
    offsets = np.fromfile(path, dtype=ID, count=int(num_nodes) + 1, offset=HEADER_BYTES)
    rowptr = ((offsets - start) // ID.itemsize).astype(np.int64)
    col = np.memmap(path, dtype=np.int64, mode="c", offset=start, shape=(int(entries), ))
    return rowptr, col
