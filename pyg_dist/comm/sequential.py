r"""Sequential aggregation and rematerialization (SAR; Mostafa, MLSys 2022):
exact full-graph layers whose memory per rank falls with the ranks.

With ``exchange="sequential"`` a layer never holds all its halo rows. Its
forward aggregates its inner rows, then each peer's halo rows in turn (the
ring of :mod:`~pyg_dist.comm.ring`: round :math:`k` brings rank
:math:`r - k`'s rows), folds that *piece*'s partial aggregate into a
running one and frees the rows; the next peer's rows travel while the
current piece aggregates. With :math:`\mathcal{N}_k(i)` the in-neighbours of
inner node :math:`i` whose rows come in round :math:`k` and
:math:`\mathbf{a}_k` the layer's own aggregation over them:

* sum: :math:`\mathbf{a} = \sum_k \mathbf{a}_k`;
* mean: :math:`\mathbf{a} = \sum_k \frac{|\mathcal N_k(i)|}{|\mathcal N(i)|}
  \mathbf{a}_k`;
* max / min: :math:`\mathbf{a} = \max_k \mathbf{a}_k` over the pieces with
  an edge into :math:`i` (0 without any, as PyG), per channel;
* attention (a layer whose messages are :math:`\alpha_{ij}\mathbf{m}_{ij}`
  with :math:`\alpha = \mathrm{softmax}_j(s_{ij})`, e.g. GAT, GATv2,
  Transformer): each piece's softmax is taken against its own maximum
  :math:`\mu_k(i)`, giving :math:`\mathbf{n}_k = \sum_{j \in \mathcal N_k(i)}
  e^{s_{ij} - \mu_k}\mathbf{m}_{ij}` and :math:`d_k = \sum e^{s_{ij} - \mu_k}`,
  and the running maximum :math:`\mu` rescales them:
  :math:`\mathbf{a} = \sum_k e^{\mu_k - \mu}\mathbf{n}_k \,/\,
  \sum_k e^{\mu_k - \mu} d_k`.

The backward pass re-fetches each peer's rows, rebuilds that piece of the
message-passing graph, differentiates it with the gradient its partial
aggregate receives (sum: :math:`\nabla\mathbf a`; mean: scaled by
:math:`|\mathcal N_k|/|\mathcal N|`; max/min: on the channels the piece
won, ties to the earliest piece; attention: :math:`\nabla\mathbf a / d` for
:math:`\mathbf n_k` and :math:`-\langle\nabla\mathbf a, \mathbf a\rangle / d`
for :math:`d_k`, with every piece recomputed against the final :math:`\mu`)
and sends the rows' gradients back to their owner. So a layer keeps, for
the backward, its inner input and its output: memory per rank is that of
the rank's own nodes, whatever its halo. The price is a second transfer of
the halo rows and a second computation of the messages per layer and
iteration, except for a layer that aggregates its source rows as they are
(a sum or mean weighted by the plan's CSR graph: GCN, SAGE, GIN,
GraphConv): its gradient for round :math:`k`'s rows is
:math:`\mathbf{A}_k^{\top}\nabla\mathbf{a}` (a mean's scaled by
:math:`1/|\mathcal N|`), rows of the graph's kept transpose, which needs
no row: nothing is recomputed or fetched again, and the backward holds one
round's row gradients. Its forward adds each round's
:math:`\mathbf{A}_k\mathbf{X}_k` into its output in place (a mean divided
by the in-degree at the end): no partial aggregate per round.

Exact: the result equals the materialising exchange (and single-process
PyG) up to floating-point rounding. Applies on the full-graph plans of the
exact cache, sampled ones included (a sampler's plan has fewer rows per
peer); layers are refused before any work unless their aggregation
decomposes (the verified PyG layers: the ``sequential`` field of
:data:`pyg_dist.nn.spec.LAYERS`).
"""
import math
import sys
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch_geometric.utils
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from pyg_dist.comm.halo import PointToPoint
from pyg_dist.comm.ring import RingSchedule, start_round
from pyg_dist.utils.aggregate import keep_transpose, keeps_transpose, transposed
from pyg_dist.utils.allocator import sample_live_peak, sample_live_peak_after
from pyg_dist.utils import csr_tensor
from pyg_dist.utils.sparse import run_positions

#: Aggregations that decompose over the pieces of a neighbourhood.
AGGREGATIONS = ("add", "sum", "mean", "max", "min")


