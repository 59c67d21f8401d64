r"""Partitioning a graph stored on disk that does not fit in memory.

A *graph folder* holds one ``.npy`` file per array:

=====================  =====================================================
``src.npy``, ``dst.npy``  edge endpoints, int32 or int64, one edge per position
``x.npy``                 node features, float32 or float16, one row per node
``y.npy``                 labels (optional), one row per node
``*_mask.npy``            ``train_mask``, ``val_mask``, ``test_mask`` (optional, bool)
=====================  =====================================================

(:func:`~pyg_dist.datasets.write_rmat` writes one; OGB's binary layout is
converted by :func:`~pyg_dist.datasets.ogb_to_graph_dir`). Every pass reads
these files in chunks, so memory holds a chunk (or a spilled bucket of
about :math:`2^{25}` edges) and node-sized arrays (the assignment, the
relabelling, the degrees: 4 to 8 bytes per node each), never the edges of
the whole graph or of a part:

1. check the files, hash the edges and count the degrees (one pass);
2. write the symmetrised, de-duplicated graph for the partitioner
   (:func:`~pyg_dist.partition.parhip.write_symmetric`) and partition it:
   KaMinPar (on a sample of the edges above ``partitioner_degree``, then
   refined on all of them) or METIS; or assign at random;
3. spill each edge, relabelled, to a bucket of consecutive targets of one
   part (one pass); sort each bucket alone and mark its sources: the halos;
4. per part, its exchange plan and part file, and its ``edge_index`` in
   ``part_{r}_edge_index.npy``, written bucket by bucket;
5. copy the feature rows to one ``part_{r}_x.npy`` per part (one pass).

Ranks memory-map both ``.npy`` files (:meth:`pyg_dist.DistData.load`).

The parts equal those :func:`~pyg_dist.partition_graph` builds in memory
for the same assignment, tensor for tensor. They are written to a staging
folder inside the root and swapped in once complete
(:func:`~pyg_dist.partition.staging.staged`): an interrupted or failed run
leaves the root as it was, its partition whole. Before any work, the disk
space the run takes at its peak (:func:`disk_bytes`) is checked against
the free space of the root's filesystem.
"""
import hashlib
import os
import os.path as osp
import shutil
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from pyg_dist.integrity import Sum64, read_json, save_checked
from pyg_dist.labels import LABELLED, label_classes
from pyg_dist.partition.book import (FORMAT_VERSION, PartitionBook, edges_file, features_file,
                                     owner_of, part_file, partitioning_id, versions)
from pyg_dist.partition.kaminpar import kaminpar_assignment
from pyg_dist.partition.balance import (balance as balance_parts, check_balance,
                                        partitioner_weights, weight_columns)
from pyg_dist.partition.metis import OBJECTIVES, metis_csr_assignment, random_assignment
from pyg_dist.partition.parhip import (add_node_weights, id_format, read_csr, spill_by_range,
                                      write_sampled, write_symmetric)
from pyg_dist.partition.refine import refine
from pyg_dist.partition.staging import check_free_space, progress_bar, staged
from pyg_dist.utils.npy import GraphFileError, NpyReader, NpyWriter

MASKS = LABELLED  # the masks a graph folder may hold
METHODS = ("kaminpar", "metis", "random")
# Edges per chunk: the passes hold a few int64 arrays of this length.
CHUNK_EDGES = 1 << 23
CHUNK_NODES = 1 << 20
# Scratch files, inside the staging folder (pyg_dist.partition.staging).
WORK_DIR = "work"
# KaMinPar reads at most this many neighbours per node on average (a sample
# beyond), which bounds its memory (alone at R-MAT 2^24: 3.3 GiB reading
# 201M neighbours, 2.5 GiB reading 134M; measured). After refinement, the cut
# against KaMinPar on every edge: R-MAT 2^22 (degree 30) 64.2% of the edges
# vs 67.1-67.7%; two seeds each, a community graph (degree 20) 3.4-3.5% vs
# 3.1-3.7% and Reddit-shaped (degree 100) 31.8-32.2% vs 31.1-31.2%.
PARTITIONER_DEGREE = 8.0


