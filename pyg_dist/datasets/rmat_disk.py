r"""The R-MAT graph of :func:`~pyg_dist.datasets.rmat` written straight to a
graph folder, in chunks, for graphs that do not fit in memory as a
:class:`~torch_geometric.data.Data` (Graph500 scale 24: 16.8M nodes, 268M
edges, an 8 GiB feature matrix).
"""
import math
import os.path as osp
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Tuple

import numpy as np
import torch
from torch import Tensor

from pyg_dist.partition.staging import check_free_space, progress_bar
from pyg_dist.utils.npy import (NpyWriter, check_empty_graph_folder, write_graph_json,
                                writing_graph_folder)

# Edges drawn from one random stream: small enough that a block's
# temporaries stay in cache, large enough that numpy's per-call overhead
# vanishes. Blocks, not chunks, carry the streams, so the files do not
# depend on `chunk_edges`.
_EDGE_BLOCK = 1 << 16
# Edges summed at a time: `scatter_add_`'s sort then runs in cache (1.5x
# faster than on 2**20 edges at scale 24).
_SUM_EDGES = 1 << 16
# Bytes of float32 features per node block.
_FEATURE_BYTES = 1 << 24
# The independent random streams of a graph (`SeedSequence` spawn keys).
_EDGES, _PERM, _FIELD, _CENTROID, _NOISE, _SPLIT = range(6)