class Piece(NamedTuple):
    r"""The edges of one round: from ``sources`` (source ids of the plan)
    into the inner nodes, their sources numbered from 0 in ``graph`` (a CSR
    ``adj_t`` or an ``edge_index``); ``edge_id`` are their positions in the
    graph they were cut from (``edge_index`` form) and ``count`` the edges
    into each target (``num_edges`` in all).

    A CSR graph's pieces are kept compact, ``graph`` ``None``: ``ptr`` (the
    piece's row pointers) and where its edges sit in the graph's CSR arrays;
    :func:`materialise` gathers the piece's columns and values from the graph
    while the piece runs, so a rank never holds its adjacency twice (a copy
    costs 12 bytes an edge: at 2 ranks more than the halo rows the exchange
    saves). Where each row's edges of the piece lie side by side in the
    graph (its columns sorted within rows, as a partition's are), ``shift``
    locates them, one entry a row: the piece's edge :math:`j` (numbered over
    the whole piece), one of row :math:`r`'s, sits at :math:`j +
    \mathrm{shift}_r`. Otherwise ``position`` holds each edge's (32-bit: 4 bytes an
    edge over all pieces, 4 MiB on a rank of 1M edges). Either way a gather
    of the piece's own edges, not a scan of every edge per piece and round."""
    sources: slice
    graph: Any
    edge_id: Optional[Tensor]
    ptr: Optional[Tensor]  # CSR row pointers of the piece
    position: Optional[Tensor]  # CSR: its edges' positions in the graph's arrays
    edge_count: Optional[Tensor]  # edge_index form: the edges into each target
    num_edges: int
    shift: Optional[Tensor] = None  # CSR, one run of edges a row: position - rank in piece

    @property
    def num_rows(self) -> int:
        return self.sources.stop - self.sources.start

    @property
    def count(self) -> Tensor:
        return self.ptr.diff() if self.ptr is not None else self.edge_count


def _in_round(col: Tensor, sources: slice) -> Tensor:
    keep = col >= sources.start
    return keep.logical_and_(col < sources.stop)


def cut(graph, num_inner: int, schedule: RingSchedule) -> List[Piece]:
    r""":obj:`graph` (the plan's, sources are ``[inner | received halo]``)
    cut into the pieces of the ring's rounds (a CSR graph's compactly: see
    :class:`Piece`)."""
    pieces = []
    if isinstance(graph, Tensor) and graph.layout == torch.sparse_csr:
        crow, col = graph.crow_indices(), graph.col_indices()
        small = col.numel() < 2 ** 31  # 32-bit positions
        for k in range(schedule.world):
            sources = schedule.sources(k)
            # the piece's row pointers: its edges counted up to each row's start
            keep = _in_round(col, sources)
            ptr = torch.cat([crow.new_zeros(1), keep.cumsum(0)])[crow]
            position = keep.nonzero().view(-1)
            del keep
            num_edges = int(ptr[-1])
            count = ptr.diff()
            # a row's edges of the piece in one run: its first edge's position locates all
            nonempty = count > 0
            first = ptr[:-1][nonempty]
            shift = (crow[:-1] - ptr[:-1]).masked_scatter_(nonempty, position[first] - first)
            if small:
                position, shift = position.to(torch.int32), shift.to(torch.int32)
            if torch.equal(run_positions(shift, count, num_edges), position):
                pieces.append(Piece(sources, None, None, ptr, None, None, num_edges, shift))
            else:
                pieces.append(Piece(sources, None, None, ptr, position, None, num_edges))
        return pieces
    if not (isinstance(graph, Tensor) and graph.dim() == 2 and graph.size(0) == 2):
        raise NotImplementedError("exchange='sequential' takes the partition's edge_index or "
                                  f"torch CSR adj_t, not a {type(graph).__name__}")
    col, row = graph
    for k in range(schedule.world):
        sources = schedule.sources(k)
        keep = _in_round(col, sources).nonzero().view(-1)
        count = torch.bincount(row[keep], minlength=num_inner)
        piece = torch.stack([col[keep] - sources.start, row[keep]])
        pieces.append(Piece(sources, piece, keep, None, None, count, keep.numel()))
    return pieces