class GraphFolder:
    r"""The arrays of a graph folder, checked (shapes, dtypes, lengths;
    every failure is one line naming the file) but not read."""

    def __init__(self, folder: str, balance: Sequence[str] = ()):
        if not osp.isdir(folder):
            raise GraphFileError(f"'{folder}' is not a folder (a graph folder holds "
                                 f"src.npy, dst.npy and x.npy)")
        self.folder = folder
        self.src, self.dst, self.x = (NpyReader(self.path(n)) for n in ("src", "dst", "x"))
        for edge in (self.src, self.dst):
            if len(edge.shape) != 1 or edge.dtype.kind not in "iu":
                raise GraphFileError(f"'{edge.path}' must be a 1-D array of integer node "
                                     f"ids (it is {edge.dtype} of shape {edge.shape})")
        if len(self.src) != len(self.dst):
            raise GraphFileError(f"'{self.src.path}' has {len(self.src):,} edges but "
                                 f"'{self.dst.path}' {len(self.dst):,}")
        if len(self.x.shape) != 2 or self.x.dtype not in (np.float32, np.float16):
            raise GraphFileError(f"'{self.x.path}' must be a [num_nodes, F] float32 or "
                                 f"float16 array (it is {self.x.dtype} of shape {self.x.shape})")
        self.num_nodes, self.num_edges = len(self.x), len(self.src)
        self.y = self._node_array("y") if osp.exists(self.path("y")) else None
        self.masks = {k: self._node_array(k, bool) for k in MASKS if osp.exists(self.path(k))}
        for key in check_balance(balance):
            if key.endswith("_mask") and key not in self.masks:
                raise GraphFileError(f"balance names '{key}', but '{self.path(key)}' does "
                                     f"not exist (pass balance=() or --balance none)")

    def path(self, name: str) -> str:
        return osp.join(self.folder, name + ".npy")

    def _node_array(self, name: str, dtype=None) -> NpyReader:
        array = NpyReader(self.path(name))
        if len(array) != self.num_nodes or (dtype is not None and array.dtype != dtype):
            raise GraphFileError(f"'{array.path}' must hold one {dtype or 'row'} per node "
                                 f"({self.num_nodes:,}, the rows of x.npy): it is "
                                 f"{array.dtype} of shape {array.shape}")
        return array

    def edge_chunks(self, size: int = CHUNK_EDGES) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        r"""``(src, dst)`` int64 chunks of :obj:`size` edges, in order."""
        for start in range(0, self.num_edges, size):
            yield (self.src.read(start, start + size).astype(np.int64, copy=False),
                   self.dst.read(start, start + size).astype(np.int64, copy=False))


def _label_classes(graph: GraphFolder, num_classes: Optional[int]) -> Optional[int]:
    r"""The classes of the folder's labels, checked before any work
    (:func:`~pyg_dist.labels.label_classes`); declared by :obj:`num_classes`
    or else by ``graph.json``'s ``num_classes`` where it has one (as
    ``pyg-dist rmat`` writes it). ``None`` for a folder without ``y.npy``."""
    if graph.y is None:
        if num_classes is not None:
            raise GraphFileError(f"num_classes={num_classes} was given, but "
                                 f"'{graph.path('y')}' does not exist")
        return None
    described = osp.join(graph.folder, "graph.json")
    if num_classes is None and osp.exists(described):
        declared = read_json(described)
        if isinstance(declared, dict) and isinstance(declared.get("num_classes"), int):
            num_classes = declared["num_classes"]
    return label_classes(graph.y.read(), {k: m.read() for k, m in graph.masks.items()},
                         f"'{graph.path('y')}'", num_classes)


