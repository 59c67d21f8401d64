r"""The symmetrised, loop-free, de-duplicated graph a partitioner needs,
built from edge chunks on disk in bounded memory and stored in KaMinPar's
(ParHIP) binary format, which METIS reads back memory-mapped.

The file is a 24-byte header ``[version, n, m]`` (``uint64``), then
``n + 1`` byte offsets of the neighbour lists (``uint64``), then the ``m``
neighbour ids: ``uint32`` when every id fits (version 11), else
``uint64`` (version 3); then, in a file with node weights (versions 9 and
1, :func:`add_node_weights`), ``n`` weights (``uint64``), which KaMinPar
balances. KaMinPar reads the whole file before compressing it, so the
narrower ids halve its peak memory.
"""
import math
import os
import os.path as osp
from typing import Callable, Iterable, Iterator, Optional, Sequence, Tuple

import numpy as np

from pyg_dist.utils import distinct

HEADER_BYTES = 24
OFFSET = np.dtype("<u8")
# ParHIP's version bits: 1 = no edge weights, 2 = no node weights,
# 8 = 32-bit node ids (unset: 64-bit).
VERSIONS = {3: np.dtype("<u8"), 11: np.dtype("<u4")}
NO_NODE_WEIGHTS = 2
WEIGHT = np.dtype("<u8")