def materialise(piece: Piece, graph, backward: bool = False) -> Piece:
    r""":obj:`piece` with its ``graph``: a compact CSR piece's columns and
    values selected from :obj:`graph` (the one it was cut from), for as long
    as the caller holds the result.

    For a :obj:`backward` where :obj:`graph` keeps its transpose (a plan's
    adjacency, see :mod:`pyg_dist.utils.aggregate`), the piece's transpose
    is rows ``sources`` of it, in the order a transpose of the piece would
    have (by source, then target): the piece's backward slices it (views of
    its columns and values) instead of sorting the piece's edges in every
    round of every step."""
    if piece.graph is not None:
        return piece
    at = piece.position if piece.shift is None else \
        run_positions(piece.shift, piece.count, piece.num_edges)
    adj = csr_tensor(piece.ptr, graph.col_indices().index_select(0, at).sub_(piece.sources.start),
                     graph.values().index_select(0, at),
                     (piece.ptr.numel() - 1, piece.num_rows))
    if backward and keeps_transpose(graph):
        keep_transpose(adj, _row_slice(transposed(graph), piece.sources))
    return piece._replace(graph=adj)


def _row_slice(csr: Tensor, rows: slice) -> Tensor:
    r"""Rows :obj:`rows` of the CSR matrix :obj:`csr` (views of its columns
    and values)."""
    crow = csr.crow_indices()[rows.start:rows.stop + 1]
    first, last = int(crow[0]), int(crow[-1])
    return csr_tensor(crow - first, csr.col_indices()[first:last], csr.values()[first:last],
                      (rows.stop - rows.start, csr.size(1)))


class _Softmax:
    r"""Stands in for :func:`torch_geometric.utils.softmax` inside a piece:
    returns :math:`e^{s - \mu}` (unnormalised) and records the normaliser
    :math:`d = \sum e^{s - \mu}` and :math:`\mu`, with :math:`\mu` the
    piece's maximum (forward) or the given final one (backward)."""

    def __init__(self, fixed_max: Optional[Tensor] = None) -> None:
        self.fixed_max = fixed_max
        self.calls: List[tuple] = []

    def __call__(self, src: Tensor, index: Optional[Tensor] = None,
                 ptr: Optional[Tensor] = None, num_nodes: Optional[int] = None,
                 dim: int = 0) -> Tensor:
        if index is None or dim != 0:
            raise NotImplementedError("exchange='sequential' runs attention layers whose "
                                      "softmax is over the target index of each edge")
        num_nodes = int(index.max()) + 1 if num_nodes is None else num_nodes
        shape = (num_nodes, ) + tuple(src.shape[1:])
        if self.fixed_max is None:
            at = index.view((-1, ) + (1, ) * (src.dim() - 1)).expand_as(src)
            top = src.new_full(shape, float("-inf")).scatter_reduce_(
                0, at, src.detach(), "amax", include_self=True)
        else:
            top = self.fixed_max
        exp = (src - top.index_select(0, index)).exp()
        self.calls.append((top, src.new_zeros(shape).index_add(0, index, exp)))
        return exp


_piece_softmax = threading.local()  # the _Softmax of the piece this thread runs
_pyg_softmax = torch_geometric.utils.softmax


def _softmax(*args: Any, **kwargs: Any) -> Tensor:
    r"""PyG's ``softmax``, or the :class:`_Softmax` of the piece running in
    this thread (:func:`_routed_softmax`): other threads, and this one
    between pieces, get PyG's."""
    return (getattr(_piece_softmax, "current", None) or _pyg_softmax)(*args, **kwargs)


@contextmanager
def _routed_softmax(module: torch.nn.Module, softmax: _Softmax) -> Iterator[None]:
    r"""Routes :obj:`module`'s calls of PyG's ``softmax`` (the name its
    module imported, and ``torch_geometric.utils.softmax``) to
    :obj:`softmax`, in this thread only, while the block runs. The names
    are bound to :func:`_softmax` once, which is PyG's outside such a block."""
    for space in [torch_geometric.utils] + [sys.modules[c.__module__]
                                            for c in type(module).__mro__]:
        if getattr(space, "softmax", None) is _pyg_softmax:
            space.softmax = _softmax
    previous = getattr(_piece_softmax, "current", None)
    _piece_softmax.current = softmax
    try:
        yield
    finally:
        _piece_softmax.current = previous


def _view_as(t: Tensor, like: Tensor) -> Tensor:
    r""":obj:`t` (per target, maybe per head) broadcastable against :obj:`like`."""
    return t.view(tuple(t.shape) + (1, ) * (like.dim() - t.dim()))