def scan_edges(graph: GraphFolder, chunk: int) -> Tuple[str, np.ndarray, np.ndarray]:
    r"""One pass over the edges: ids in range (else one line naming the
    file), the graph hash (equal to :func:`~pyg_dist.partition.graph_hash`
    of the same graph in memory) and the out- and in-degrees."""
    digest = hashlib.sha256(str((graph.num_nodes, graph.x.shape)).encode())
    degrees = []
    for array in (graph.src, graph.dst):  # the hash sees all sources, then all targets
        degree = np.zeros(graph.num_nodes, dtype=np.int64)
        for start, ids in array.chunks(chunk):
            if ids.size and (ids.min() < 0 or ids.max() >= graph.num_nodes):
                bad = int(np.flatnonzero((ids < 0) | (ids >= graph.num_nodes))[0])
                raise GraphFileError(f"'{array.path}' holds node id {int(ids[bad])} at "
                                     f"position {start + bad:,}, outside [0, "
                                     f"{graph.num_nodes:,}) (the rows of x.npy)")
            ids = ids.astype(np.int64, copy=False)
            digest.update(ids.tobytes())
            degree += np.bincount(ids, minlength=graph.num_nodes)
        # Held until the part files: 4 bytes per node when the degrees fit.
        degrees.append(degree.astype(np.int32) if degree.max(initial=0) < 2**31 else degree)
    return digest.hexdigest()[:16], degrees[0], degrees[1]


def partition_folder(
    folder: str,
    num_parts: int,
    root: str,
    method: str = "kaminpar",
    objective: str = "vol",
    balance: Optional[Sequence[str]] = None,
    seed: int = 0,
    progress: bool = False,
    chunk_edges: int = CHUNK_EDGES,
    bucket_entries: int = 1 << 25,
    partitioner_degree: Optional[float] = PARTITIONER_DEGREE,
    num_classes: Optional[int] = None,
) -> PartitionBook:
    r"""Partitions the graph folder :obj:`folder` (see the module) into
    :obj:`num_parts` parts written to :obj:`root`, in memory bounded by the
    chunk sizes and the node count (see the module), never by the edges.

    ``method="kaminpar"`` (the default) and ``"metis"`` partition the
    symmetrised graph (KaMinPar minimises the edge cut, METIS the
    :obj:`objective`), ``"random"`` assigns uniformly; the masks named in
    :obj:`balance` (default: those the folder holds) are then balanced as
    :func:`~pyg_dist.partition_graph` does. KaMinPar's result varies from run
    to run (the assignment written to ``book.pt`` is what every rank reads).

    KaMinPar's memory grows with the edges it reads (R-MAT, 2^24 nodes: the
    step peaked at 5.4 GiB reading all 521M neighbour entries, at 3.2 GiB
    reading a sample of 134M; measured): when the symmetrised graph averages more than
    :obj:`partitioner_degree` neighbours per node, it partitions a sample
    that keeps each undirected edge with probability
    ``partitioner_degree / average degree`` (``None``: every edge). Its
    result is then refined on the whole graph
    (:func:`~pyg_dist.partition.refine.refine`).
    ``meta["partitioner_input"]`` records what it read.

    The parts are written beside the partition already in :obj:`root` and
    swapped in once complete (:func:`~pyg_dist.partition.staging.staged`:
    a failed or interrupted run leaves that one whole). A run whose
    :func:`disk_bytes` exceed the free space of :obj:`root`'s filesystem is
    refused before any work
    (:class:`~pyg_dist.partition.staging.NoSpaceError`).
    """
    if method not in METHODS:
        raise ValueError(f"Unknown method '{method}' for a graph folder (choose from "
                         f"{', '.join(METHODS)}; 'block' needs the graph in memory)")
    if partitioner_degree is not None and not partitioner_degree > 0:
        raise ValueError(f"partitioner_degree must be positive (or None: no sampling), "
                         f"got {partitioner_degree!r}")
    if objective not in OBJECTIVES:
        raise ValueError(f"Unknown METIS objective '{objective}' (choose from "
                         f"{', '.join(OBJECTIVES)})")
    graph = GraphFolder(folder, () if balance is None else balance)
    balance = ("edges", *graph.masks) if balance is None else tuple(balance)
    if not isinstance(num_parts, int) or not 1 <= num_parts <= graph.num_nodes:
        raise ValueError(f"num_parts must be an integer in [1, {graph.num_nodes}] (the "
                         f"nodes of '{folder}'), got {num_parts!r}")
    num_classes = _label_classes(graph, num_classes)
    runs_partitioner = method != "random" and num_parts > 1
    names = ["check edges", *(["partitioner input", method] if runs_partitioner else []),
             "edges to parts", "part files", "features"]
    _check_space(graph, num_parts, runs_partitioner, root)
    # Written beside the partition in root, which stays whole until this one
    # is complete; the bar is closed before the message of a failure.
    with staged(root) as stage, progress_bar(total=len(names), unit="step",
                                             desc=f"partition {folder} ({method})",
                                             disable=not progress) as bar:
        steps, work = _Steps(bar), osp.join(stage, WORK_DIR)
        os.makedirs(work)
        with steps("check edges"):
            ghash, deg_out, deg_in = scan_edges(graph, chunk_edges)
        # Node-sized arrays wait on disk while the partitioner runs (its peak
        # is the run's); the masks are read for the balancing, after it.
        degrees = osp.join(work, "degrees.npy")
        np.save(degrees, np.stack((deg_out, deg_in)))
        del deg_out, deg_in
        if not runs_partitioner:
            assignment = random_assignment(graph.num_nodes, num_parts, seed)
            partitioner_input = None
        else:
            path = osp.join(work, "graph.parhip")
            with steps("partitioner input"):
                entries = write_symmetric(lambda: graph.edge_chunks(chunk_edges),
                                          graph.num_nodes, graph.num_edges, path, work,
                                          bucket_entries)
            with steps(method):
                assignment, partitioner_input = _partition(
                    path, graph.num_nodes, entries, num_parts, method, objective,
                    balance, graph.masks, degrees, seed, partitioner_degree)
        deg_out, deg_in = np.load(degrees)
        with steps("edges to parts"):
            book, buckets, halos, edge_cut = _spill_edges(
                graph, assignment, deg_in, num_parts, work, chunk_edges, bucket_entries)
        with steps("part files"):
            files, part_stats = _write_parts(graph, book, buckets, halos, deg_in,
                                             deg_out, ghash, stage, chunk_edges)
            comm_volume = int(sum(h.size for h in halos))
            del halos, deg_in, deg_out  # node-sized: not held while the features stream
        with steps("features"):
            files.update(_write_features(graph, assignment.numpy(), num_parts, stage))
        shutil.rmtree(work)  # not swapped in (on a failure, the stage goes whole)

        mask_counts = {key: sum(stat[key] for stat in part_stats)  # each part's, summed
                       for key in (f"num_{k.split('_')[0]}" for k in MASKS if k in graph.masks)}
        book.meta = {
            "format_version": FORMAT_VERSION, "graph_hash": ghash,
            "partitioning_id": partitioning_id(ghash, book.perm, book.partptr),
            "num_parts": num_parts, "method": method,
            "objective": objective if method == "metis" else None,
            "balance": list(balance), "seed": seed, "block_hops": None,
            "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
            "num_features": int(graph.x.shape[1]),
            "num_classes": num_classes,
            "partitioner_input": partitioner_input,
            "edge_cut": edge_cut, "edge_cut_ratio": edge_cut / max(graph.num_edges, 1),
            "comm_volume": comm_volume,
            **mask_counts, "parts": part_stats, "versions": versions(),
            "source": osp.abspath(folder), "files": files, "steps": steps.done,
        }
        book.save(stage)  # meta.json last: its presence marks a complete write
    return book