def write_rmat(out_dir: str, scale: int, edge_factor: int = 16, num_features: int = 128,
               num_classes: int = 16, a: float = 0.57, b: float = 0.19, c: float = 0.19,
               smoothing: float = 0.9, feature_noise: float = 0.5,
               split: Tuple[float, float, float] = (0.01, 0.002, 0.005), seed: int = 0,
               chunk_edges: int = 1 << 22, progress: bool = False) -> Dict[str, Any]:
    r"""Writes an R-MAT power-law graph with Graph500's parameters and a
    neighbourhood-dependent node classification task to the graph folder
    :obj:`out_dir`, edge chunk by edge chunk, and returns what it writes to
    ``graph.json``.

    The graph and the task are those of :func:`~pyg_dist.datasets.rmat`,
    except that the edges stay directed as generated and the labels average
    over in-neighbours.

    **Graph.** :math:`N = 2^s` nodes (``scale`` :math:`s`) and exactly
    :math:`E = e N` directed edges (``edge_factor`` :math:`e`). Every edge
    picks one quadrant of the adjacency matrix per level of the recursion,
    with probabilities :math:`(a, b, c, d = 1 - a - b - c)` for
    (top-left, top-right, bottom-left, bottom-right); level :math:`\ell`
    fixes bit :math:`\ell` of the source and target ids:

    .. math::
        \Pr[(s_\ell, t_\ell) = (0, 0), (0, 1), (1, 0), (1, 1)]
        = (a, b, c, d).

    One uniform 32-bit draw :math:`r` per edge and level picks the quadrant:
    :math:`[0, 2^{32})` is cut into intervals of lengths
    :math:`2^{32}(a, c, d, b)`, in this order (each rounded to an integer,
    so the probabilities are exact to :math:`2^{-32}`), so that
    :math:`s_\ell = 1` (c or d) and :math:`t_\ell = 1` (d or b) are one
    interval each. As in Graph500, node ids are then randomly permuted.
    Self-loops and repeated edges are kept, so the folder holds exactly
    :math:`E` edges (:func:`~pyg_dist.datasets.rmat` symmetrises and
    removes both; the partitioner does so for itself).

    **Labels and features.** Every node draws
    :math:`\mathbf{z}_i \sim \mathcal{N}(\mathbf{0}, \mathbf{I}_C)`;
    messages flow ``src -> dst``, so a node averages over the sources of its
    in-edges, :math:`\mathcal{N}^-(i) = \{j : j \to i\}` (with
    multiplicity):

    .. math::
        y_i = \arg\max_c \Big((1 - \alpha)\, \mathbf{z}_i + \frac{\alpha}
            {|\mathcal{N}^-(i)|} \sum_{j \in \mathcal{N}^-(i)} \mathbf{z}_j
            \Big)_c, \qquad
        \mathbf{x}_i = \mathbf{M}^{\top} \mathbf{z}_i
            + \sigma \boldsymbol{\epsilon}_i,

    with :math:`\alpha` (``smoothing``; a node without in-edges gets
    :math:`\arg\max_c z_{ic}`), centroids
    :math:`\mathbf{M}_{cf} \sim \mathcal{N}(0, 1/C)`,
    :math:`\boldsymbol{\epsilon}_i \sim \mathcal{N}(\mathbf{0},
    \mathbf{I}_F)` and noise scale :math:`\sigma` (``feature_noise``). The
    neighbour sums are accumulated in float32 over the edge chunks in edge
    order.

    **Writes** (each ``.npy`` under its name only once complete, and
    ``graph.json`` last, so a folder with ``graph.json`` is complete):

    * ``src.npy``, ``dst.npy``: the :math:`E` edges ``src[e] -> dst[e]``,
      int32 when :math:`N < 2^{31}` (else int64).
    * ``x.npy``: float32 ``[N, F]``; ``y.npy``: int64 ``[N]``.
    * ``train_mask.npy``, ``val_mask.npy``, ``test_mask.npy``: bool
      ``[N]``, disjoint random sets of ``int(fraction * N)`` nodes each.
    * ``graph.json``: ``generator`` (``"rmat"``), ``scale``,
      ``edge_factor``, ``num_nodes``, ``num_edges``, ``num_features``,
      ``num_classes``, ``seed``, ``a``, ``b``, ``c``, and ``smoothing``,
      ``feature_noise``, ``split``, which with them determine the files.

    **Memory.** Holds :math:`\mathbf{z}` and the neighbour sums
    (:math:`8 N C` bytes, float32), the in-degrees and the id permutation
    (:math:`8 N` bytes while ids and degrees fit int32), plus the buffers
    of one chunk of edges (32 bytes per edge of :obj:`chunk_edges`: 128 MB
    at the default) or of a few 16 MB blocks of features; never all edges
    or all features. At scale 24 with the defaults (2 GiB of
    :math:`\mathbf{z}` and sums) the peak resident size is 2.6 GiB,
    torch's own 0.3 GiB included, and the 11 GB folder takes about 50 s
    to write on 2 cores (scale 22: 1 GiB, 11 s).

    **Randomness.** Every block of :math:`2^{16}` edges, every block of
    feature rows, the permutation, :math:`\mathbf{z}`, :math:`\mathbf{M}`
    and the split draw from their own stream of
    ``np.random.SeedSequence(seed, spawn_key=...)`` (Gaussians through a
    :class:`torch.Generator` seeded from it: 3x faster than numpy's), so the
    files are identical for equal arguments whatever :obj:`chunk_edges`,
    and edge blocks are drawn on all cores.

    Args:
        out_dir (str): The graph folder (created if missing); it must not
            hold any of the files above.
        scale (int): :math:`\log_2` of the number of nodes (1 to 40).
        edge_factor (int): Directed edges per node.
        num_features (int): Feature dimension :math:`F` (at least
            :obj:`num_classes`, so the features determine :math:`\mathbf{z}`).
        num_classes (int): Number of classes :math:`C` (at least 2).
        a (float): Probability of the top-left quadrant.
        b (float): Probability of the top-right quadrant.
        c (float): Probability of the bottom-left quadrant.
        smoothing (float): Weight :math:`\alpha` of the in-neighbours' mean
            field in the label.
        feature_noise (float): Noise scale :math:`\sigma`.
        split (Tuple[float, float, float]): Train, validation and test
            fractions of the nodes; the rest is in no mask.
        seed (int): Random seed.
        chunk_edges (int): Edges generated and written at a time, rounded
            down to whole blocks of :math:`2^{16}` (at least one).
        progress (bool): Shows a tqdm bar over the edges.

    Raises :class:`ValueError` for invalid arguments and when
    :obj:`out_dir` already holds one of the files, and
    :class:`~pyg_dist.partition.staging.NoSpaceError` when the files
    (:func:`rmat_bytes`) exceed the free space, all before any work. A
    failed write removes the files it had written (so does Ctrl-C, and
    under ``pyg-dist rmat`` SIGTERM and SIGHUP).
    """
    _check_arguments(scale, edge_factor, num_features, num_classes, a, b, c, smoothing,
                     feature_noise, split, chunk_edges)
    check_empty_graph_folder(out_dir)
    check_free_space(rmat_bytes(scale, edge_factor, num_features), out_dir,
                     f"the R-MAT graph of scale {scale}")
    N, E, C = 1 << scale, edge_factor << scale, num_classes
    dtype = np.int32 if N < 2**31 else np.int64
    meta = {"generator": "rmat", "scale": scale, "edge_factor": edge_factor,
            "num_nodes": N, "num_edges": E, "num_features": num_features,
            "num_classes": C, "seed": seed, "a": a, "b": b, "c": c,
            "smoothing": smoothing, "feature_noise": feature_noise, "split": list(split)}

    with writing_graph_folder(out_dir):
        perm = np.arange(N, dtype=dtype)
        _rng(seed, _PERM).shuffle(perm)
        z = torch.empty(N, C).normal_(generator=_torch_rng(seed, _FIELD))
        # The in-neighbours' sums of z and their counts, over all chunks.
        total = torch.zeros(N, C)
        in_degree = torch.zeros(N, dtype=torch.int32 if E < 2**31 else torch.int64)
        _write_edges(out_dir, scale, E, _cuts(a, b, c), perm, z, total, in_degree, seed,
                     max(1, chunk_edges // _EDGE_BLOCK), progress)
        del perm
        _write_nodes(out_dir, z, total, in_degree, num_features, smoothing,
                     feature_noise, seed)
        del z, total, in_degree
        _write_masks(out_dir, N, split, seed)
        write_graph_json(out_dir, meta)
    return meta


def rmat_bytes(scale: int, edge_factor: int = 16, num_features: int = 128) -> int:
    r"""The bytes :func:`write_rmat` writes (its files' headers rounded up):
    the edges, the float32 features, the int64 labels and three masks."""
    N, E = 1 << scale, edge_factor << scale
    ids = 4 if N < 2**31 else 8
    return 2 * E * ids + N * (4 * num_features + 8 + 3) + 8 * 4096


def _check_arguments(scale: int, edge_factor: int, num_features: int, num_classes: int,
                     a: float, b: float, c: float, smoothing: float, feature_noise: float,
                     split: Tuple[float, float, float], chunk_edges: int) -> None:
    if not 1 <= scale <= 40:
        raise ValueError(f"scale must be in 1..40 (got {scale})")
    if edge_factor < 1:
        raise ValueError(f"edge_factor must be at least 1 (got {edge_factor})")
    if not num_features >= num_classes >= 2:
        raise ValueError(f"need num_features >= num_classes >= 2 (got num_features="
                         f"{num_features}, num_classes={num_classes})")
    # Written as what must hold, so that NaN is refused too.
    if not (min(a, b, c) >= 0 and a + b + c <= 1 + 1e-9):
        raise ValueError(f"the quadrant probabilities a, b, c must be >= 0 with "
                         f"a + b + c <= 1 (got {a}, {b}, {c})")
    if not 0 <= smoothing <= 1:
        raise ValueError(f"smoothing must be in [0, 1] (got {smoothing})")
    if not feature_noise >= 0:
        raise ValueError(f"feature_noise must be >= 0 (got {feature_noise})")
    if len(split) != 3 or not (min(split) >= 0 and math.fsum(split) <= 1 + 1e-9):
        raise ValueError(f"split must be three fractions >= 0 summing to at most 1 "
                         f"(got {tuple(split)})")
    if chunk_edges < 1:
        raise ValueError(f"chunk_edges must be at least 1 (got {chunk_edges})")


def _rng(seed: int, *key: int) -> np.random.Generator:
    r"""The numpy stream :obj:`key` of the graph of :obj:`seed`."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _torch_rng(seed: int, *key: int) -> torch.Generator:
    r"""The torch stream :obj:`key` of the graph of :obj:`seed`."""
    state = np.random.SeedSequence(seed, spawn_key=key).generate_state(1, np.uint64)
    return torch.Generator().manual_seed(int(state[0]) >> 1)


def _cuts(a: float, b: float, c: float) -> Tuple[int, int, int]:
    r"""The cuts :math:`(P, Q, R)` of the 32-bit draws into the quadrants
    :math:`[0, P)` (a), :math:`[P, Q)` (c), :math:`[Q, R)` (d) and
    :math:`[R, 2^{32})` (b): the source bit is 1 on :math:`[P, R)` and the
    target bit on :math:`[Q, 2^{32})`, one interval each."""
    P, R = round(a * 2**32), 2**32 - round(b * 2**32)
    # a + b + c may exceed 1 by rounding: d is then empty.
    return P, min(round((a + c) * 2**32), R), R


def _edge_block(seed: int, block: int, scale: int, cuts: Tuple[int, int, int],
                src: np.ndarray, dst: np.ndarray) -> None:
    r"""Draws the R-MAT edges of :obj:`block` into :obj:`src` and
    :obj:`dst` (ids before the permutation), one 32-bit draw per edge and
    level, split by :obj:`cuts` (see :func:`_cuts`)."""
    P, Q, R = cuts
    gen = _rng(seed, _EDGES, block).bit_generator
    n = len(src)
    s, t, offset = np.empty(n, bool), np.empty(n, bool), np.empty(n, np.uint32)
    s8, t8 = np.empty(n, np.uint8), np.empty(n, np.uint8)
    src.fill(0)
    dst.fill(0)
    # Bits gather in bytes, 8 levels at a time: byte arithmetic is 4x
    # denser than the ids'. The first level drawn ends up the highest bit.
    for first in range(0, scale, 8):
        levels = min(8, scale - first)
        s8.fill(0)
        t8.fill(0)
        for _ in range(levels):
            # Two 32-bit draws per 64-bit output of the bit generator.
            r = gen.random_raw((n + 1) // 2).view(np.uint32)[:n]
            # r in [P, R) as one unsigned comparison. A cut at 2**32 is out
            # of uint32's range: empty and full intervals are set as such.
            if 0 < R - P < 2**32:
                np.subtract(r, np.uint32(P), out=offset)
                np.less(offset, np.uint32(R - P), out=s)
            else:
                s.fill(R - P == 2**32)
            if Q < 2**32:
                np.greater_equal(r, np.uint32(Q), out=t)
            else:
                t.fill(False)
            np.add(s8, s8, out=s8)
            np.add(s8, s.view(np.uint8), out=s8)
            np.add(t8, t8, out=t8)
            np.add(t8, t.view(np.uint8), out=t8)
        np.left_shift(src, levels, out=src)
        np.bitwise_or(src, s8, out=src)
        np.left_shift(dst, levels, out=dst)
        np.bitwise_or(dst, t8, out=dst)


def _write_edges(out_dir: str, scale: int, E: int, cuts: Tuple[int, int, int],
                 perm: np.ndarray, z: Tensor, total: Tensor, in_degree: Tensor, seed: int,
                 blocks_per_chunk: int, progress: bool) -> None:
    r"""Writes ``src.npy`` and ``dst.npy`` chunk by chunk and adds every
    chunk's ``z[src]`` into ``total[dst]`` and its edges to
    :obj:`in_degree`."""
    C, num_blocks = z.size(1), -(-E // _EDGE_BLOCK)
    chunk = min(E, blocks_per_chunk * _EDGE_BLOCK)
    # Buffers live across chunks: fresh ones would be page-faulted in anew
    # every chunk (at scale 24, twice the system time of all the writes).
    # The ids as drawn are double-buffered: the next chunk is drawn while
    # one is summed.
    drawn = [(np.empty(chunk, perm.dtype), np.empty(chunk, perm.dtype)) for _ in range(2)]
    src, dst = np.empty(chunk, perm.dtype), np.empty(chunk, perm.dtype)
    part = min(chunk, _SUM_EDGES)
    index, rows = torch.empty(part, dtype=torch.int64), torch.empty(part, C)
    ones = torch.ones(part, dtype=in_degree.dtype)
    firsts = range(0, num_blocks, blocks_per_chunk)
    with NpyWriter(osp.join(out_dir, "src.npy"), (E, ), perm.dtype) as src_file, \
            NpyWriter(osp.join(out_dir, "dst.npy"), (E, ), perm.dtype) as dst_file, \
            ThreadPoolExecutor(torch.get_num_threads()) as pool, \
            progress_bar(total=E, desc="R-MAT edges", unit="edge", unit_scale=True,
                         disable=not progress) as bar:

        def draw(first: int, into: Tuple[np.ndarray, np.ndarray]) -> List[Future]:
            # Blocks draw from their own streams: in any order, on any thread.
            jobs = []
            for block in range(first, min(first + blocks_per_chunk, num_blocks)):
                lo = (block - first) * _EDGE_BLOCK
                hi = min(lo + _EDGE_BLOCK, E - first * _EDGE_BLOCK)
                jobs.append(pool.submit(_edge_block, seed, block, scale, cuts,
                                        into[0][lo:hi], into[1][lo:hi]))
            return jobs

        pending = draw(0, drawn[0])
        for k, first in enumerate(firsts):
            for job in pending:
                job.result()
            if k + 1 < len(firsts):
                pending = draw(firsts[k + 1], drawn[(k + 1) % 2])
            n = min(E - first * _EDGE_BLOCK, chunk)
            # 'clip' (the ids are in range) spares `take` a buffered copy.
            np.take(perm, drawn[k % 2][0][:n], out=src[:n], mode="clip")
            np.take(perm, drawn[k % 2][1][:n], out=dst[:n], mode="clip")
            src_file.write(src[:n])
            dst_file.write(dst[:n])
            src_t, dst_t = torch.from_numpy(src), torch.from_numpy(dst)
            for lo in range(0, n, part):
                m = min(part, n - lo)
                index[:m].copy_(dst_t[lo:lo + m])
                torch.index_select(z, 0, src_t[lo:lo + m], out=rows[:m])
                # With an expanded index, `scatter_add_` sorts the edges by
                # target (stably) and adds each target's in edge order,
                # several times faster than `index_add_`: the float32 sums
                # are those of one edge after the other, whatever the
                # chunking.
                total.scatter_add_(0, index[:m, None].expand(-1, C), rows[:m])
                in_degree.index_add_(0, dst_t[lo:lo + m], ones[:m])
            bar.update(n)


def _write_nodes(out_dir: str, z: Tensor, total: Tensor, in_degree: Tensor,
                 num_features: int, smoothing: float, feature_noise: float,
                 seed: int) -> None:
    r"""Writes ``y.npy`` and ``x.npy`` block of nodes by block of nodes."""
    N, C = z.shape
    centroid = torch.empty(C, num_features).normal_(
        generator=_torch_rng(seed, _CENTROID)) / math.sqrt(C)
    rows = max(1, _FEATURE_BYTES // (4 * num_features))

    def node_block(start: int) -> Tuple[np.ndarray, np.ndarray]:
        stop = min(start + rows, N)
        z_block, degree = z[start:stop], in_degree[start:stop, None]
        field = total[start:stop] * (smoothing / degree.clamp(min=1).float())
        field.add_(z_block, alpha=1 - smoothing)
        # Without in-edges there is no mean to smooth towards.
        field = torch.where(degree > 0, field, z_block)
        x = torch.empty(stop - start, num_features).normal_(
            generator=_torch_rng(seed, _NOISE, start // rows))
        x.addmm_(z_block, centroid, beta=feature_noise)
        return field.argmax(1).numpy(), x.numpy()

    workers = torch.get_num_threads()
    with NpyWriter(osp.join(out_dir, "y.npy"), (N, ), np.int64) as y_file, \
            NpyWriter(osp.join(out_dir, "x.npy"), (N, num_features), np.float32) as x_file, \
            ThreadPoolExecutor(workers) as pool:
        # Blocks are computed on all cores while the main thread writes
        # the finished ones in order.
        for y, x in _in_order(pool, node_block, range(0, N, rows), ahead=workers):
            y_file.write(y)
            x_file.write(x)


def _in_order(pool: ThreadPoolExecutor, fn: Callable[[int], Any], items: Iterable[int],
              ahead: int) -> Iterator[Any]:
    r"""``fn(item)`` for every item in order, computed on :obj:`pool` at
    most :obj:`ahead` items ahead of the consumer (so the results held stay
    bounded)."""
    pending: Deque[Future] = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) > ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _write_masks(out_dir: str, N: int, split: Tuple[float, float, float],
                 seed: int) -> None:
    r"""Writes the disjoint random ``train_mask.npy``, ``val_mask.npy`` and
    ``test_mask.npy``."""
    order = _rng(seed, _SPLIT).permutation(N)
    start = 0
    for key, fraction in zip(("train", "val", "test"), split):
        # The fractions may sum to 1 + 1e-9 (float rounding): never overdraw.
        count = min(int(fraction * N), N - start)
        mask = np.zeros(N, dtype=bool)
        mask[order[start:start + count]] = True
        start += count
        with NpyWriter(osp.join(out_dir, f"{key}_mask.npy"), (N, ), bool) as f:
            f.write(mask)