class _Fold:
    r"""Folds the pieces' partial aggregates into the layer's (forward) and
    gives each piece's share of the output gradient (backward)."""

    def __init__(self, aggr: str, pieces: Sequence[Piece]) -> None:
        self.aggr = "sum" if aggr == "add" else aggr
        self.pieces = pieces
        self.out: Optional[Tensor] = None
        self.attention: Optional[bool] = None
        if self.aggr == "mean":
            self.degree = sum(p.count for p in pieces).clamp(min=1)

    def add(self, k: int, part: Tensor, softmax: _Softmax) -> None:
        self._check_attention(softmax)
        piece = self.pieces[k]
        if self.attention:
            (top, den), = softmax.calls
            if self.out is None:
                self.out, self.max, self.den = part, top, den
                return
            new_max = torch.maximum(self.max, top)
            old = (self.max - new_max).exp_().nan_to_num_(0.0)
            new = (top - new_max).exp_().nan_to_num_(0.0)
            self.out = self.out * _view_as(old, part) + part * _view_as(new, part)
            self.den = self.den * old + den * new
            self.max = new_max
        elif self.aggr in ("sum", "mean"):  # no autograd here: in place
            if self.aggr == "mean":
                part.mul_(_view_as((piece.count / self.degree).to(part.dtype), part))
            self.out = part if self.out is None else self.out.add_(part)
        else:  # max, min: per channel, over the pieces with an edge into the target
            has = _view_as(piece.count > 0, part)
            if self.out is None:
                self.out = torch.where(has, part, part.new_zeros(()))
                self.winner = torch.where(has, k, -1).to(torch.int16).expand_as(part).clone()
                return
            better = part > self.out if self.aggr == "max" else part < self.out
            take = has & ((self.winner < 0) | better)
            self.out = torch.where(take, part, self.out)
            self.winner[take] = k

    def result(self, like: Tensor) -> Tensor:
        if self.out is None:  # no edge at all
            return like
        if self.attention:
            self.out = self.out / _view_as(self.den + 1e-16, self.out)  # as PyG's softmax
        return self.out

    def _check_attention(self, softmax: _Softmax) -> None:
        calls = len(softmax.calls)
        if calls > 1 or (calls and self.aggr != "sum"):
            raise NotImplementedError(
                "exchange='sequential' runs attention that takes one softmax per "
                "propagate and sums its messages")
        if self.attention is None:
            self.attention = calls == 1
        elif self.attention != (calls == 1):
            raise RuntimeError("a layer called softmax in some pieces only")

    def grads(self, k: int, part: Tensor, softmax: _Softmax, grad: Tensor, out: Tensor):
        r"""``(outputs, grad_outputs)`` to differentiate piece :obj:`k`
        (recomputed) with, given the layer's output :obj:`out`."""
        piece = self.pieces[k]
        if self.attention:
            (_, den), = softmax.calls
            norm = self.den + 1e-16
            inner = grad * out  # summed over the dimensions den does not have
            if inner.dim() > den.dim():
                inner = inner.flatten(den.dim()).sum(-1)
            return [part, den], [grad / _view_as(norm, grad), -inner / norm]
        if self.aggr == "sum":
            return [part], [grad]
        if self.aggr == "mean":
            return [part], [grad * _view_as((piece.count / self.degree).to(grad.dtype), grad)]
        return [part], [grad * (self.winner == k)]


#: ``run(piece, rows, others)``: a layer's partial aggregate over one piece.
PieceRun = Callable[[Piece, List[Tensor], List[Tensor]], Tensor]


class _Spec(NamedTuple):
    ctx: Any  # the HaloContext
    key: str
    schedule: RingSchedule
    graph: Any  # the plan's graph the pieces were cut from
    pieces: List[Piece]
    run: PieceRun  # (piece, its source rows, the other tensors) -> partial aggregate
    aggr: str
    num_sources: int
    num_others: int
    params: List[Tensor]
    module: torch.nn.Module
    prefetch: bool  # the next round's rows travel while this one computes
    #: The aggregation is a sum or mean of the one source's rows weighted by
    #: the CSR graph's values: its backward needs no row (see _linear_backward).
    linear: bool