def disk_bytes(graph: GraphFolder, num_parts: int, runs_partitioner: bool = True) -> int:
    r"""An upper bound of the disk space :func:`partition_folder` takes at
    its peak, from the sizes of :obj:`graph` alone (:math:`N` nodes,
    :math:`E` edges, :math:`H \le \min(E, (K - 1) N)` halo nodes over the
    :math:`K` parts):

    * what it writes: the parts' ``edge_index`` (:math:`16 E`), the
      feature rows (the size of ``x.npy``), the part files (per inner or
      halo node four int64 ids and degrees, per halo node three more; the
      labels and masks of the inner nodes) and the book (:math:`8 N`);
    * its scratch files at their peak, while the part files are written:
      the degrees (:math:`16 N`), the partitioner's input (:math:`8 N` of
      offsets and :math:`2 E` neighbour ids, 4 or 8 bytes each) and the
      edges spilled by target (:math:`8 E`); or, when building that input,
      both directions of every edge spilled (:math:`16 E`).
    """
    n, e = graph.num_nodes, graph.num_edges
    halo = min(e, (num_parts - 1) * n)
    labels = sum(_nbytes(a) for a in (graph.y, *graph.masks.values()) if a is not None)
    written = (16 * e + _nbytes(graph.x) + 32 * (n + halo) + 24 * halo + labels + 8 * n
               + num_parts * (4096 + 16 * num_parts))
    parhip = 8 * (n + 1) + 2 * e * id_format(n)[1].itemsize if runs_partitioner else 0
    scratch = 16 * n + max(parhip + 8 * e, 16 * e if runs_partitioner else 0)
    return written + scratch