def id_format(num_nodes: int) -> Tuple[int, np.dtype]:
    r"""The version and neighbour id type of a ParHIP file of :obj:`num_nodes`
    nodes: 32-bit ids whenever they fit."""
    return (11, VERSIONS[11]) if num_nodes <= np.iinfo(np.uint32).max else (3, VERSIONS[3])


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

    version, id_type = id_format(num_nodes)
    degree = np.zeros(num_nodes, dtype=np.int64)
    entries = 0
    with open(path + ".tmp", "wb") as out:
        out.seek(HEADER_BYTES + (num_nodes + 1) * OFFSET.itemsize)
        for b, spill in enumerate(spills):
            key = distinct(np.fromfile(spill, dtype=np.int64))
            os.remove(spill)
            lo = b * per_bucket
            hi = min(lo + per_bucket, num_nodes)
            degree[lo:hi] = np.bincount(key // num_nodes - lo, minlength=hi - lo)
            out.write((key % num_nodes).astype(id_type).tobytes())
            entries += key.size
            del key
        out.seek(0)
        out.write(_header_and_offsets(version, id_type, degree, entries))
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
    version, id_type = id_format(rowptr.size - 1)
    with open(path + ".tmp", "wb") as out:
        out.write(_header_and_offsets(version, id_type, np.diff(rowptr), col.size))
        out.write(col.astype(id_type).tobytes())
    os.replace(path + ".tmp", path)


def _header_and_offsets(version: int, id_type: np.dtype, degree: np.ndarray,
                        entries: int) -> bytes:
    num_nodes = degree.size
    offsets = np.zeros(num_nodes + 1, dtype=OFFSET)
    np.cumsum(degree, out=offsets[1:])
    offsets *= id_type.itemsize
    offsets += HEADER_BYTES + (num_nodes + 1) * OFFSET.itemsize
    return np.array([version, num_nodes, entries], dtype=OFFSET).tobytes() + offsets.tobytes()


def read_offsets(path: str) -> Tuple[np.ndarray, int, np.dtype]:
    r"""The row pointer (int64, in entries) of the ParHIP file :obj:`path`
    (without edge weights), the byte position of its first neighbour id and
    the ids' type."""
    header = np.fromfile(path, dtype=OFFSET, count=3)
    version = int(header[0]) | NO_NODE_WEIGHTS if header.size == 3 else None
    if version not in VERSIONS:
        raise ValueError(f"'{path}' is not a ParHIP file of version 3, 11 or (with node "
                         f"weights) 1, 9")
    num_nodes, id_type = int(header[1]), VERSIONS[version]
    start = HEADER_BYTES + (num_nodes + 1) * OFFSET.itemsize
    offsets = np.fromfile(path, dtype=OFFSET, count=num_nodes + 1, offset=HEADER_BYTES)
    return ((offsets - start) // id_type.itemsize).astype(np.int64), start, id_type


def read_csr(path: str) -> Tuple[np.ndarray, np.ndarray]:
    r"""``(rowptr, col)`` of the ParHIP file :obj:`path`: ``rowptr`` (int64)
    in memory, ``col`` memory-mapped copy-on-write (uint32 or int64)."""
    rowptr, start, id_type = read_offsets(path)
    col_type = np.uint32 if id_type.itemsize == 4 else np.int64
    return rowptr, np.memmap(path, dtype=col_type, mode="c", offset=start,
                             shape=(int(rowptr[-1]), ))


def add_node_weights(path: str, weights: np.ndarray) -> None:
    r"""Gives the nodes of the ParHIP file :obj:`path` the :obj:`weights`
    (positive integers, one per node) that a partitioner balances; readers
    of the graph are unaffected."""
    rowptr, start, id_type = read_offsets(path)
    end = start + int(rowptr[-1]) * id_type.itemsize
    with open(path, "r+b") as f:
        version = int(np.frombuffer(f.read(8), dtype=OFFSET)[0])
        f.seek(0)
        f.write(np.array([version & ~NO_NODE_WEIGHTS], dtype=OFFSET).tobytes())
        f.truncate(end)
        f.seek(end)
        f.write(np.asarray(weights, dtype=WEIGHT).tobytes())


def node_weights(path: str) -> Optional[np.ndarray]:
    r"""The node weights of the ParHIP file :obj:`path` (``None``: none)."""
    if int(np.fromfile(path, dtype=OFFSET, count=1)[0]) & NO_NODE_WEIGHTS:
        return None
    rowptr, start, id_type = read_offsets(path)
    return np.fromfile(path, dtype=WEIGHT, count=rowptr.size - 1,
                       offset=start + int(rowptr[-1]) * id_type.itemsize)


def neighbour_chunks(path: str, chunk_entries: int = 1 << 23
                     ) -> Iterator[Tuple[int, int, np.ndarray, np.ndarray]]:
    r"""``(a, b, degree, neighbours)`` for consecutive node ranges
    ``[a, b)`` of the ParHIP file :obj:`path` holding about
    :obj:`chunk_entries` neighbour ids each (a node of higher degree alone),
    read rather than mapped (mapped pages would count in the reader's RSS);
    neighbours as int64."""
    rowptr, start, id_type = read_offsets(path)
    n, a = rowptr.size - 1, 0
    while a < n:
        b = int(np.searchsorted(rowptr, rowptr[a] + chunk_entries, side="right")) - 1
        b = min(max(b, a + 1), n)
        count = int(rowptr[b] - rowptr[a])
        ids = np.fromfile(path, dtype=id_type, count=count,
                          offset=start + int(rowptr[a]) * id_type.itemsize)
        yield a, b, np.diff(rowptr[a:b + 1]), ids.astype(np.int64)
        a = b


def write_sampled(path: str, out_path: str, keep: float, seed: int = 0,
                  chunk_entries: int = 1 << 23) -> int:
    r"""Writes to :obj:`out_path` the graph of the ParHIP file :obj:`path`
    with every undirected edge kept with probability :obj:`keep`, both of
    its directions or neither (a hash of the node pair and :obj:`seed`
    decides); returns the kept neighbour entries."""
    rowptr = read_offsets(path)[0]
    num_nodes = rowptr.size - 1
    version, id_type = id_format(num_nodes)
    degree = np.zeros(num_nodes, dtype=np.int64)
    threshold = np.uint64(min(keep, 1.0) * 2.0**53)
    entries = 0
    with open(out_path + ".tmp", "wb") as out:
        out.seek(HEADER_BYTES + (num_nodes + 1) * OFFSET.itemsize)
        for a, b, deg, v in neighbour_chunks(path, chunk_entries):
            u = np.repeat(np.arange(a, b, dtype=np.int64), deg)
            kept = _pair_hash(np.minimum(u, v), np.maximum(u, v), seed) < threshold
            degree[a:b] = np.bincount(u[kept] - a, minlength=b - a)
            out.write(v[kept].astype(id_type).tobytes())
            entries += int(kept.sum())
        out.seek(0)
        out.write(_header_and_offsets(version, id_type, degree, entries))
    os.replace(out_path + ".tmp", out_path)
    weights = node_weights(path)
    if weights is not None:  # the sample is partitioned under the same balance
        add_node_weights(out_path, weights)
    return entries


def _pair_hash(a: np.ndarray, b: np.ndarray, seed: int) -> np.ndarray:
    r"""53 well-mixed bits of the pair ``(a, b)`` and :obj:`seed` (a
    splitmix64 finaliser), uniform in ``[0, 2^53)``."""
    z = a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + b.astype(np.uint64)
    z += np.uint64(seed * 0xD1B54A32D192ED03 % 2**64)  # any Python int seed
    z ^= z >> np.uint64(31)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z >> np.uint64(11)