def _pack(tensors: Sequence[Tensor], index: Tensor) -> Tensor:
    r"""The rows :obj:`index` of every source tensor, as one block."""
    if len(tensors) == 1:
        return tensors[0].index_select(0, index)
    return torch.cat([t.index_select(0, index).flatten(1) for t in tensors], dim=1)


def _unpack(block: Tensor, like: Sequence[Tensor]) -> List[Tensor]:
    if len(like) == 1:
        return [block]
    widths = [math.prod(t.shape[1:]) for t in like]
    return [part.reshape((-1, ) + tuple(t.shape[1:]))
            for part, t in zip(block.split(widths, dim=1), like)]


def _start_fetch(spec: _Spec, sources: Sequence[Tensor], k: int, key: str):
    schedule, ctx = spec.schedule, spec.ctx
    send = _pack([s.detach() for s in sources], schedule.send_index(k))
    return start_round(send, schedule.send_to(k), schedule.recv_from(k),
                       schedule.sources(k).stop - schedule.sources(k).start, ctx.group,
                       ctx.codec, ctx.stats, key)


def _rounds(spec: _Spec, sources: Sequence[Tensor], key: str) -> Iterator[Tuple[int, list]]:
    r"""Each round's source rows, in ring order: this rank's own (round 0),
    then each peer's as it arrives; with :attr:`_Spec.prefetch` the next
    peer's rows travel while the caller computes on the current ones (one
    more round of rows held)."""
    world, ahead = spec.schedule.world, spec.prefetch
    pending = _start_fetch(spec, sources, 1, key) if ahead and world > 1 else None
    yield 0, [s.detach() for s in sources]
    for k in range(1, world):
        block = (pending if ahead else _start_fetch(spec, sources, k, key)).wait()
        pending = _start_fetch(spec, sources, k + 1, key) if ahead and k + 1 < world else None
        if block is None:  # this peer owns none of the plan's halo rows
            yield k, [s.new_empty((0, ) + tuple(s.shape[1:])) for s in sources]
        else:
            yield k, _unpack(block, sources)