def _nbytes(array: NpyReader) -> int:
    return int(np.prod(array.shape)) * array.dtype.itemsize


def _check_space(graph: GraphFolder, num_parts: int, runs_partitioner: bool,
                 root: str) -> None:
    r"""Refuses (:class:`~pyg_dist.partition.staging.NoSpaceError`, before
    any work) a partition whose :func:`disk_bytes` exceed the free space on
    the filesystem of :obj:`root` (the partition already there stays until
    the new one is complete: its space is not counted as free)."""
    check_free_space(disk_bytes(graph, num_parts, runs_partitioner), root,
                     f"partitioning '{graph.folder}' into {num_parts} parts")


def _partition(path: str, num_nodes: int, entries: int, num_parts: int, method: str,
               objective: str, balance: Sequence[str], masks: Dict[str, NpyReader],
               degrees: str, seed: int, partitioner_degree: Optional[float]
               ) -> Tuple[torch.Tensor, Dict[str, Any]]:
    r"""The assignment of the symmetrised graph in the ParHIP file
    :obj:`path` (:obj:`num_nodes` nodes, :obj:`entries` neighbour ids), with
    what :obj:`balance` names balanced (:mod:`~pyg_dist.partition.balance`:
    the in-edges, from the in-degrees in :obj:`degrees`, which the
    partitioner also weighs nodes by, and :obj:`masks`, read once the
    partitioner is done), and what the partitioner read."""
    read = {"neighbours": entries, "keep_probability": 1.0, "refined": False}
    edges = "edges" in balance
    node_weights = partitioner_weights(np.load(degrees)[1]) if edges else None
    if method == "kaminpar":
        if node_weights is not None:
            add_node_weights(path, node_weights)
        del node_weights  # on disk now: not held beside KaMinPar's peak
        keep = (1.0 if partitioner_degree is None or entries == 0
                else partitioner_degree * num_nodes / entries)
        if keep < 1.0:
            sample = path + ".sample"
            read.update(neighbours=write_sampled(path, sample, keep, seed),
                        keep_probability=keep)
            part = kaminpar_assignment(sample, num_parts, seed).numpy()
            os.remove(sample)
        else:
            part = kaminpar_assignment(path, num_parts, seed).numpy()
        assignment = torch.from_numpy(refine(path, part, num_parts))
        read["refined"] = True
    # The CSR is mapped only for METIS or the balancing (and after KaMinPar,
    # whose peak it would add to).
    csr = read_csr(path) if method == "metis" else None
    if csr is not None:
        assignment = metis_csr_assignment(*csr, num_parts, objective, seed, node_weights)
    if num_parts > 1 and (edges or any(k in masks for k in balance)):
        rowptr, col = csr or read_csr(path)
        names, weights = weight_columns(balance, np.load(degrees)[1],
                                        {k: masks[k].read() for k in balance if k in masks})
        balance_parts(assignment.numpy(), rowptr, col, weights, num_parts,
                      edges=names.index("edges") if edges else None)
    return assignment, read


class _Steps:
    r"""Times the named steps of a run (``meta["steps"]``: when each
    started, in seconds since the epoch, and how long it took) and shows
    them on the progress bar :obj:`bar`."""

    def __init__(self, bar):
        self.bar = bar
        self.done: List[Dict[str, Any]] = []

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.bar.set_postfix_str(name)
        started, clock = time.time(), time.perf_counter()
        yield
        self.done.append({"step": name, "started": started,
                          "seconds": time.perf_counter() - clock})
        self.bar.update()