class _SequentialAggregation(torch.autograd.Function):
    @staticmethod
    def forward(fctx, spec: _Spec, *tensors: Tensor) -> Tensor:
        sources = list(tensors[:spec.num_sources])
        others = list(tensors[spec.num_sources:spec.num_sources + spec.num_others])
        if spec.linear and fctx.needs_input_grad[1]:
            # what its backward reads, built before the rounds' buffers: its
            # edge-sized temporaries (a plan's first step) stay off the peak
            _linear_transpose(spec)
        sample_live_peak_after(sources[0])
        if _adds_in_place(spec, sources[0]):
            fctx.spec, fctx.fold = spec._replace(run=None), None
            return _linear_forward(spec, sources[0])
        fold = _Fold(spec.aggr, spec.pieces)
        like = (sources + others)[0]
        rng = []  # the generator state of each piece, replayed by the backward
        for k, rows in _rounds(spec, sources, spec.key):
            rng.append(_rng_state(like) if spec.module.training else None)
            if spec.pieces[k].num_edges:
                softmax = _Softmax()
                with _routed_softmax(spec.module, softmax):
                    fold.add(k, spec.run(materialise(spec.pieces[k], spec.graph), rows,
                                         others), softmax)
            del rows
        out = fold.result(like.new_zeros((spec.ctx.num_inner, ) + tuple(like.shape[1:])))
        # The output is saved as such: held by the context it would form a
        # cycle (output -> grad_fn -> context -> output) that only the
        # garbage collector frees, keeping whole iterations alive.
        fold.out = None
        # A linear backward runs no piece: the layer's call (its inputs among
        # them) is not kept. The context lives as long as the step's graph,
        # and the call would keep the layer's input to the step's end, past
        # the backward that frees it (measured, 2 random parts of R-MAT,
        # hidden 256: 17 MiB over the halo exchange's live peak).
        fctx.spec = spec._replace(run=None) if spec.linear else spec
        fctx.fold, fctx.rng = fold, rng
        fctx.autocast = _autocast_state(like)
        # only attention's backward reads the output (its normaliser's gradient); the others
        # would hold an n x channels tensor per layer that nothing else may keep
        if not spec.linear:  # which keeps nothing
            fctx.save_for_backward(*sources, *others, out if fold.attention else None)
        return out

    @staticmethod
    def backward(fctx, grad: Tensor):
        spec, fold = fctx.spec, fctx.fold
        if spec.linear:  # nothing for the others, which its aggregation does not read
            return (None, _linear_backward(spec, grad) if fctx.needs_input_grad[1] else None,
                    *[None] * spec.num_others)
        *saved, out = fctx.saved_tensors
        sources, others = list(saved[:spec.num_sources]), list(saved[spec.num_sources:])
        other_leaves = [o.detach().requires_grad_(o.requires_grad) for o in others]
        source_grads: List[Optional[Tensor]] = [None] * len(sources)
        other_grads: List[Optional[Tensor]] = [None] * len(others)
        param_grads: List[Optional[Tensor]] = [None] * len(spec.params)
        needed = [s.requires_grad for s in sources]
        returning = None  # a round's gradients on their way to their owner
        replay = any(state is not None for state in fctx.rng)
        with torch.random.fork_rng(devices=_rng_devices(grad), enabled=replay):
            for k, rows in _rounds(spec, sources, spec.key + ".refetch"):
                piece = materialise(spec.pieces[k], spec.graph, backward=True) \
                    if spec.pieces[k].num_edges else spec.pieces[k]
                leaves = [r.requires_grad_(s.requires_grad) for r, s in zip(rows, sources)]
                row_grads: List[Optional[Tensor]] = [None] * len(rows)
                if piece.num_edges:
                    if fctx.rng[k] is not None:
                        _set_rng_state(fctx.rng[k])
                    softmax = _Softmax(fold.max if fold.attention else None)
                    with torch.enable_grad(), _routed_softmax(spec.module, softmax), \
                            torch.autocast(**fctx.autocast):  # as the forward ran
                        part = spec.run(piece, leaves, other_leaves)
                        outputs, grad_outputs = fold.grads(k, part, softmax, grad, out)
                        pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
                                 if o.requires_grad]
                        wrt = [t for t in leaves + other_leaves if t.requires_grad] + \
                            spec.params
                        got = list(torch.autograd.grad(
                            [o for o, _ in pairs], wrt, [g for _, g in pairs],
                            allow_unused=True)) if pairs else [None] * len(wrt)
                        # the recomputed piece (its partial aggregate, autograd state and
                        # output gradients, n x channels each) is spent: not held into
                        # the next round's transfers
                        del part, outputs, grad_outputs, pairs, softmax
                    row_grads = [got.pop(0) if t.requires_grad else None for t in leaves]
                    for i, t in enumerate(other_leaves):
                        if t.requires_grad:
                            other_grads[i] = _add(other_grads[i], got.pop(0))
                    for i, g in enumerate(got):
                        param_grads[i] = _add(param_grads[i], g)
                del rows, leaves, piece  # a compact piece's columns: freed with it
                if k == 0:  # owned from here on (index_add_ below): never the incoming grad
                    source_grads = [g.clone() if g is not None and _shares(g, grad) else g
                                    for g in row_grads]
                elif any(needed):
                    returning = _send_back(spec, k, row_grads, returning, source_grads,
                                           sources, needed)
            if returning is not None:
                _receive_grads(returning, source_grads, sources, needed)
        source_grads = [g if g is not None or not s.requires_grad else torch.zeros_like(s)
                        for g, s in zip(source_grads, sources)]
        return (None, *source_grads, *other_grads, *param_grads)


def _adds_in_place(spec: _Spec, x: Tensor) -> bool:
    r"""Whether a linear aggregation (:attr:`_Spec.linear`) of :obj:`x` can
    add each piece's product into its output in place
    (:func:`_linear_forward`): rows of one dimension, of the graph's
    dtype."""
    return spec.linear and x.dim() == 2 and x.dtype == spec.graph.dtype


def _linear_forward(spec: _Spec, x: Tensor) -> Tensor:
    r"""The forward of a linear aggregation (:attr:`_Spec.linear`) of
    :obj:`x`: :math:`\mathbf{a} = \sum_k \mathbf{A}_k \mathbf{X}_k` (a
    mean's divided by the in-degree at the end), each round's piece times
    its rows added into the output in place (``addmm_``). A partial
    aggregate per round would be a buffer of the output's size allocated
    and freed per round, layer and step (21 a step for 3 layers at 8
    ranks), churning the heap the step's other buffers are placed in."""
    out = x.new_zeros((spec.ctx.num_inner, x.size(1)))
    for k, (rows, ) in _rounds(spec, [x], spec.key):
        if spec.pieces[k].num_edges:
            out.addmm_(materialise(spec.pieces[k], spec.graph).graph, rows)
        del rows
    if spec.aggr == "mean":  # the pieces' edges are the graph's: its row counts
        out.div_(spec.graph.crow_indices().diff().clamp_(min=1).unsqueeze(1).to(out.dtype))
    return out


def _linear_backward(spec: _Spec, grad: Tensor) -> Tensor:
    r"""The gradient of the one source of a linear aggregation
    (:attr:`_Spec.linear`): :math:`\mathbf{A}^{\top}\nabla\mathbf{a}` for
    a sum, :math:`\mathbf{A}^{\top}\mathrm{diag}(1/|\mathcal N|)\nabla
    \mathbf{a}` for a mean (whose pieces' weights
    :math:`|\mathcal N_k|/|\mathcal N|` times their own means add up to it).
    Round :math:`k`'s rows of it are rows ``sources(k)`` of the graph's
    kept transpose (a mean's with its entries divided by their targets'
    in-degree) times the output gradient: no piece is recomputed and no
    row fetched again, and the rounds' gradients go back to their owners as
    in the general backward."""
    schedule = spec.schedule
    whole = _linear_transpose(spec)
    grad = grad.contiguous()
    source_grads: List[Optional[Tensor]] = [None]
    returning = None
    for k in range(schedule.world):
        row_grads = [torch.sparse.mm(_row_slice(whole, schedule.sources(k)), grad, "sum")]
        if k == 0:  # this rank's own rows: the gradient the others' are added into
            source_grads = row_grads
        else:
            returning = _send_back(spec, k, row_grads, returning, source_grads,
                                   source_grads, [True])
    if returning is not None:
        _receive_grads(returning, source_grads, source_grads, [True])
    return source_grads[0]


def _linear_transpose(spec: _Spec) -> Tensor:
    r"""The kept transpose a linear backward reads (built once per graph)."""
    return transposed(spec.graph, "mean" if spec.aggr == "mean" else "sum")