def _spill_edges(graph: GraphFolder, assignment: torch.Tensor, deg_in: np.ndarray,
                 num_parts: int, work: str, chunk_edges: int, bucket_entries: int):
    r"""Relabels nodes part by part and appends every edge, as the key
    ``target * N + source`` of relabelled ids, to the spill file of its
    target's range: consecutive targets of one part with about
    :obj:`bucket_entries` in-edges (known from :obj:`deg_in`). Each file is
    then sorted alone (together in order: the (target, source) order of the
    part files) and its sources marked, giving each part's halo; memory
    holds node-sized arrays and one chunk or one file of keys."""
    n = graph.num_nodes
    part = assignment.numpy()
    perm = np.argsort(part, kind="stable")
    inv_perm = np.empty_like(perm)
    inv_perm[perm] = np.arange(n)
    partptr = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(part, minlength=num_parts), out=partptr[1:])
    first_node = _bucket_bounds(deg_in[perm], partptr, bucket_entries)
    spills = [osp.join(work, f"edges_{b}.bin") for b in range(first_node.size - 1)]
    edge_cut = 0

    def keys():  # counts the cut on the way
        nonlocal edge_cut
        for src, dst in graph.edge_chunks(chunk_edges):
            edge_cut += int((part[src] != part[dst]).sum())
            yield inv_perm[dst] * n + inv_perm[src]

    spill_by_range(keys(), first_node * n, spills)
    inv_perm = None  # 8 bytes per node, not needed by the sorts
    buckets: List[List[str]] = [[] for _ in range(num_parts)]
    halos = []
    seen = np.zeros(n, dtype=bool)  # marking beats hashing (np.unique) 10x here
    owner = np.searchsorted(partptr, first_node[:-1], side="right") - 1
    for r in range(num_parts):
        for b in np.flatnonzero(owner == r):
            key = np.fromfile(spills[b], dtype=np.int64)
            key.sort()
            key.tofile(spills[b])
            seen[np.remainder(key, n, out=key)] = True  # the sources
            buckets[r].append(spills[b])
        seen[partptr[r]:partptr[r + 1]] = False
        halos.append(np.flatnonzero(seen))
        seen[halos[-1]] = False
    book = PartitionBook(torch.from_numpy(partptr), torch.from_numpy(perm))
    return book, buckets, halos, edge_cut


def _bucket_bounds(count: np.ndarray, partptr: np.ndarray, bucket_entries: int) -> np.ndarray:
    r"""First nodes of consecutive node ranges, each inside one part and
    with about :obj:`bucket_entries` of :obj:`count` (more only for a node
    that has more alone), ending with :math:`N`."""
    cumulative = np.concatenate(([0], np.cumsum(count)))
    bounds = [partptr[:-1]]
    for r in range(partptr.size - 1):
        lo, hi = int(partptr[r]), int(partptr[r + 1])
        targets = np.arange(cumulative[lo] + bucket_entries, cumulative[hi], bucket_entries)
        bounds.append(np.searchsorted(cumulative, targets, side="right") - 1)
    first = np.unique(np.concatenate(bounds))
    return np.concatenate((first[first < count.size], [count.size]))  # empty last parts