def _shares(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _add(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    return b if a is None else a if b is None else a + b


def _return_grads(spec: _Spec, k: int, row_grads: List[Optional[Tensor]],
                  sources: Sequence[Tensor]):
    r"""Starts sending round :obj:`k`'s row gradients back to their owner
    while the peer that holds this rank's rows sends theirs."""
    schedule = spec.schedule
    grads = [g if g is not None else s.new_zeros((schedule.sources(k).stop
                                                  - schedule.sources(k).start, )
                                                 + tuple(s.shape[1:]))
             for g, s in zip(row_grads, sources)]
    # one tensor travels as it is (the send holds it until it left), several as one block
    block = grads[0].contiguous() if len(grads) == 1 else \
        torch.cat([g.flatten(1) for g in grads], dim=1)
    del grads
    return start_round(block, schedule.recv_from(k), schedule.send_to(k),
                       schedule.send_index(k).numel(), spec.ctx.group, spec.ctx.codec,
                       spec.ctx.stats, spec.key + ".grad", backward=True)


def _send_back(spec: _Spec, k: int, row_grads: List[Optional[Tensor]], returning,
               source_grads: List[Optional[Tensor]], sources: Sequence[Tensor],
               needed: Sequence[bool]):
    r"""Starts returning round :obj:`k`'s :obj:`row_grads` to their owner
    (the list is emptied: the transfer holds them until they left), after
    adding in the gradients still :obj:`returning` from the round before;
    without prefetch, waits for this round's too (no round's gradients held
    while computing). Returns what is still on its way."""
    if returning is not None:
        _receive_grads(returning, source_grads, sources, needed)
    returning = (_return_grads(spec, k, row_grads, sources), spec.schedule.send_index(k))
    row_grads.clear()
    if spec.prefetch:
        return returning
    _receive_grads(returning, source_grads, sources, needed)
    return None


def _receive_grads(returning, source_grads: List[Optional[Tensor]],
                   sources: Sequence[Tensor], needed: Sequence[bool]) -> None:
    r"""Adds the gradients this rank's rows got from a peer into
    :obj:`source_grads` (in place), for the :obj:`sources` that need them."""
    transfer, index = returning
    block = transfer.wait()
    sample_live_peak()  # a backward peak, as in the halo exchange's
    if block is None:
        return
    for i, (s, part) in enumerate(zip(sources, _unpack(block, sources))):
        if needed[i]:
            if source_grads[i] is None:
                source_grads[i] = torch.zeros_like(s)
            source_grads[i].index_add_(0, index, part.to(s.dtype))


def _autocast_state(like: Tensor) -> Dict[str, Any]:
    r"""The autocast setting the forward runs under (for its recomputation)."""
    device = like.device.type
    return {"device_type": device, "enabled": torch.is_autocast_enabled(device),
            "dtype": torch.get_autocast_dtype(device)}


def _rng_devices(like: Tensor) -> List[int]:
    return [like.device.index or 0] if like.is_cuda else []


def _rng_state(like: Tensor):
    return (torch.get_rng_state(),
            torch.cuda.get_rng_state(like.device) if like.is_cuda else None, like.device)


def _set_rng_state(state) -> None:
    cpu, cuda, device = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


class Sequential(PointToPoint):
    r"""SAR: a layer aggregates its inner rows, then each peer's halo rows
    in turn, and never holds them all (see the module). Runs on full-graph
    plans (a halo sampler's too) under the exact cache; other fetches (a
    layer outside the piecewise path) are point to point. With ``overlap``
    the next peer's rows travel while the current piece aggregates."""
    name = "sequential"
    summary = ("aggregates one peer's rows at a time on full-graph plans under the exact "
               "cache (SAR)")
    minibatch = False
    stale_caches = False
    feature_cache = False
    holds_halo = False
    piecewise = True
    asynchronous = True
    #: Aggregations that decompose over the pieces of a neighbourhood.
    aggregations = AGGREGATIONS

    def __init__(self) -> None:
        # a graph -> (its plan, weakly; its pieces): kept as long as the graph
        # lives (a plan's adjacency for the plan's lifetime, a per-call graph
        # for the call)
        self._pieces = WeakIdKeyDictionary()

    def aggregate_pieces(self, ctx, key: str, graph, sources: List[Tensor],
                         others: List[Tensor], run: PieceRun, aggr: str,
                         module: torch.nn.Module, params: Sequence[Tensor],
                         linear: bool = False) -> Tensor:
        r"""The layer's aggregation over :obj:`graph` (the current plan's, in
        its source ids) computed piece by piece: :obj:`run` ``(piece, rows,
        others)`` aggregates one piece given its rows of each of
        :obj:`sources` (inner rows) and the :obj:`others` tensors it reads
        (target rows, per-edge tensors); gradients flow to them and to
        :obj:`params`, the parameters of :obj:`module` its messages read.
        :obj:`linear`: :obj:`run` is a sum or mean of the rows of the one
        source weighted by :obj:`graph`'s values (a CSR graph a plan keeps
        the transpose of) and reads none of the :obj:`others`: its backward
        then recomputes nothing."""
        plan = ctx.plan
        if plan.data is not ctx.data or plan.trim_input:
            raise NotImplementedError("exchange='sequential' runs on full-graph plans (the "
                                      "full-graph loader, with or without a halo sampler)")
        world = dist.get_world_size(ctx.group) if dist.is_initialized() else 1
        schedule = RingSchedule.of(plan, ctx.rank if world > 1 else 0, world)
        # Kept while the graph lives; the plan is held weakly: a plan's cache
        # holds its graphs.
        hit = self._pieces.get(graph)
        if hit is not None and hit[0]() is plan:
            pieces = hit[1]
        else:
            pieces = cut(graph, plan.num_inner, schedule)
            self._pieces[graph] = (weakref.ref(plan), pieces)
        ctx.stats.count("sequential_layers", 1)
        if ctx.observers:
            raise NotImplementedError("exchange='sequential' never holds a layer's halo rows "
                                      "at once: a sampler that learns from them (PSC-GCN's) "
                                      "needs exchange='halo'")
        params = list(params) if torch.is_grad_enabled() else []
        linear = (linear and len(sources) == 1 and not params
                  and aggr in ("add", "sum", "mean") and isinstance(graph, Tensor)
                  and graph.layout == torch.sparse_csr
                  and keeps_transpose(graph)
                  and not torch.is_autocast_enabled(sources[0].device.type))
        spec = _Spec(ctx, key, schedule, graph, pieces, run, aggr, len(sources), len(others), params,
                     module, bool(ctx.overlap), linear)
        return _SequentialAggregation.apply(spec, *sources, *others, *params)