def _write_parts(graph: GraphFolder, book: PartitionBook, buckets: List[List[str]],
                 halos: List[np.ndarray], deg_in: np.ndarray, deg_out: np.ndarray,
                 ghash: str, root: str, chunk_edges: int):
    r"""Part ``r``'s file, built from its sorted key files exactly as
    :func:`~pyg_dist.partition.partition.build_parts` builds it in memory,
    with ``x`` (in ``part_{r}_x.npy``, :func:`_write_features`) and
    ``edge_index`` (in ``part_{r}_edge_index.npy``, written here one key
    file at a time) kept apart."""
    n, num_parts = graph.num_nodes, book.num_parts
    partptr, perm = book.partptr, book.perm
    partitioning = partitioning_id(ghash, perm, partptr)
    node_arrays = {k: a.read() for k, a in (("y", graph.y), *graph.masks.items())
                   if a is not None}
    files, stats = {}, []
    local = np.empty(n, dtype=np.int64)
    for r in range(num_parts):
        lo, hi = int(partptr[r]), int(partptr[r + 1])
        halo = torch.from_numpy(halos[r])
        halo_owner = owner_of(halo, partptr)
        global_id = torch.cat([torch.arange(lo, hi), halo])
        local[lo:hi] = np.arange(hi - lo)  # global -> local id of this part's nodes
        local[halos[r]] = (hi - lo) + np.arange(halo.numel())
        num_edges = sum(osp.getsize(b) for b in buckets[r]) // 8
        files[edges_file(r)] = _write_edge_index(
            osp.join(root, edges_file(r)), buckets[r], num_edges, chunk_edges,
            source=lambda key: local[key % n], target=lambda key, lo=lo: key // n - lo)
        send = [torch.from_numpy(h[(h >= lo) & (h < hi)] - lo) for h in halos]
        inner_orig = perm[lo:hi].numpy()
        item: Dict[str, Any] = {
            "format_version": FORMAT_VERSION, "rank": r, "num_parts": num_parts,
            "num_inner": hi - lo, "num_halo": halo.numel(),
            "global_id": global_id, "n_id": perm[global_id],
            "halo_owner": halo_owner, "halo_remote_id": halo - partptr[halo_owner],
            "deg_in": torch.from_numpy(deg_in)[perm[global_id]].long(),
            "deg_out": torch.from_numpy(deg_out)[perm[global_id]].long(),
            "send_index": torch.cat(send),
            "send_counts": torch.tensor([t.numel() for t in send]),
            "recv_counts": torch.bincount(halo_owner, minlength=num_parts),
            "partptr": partptr,
            "graph_hash": ghash, "partitioning_id": partitioning,
            "x_file": features_file(r), "edge_index_file": edges_file(r),
            **{k: torch.from_numpy(a[inner_orig]) for k, a in node_arrays.items()},
        }
        files[osp.basename(part_file(root, r))] = save_checked(item, part_file(root, r))
        stats.append({
            "part": r, "num_inner": hi - lo, "num_halo": halo.numel(),
            "halo_ratio": halo.numel() / max(hi - lo, 1), "num_edges": num_edges,
            **{f"num_{k.split('_')[0]}": int(node_arrays[k][inner_orig].sum())
               for k in MASKS if k in node_arrays},
        })
    return files, stats


def _write_edge_index(path: str, buckets: List[str], num_edges: int, chunk: int,
                      source, target) -> Dict[str, int]:
    r"""Writes the ``[2, E]`` int64 ``edge_index`` of a part from its sorted
    key files: the :obj:`source` ids of every key, then the :obj:`target`
    ids (two passes, :obj:`chunk` keys at a time); returns its description."""
    digest = Sum64()
    writer = NpyWriter(path, (2, num_edges), np.int64, digest=digest)
    try:
        for row in (source, target):
            for bucket in buckets:
                for start in range(0, osp.getsize(bucket) // 8, chunk):
                    writer.append(row(np.fromfile(bucket, dtype=np.int64, count=chunk,
                                                  offset=8 * start)))
    except BaseException:
        writer.abort()
        raise
    writer.close()
    for bucket in buckets:
        os.remove(bucket)
    return digest.describe()


def _write_features(graph: GraphFolder, part: np.ndarray, num_parts: int,
                    root: str) -> Dict[str, Dict[str, int]]:
    r"""One pass over ``x.npy`` in node chunks, each row appended to its
    part's ``part_{r}_x.npy`` (original order within a part, the order of
    the relabelled ids); returns the files' descriptions."""
    sizes = np.bincount(part, minlength=num_parts)
    digests = [Sum64() for _ in range(num_parts)]
    writers = [NpyWriter(osp.join(root, features_file(r)), (int(sizes[r]), graph.x.shape[1]),
                         graph.x.dtype, digest=digests[r]) for r in range(num_parts)]
    rows = max(1, CHUNK_NODES * 16 // max(graph.x.shape[1], 1))  # ~64 MiB of fp32
    try:
        for start, x in graph.x.chunks(rows):
            owner = part[start:start + len(x)]
            for r in range(num_parts):
                writers[r].write(x[owner == r])
    except BaseException:
        for w in writers:
            w.abort()
        raise
    for w in writers:
        w.close()
    return {features_file(r): digests[r].describe() for r in range(num_parts)}
