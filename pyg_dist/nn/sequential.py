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
iteration.

Exact: the result equals the materialising exchange (and single-process
PyG) up to floating-point rounding. Applies on the full-graph plans of the
exact cache, sampled ones included (a sampler's plan has fewer rows per
peer); layers are refused before any work unless their aggregation
decomposes (see :data:`SEQUENTIAL_CONVS`).
"""
import inspect
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
from torch_geometric.nn.conv import MessagePassing

from pyg_dist.comm.ring import RingSchedule, start_round
from pyg_dist.utils import csr_tensor

#: PyG layers the sequential exchange computes exactly (each verified
#: against single-process PyG by ``tests/test_sequential.py``). A layer of
#: the user's own is taken on trust when its aggregation is one of
#: :data:`AGGREGATIONS`, as :func:`~pyg_dist.nn.distribute` does.
SEQUENTIAL_CONVS = {"GCNConv", "SAGEConv", "GINConv", "GINEConv", "GraphConv", "GATConv",
                    "GATv2Conv", "TransformerConv"}

#: Aggregations that decompose over the pieces of a neighbourhood.
AGGREGATIONS = ("add", "sum", "mean", "max", "min")

#: The submodules of :data:`SEQUENTIAL_CONVS` that their messages or edge
#: updates use (recomputed per piece, so differentiated there); the others
#: act before or after propagate. A user's layer: all of them.
MESSAGE_PARAMS: Dict[str, Tuple[str, ...]] = {
    "GCNConv": (), "SAGEConv": (), "GINConv": (), "GraphConv": (), "GINEConv": ("lin", ),
    "GATConv": ("lin_edge", "att_edge"), "GATv2Conv": ("att", "lin_edge"),
    "TransformerConv": ("lin_edge", )}


def message_params(module: torch.nn.Module) -> List[Tensor]:
    r"""The trainable parameters :obj:`module`'s propagate reads (all of
    them for a class not in :data:`MESSAGE_PARAMS`, a user's subclass of one
    included)."""
    cls = type(module)
    if cls.__module__.startswith("pyg_dist."):  # DistGATConv & co: their PyG class
        cls = cls.__mro__[1]
    names = MESSAGE_PARAMS.get(cls.__name__) if cls.__module__.startswith(
        "torch_geometric.") else None
    return [p for name, p in module.named_parameters() if p.requires_grad
            and (names is None or name.split(".")[0] in names)]


def check_model(model: torch.nn.Module) -> None:
    r"""Raises :class:`NotImplementedError`, naming each, for the layers of
    :obj:`model` the sequential exchange cannot compute exactly."""
    refused = []
    for path, module in model.named_modules():
        if not isinstance(module, MessagePassing):
            continue
        cls = type(module)
        name = cls.__name__
        pyg = cls.__module__.startswith("torch_geometric.")
        if pyg and name not in SEQUENTIAL_CONVS:
            refused.append(f"'{path}' ({name}): not among the layers verified under the "
                           f"sequential exchange ({', '.join(sorted(SEQUENTIAL_CONVS))})")
        elif not isinstance(module.aggr, str) or module.aggr not in AGGREGATIONS:
            refused.append(f"'{path}' ({name}): its aggregation {module.aggr!r} does not "
                           f"decompose over peers (supported: sum, mean, max, min)")
        elif cls.update is not MessagePassing.update \
                or cls.aggregate is not MessagePassing.aggregate:
            refused.append(f"'{path}' ({name}): it overrides update or aggregate, which "
                           f"would run once per peer's piece instead of once")
    if refused:
        raise NotImplementedError("exchange='sequential' cannot compute these layers "
                                  "exactly (use exchange='halo'):\n  " + "\n  ".join(refused))


class Piece(NamedTuple):
    r"""The edges of one round: from ``sources`` (source ids of the plan)
    into the inner nodes, their sources numbered from 0 in ``graph`` (a CSR
    ``adj_t`` or an ``edge_index``); ``edge_id`` are their positions in the
    graph they were cut from (``edge_index`` form) and ``count`` the edges
    into each target (``num_edges`` in all)."""
    sources: slice
    graph: Any
    edge_id: Optional[Tensor]
    count: Tensor
    num_edges: int

    @property
    def num_rows(self) -> int:
        return self.sources.stop - self.sources.start


def cut(graph, num_inner: int, schedule: RingSchedule) -> List[Piece]:
    r""":obj:`graph` (the plan's, sources are ``[inner | received halo]``)
    cut into the pieces of the ring's rounds."""
    if isinstance(graph, Tensor) and graph.layout == torch.sparse_csr:
        crow, col, value = graph.crow_indices(), graph.col_indices(), graph.values()
        row = torch.repeat_interleave(torch.arange(num_inner, device=col.device), crow.diff(),
                                      output_size=col.numel())
    elif isinstance(graph, Tensor) and graph.dim() == 2 and graph.size(0) == 2:
        col, row = graph
    else:
        raise NotImplementedError("exchange='sequential' takes the partition's edge_index or "
                                  f"torch CSR adj_t, not a {type(graph).__name__}")
    pieces = []
    for k in range(schedule.world):
        sources = schedule.sources(k)
        keep = ((col >= sources.start) & (col < sources.stop)).nonzero().view(-1)
        count = torch.bincount(row[keep], minlength=num_inner)
        size = (num_inner, sources.stop - sources.start)
        if graph.layout == torch.sparse_csr:
            crow_k = torch.cat([crow.new_zeros(1), count.cumsum(0)])
            piece = csr_tensor(crow_k, col[keep] - sources.start, value[keep], size)
            pieces.append(Piece(sources, piece, None, count, keep.numel()))
        else:
            piece = torch.stack([col[keep] - sources.start, row[keep]])
            pieces.append(Piece(sources, piece, keep, count, keep.numel()))
    return pieces


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


Run = Callable[[Piece, List[Tensor], List[Tensor]], Tensor]


class _Spec(NamedTuple):
    ctx: Any  # the HaloContext
    key: str
    schedule: RingSchedule
    pieces: List[Piece]
    run: Run  # (piece, its source rows, the other tensors) -> partial aggregate
    aggr: str
    num_sources: int
    num_others: int
    params: List[Tensor]
    module: torch.nn.Module
    prefetch: bool  # the next round's rows travel while this one computes


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
        fold = _Fold(spec.aggr, spec.pieces)
        like = (sources + others)[0]
        rng = []  # the generator state of each piece, replayed by the backward
        for k, rows in _rounds(spec, sources, spec.key):
            rng.append(_rng_state(like) if spec.module.training else None)
            if spec.pieces[k].num_edges:
                softmax = _Softmax()
                with _routed_softmax(spec.module, softmax):
                    fold.add(k, spec.run(spec.pieces[k], rows, others), softmax)
            del rows
        out = fold.result(like.new_zeros((spec.ctx.num_inner, ) + tuple(like.shape[1:])))
        # The output is saved as such: held by the context it would form a
        # cycle (output -> grad_fn -> context -> output) that only the
        # garbage collector frees, keeping whole iterations alive.
        fold.out = None
        fctx.spec, fctx.fold, fctx.rng = spec, fold, rng
        fctx.autocast = _autocast_state(like)
        fctx.save_for_backward(*sources, *others, out)
        return out

    @staticmethod
    def backward(fctx, grad: Tensor):
        spec, fold = fctx.spec, fctx.fold
        *saved, out = fctx.saved_tensors
        sources, others = list(saved[:spec.num_sources]), list(saved[spec.num_sources:])
        other_leaves = [o.detach().requires_grad_(o.requires_grad) for o in others]
        source_grads: List[Optional[Tensor]] = [None] * len(sources)
        other_grads: List[Optional[Tensor]] = [None] * len(others)
        param_grads: List[Optional[Tensor]] = [None] * len(spec.params)
        send_back = any(s.requires_grad for s in sources)
        returning = None  # a round's gradients on their way to their owner
        replay = any(state is not None for state in fctx.rng)
        with torch.random.fork_rng(devices=_rng_devices(grad), enabled=replay):
            for k, rows in _rounds(spec, sources, spec.key + ".refetch"):
                piece = spec.pieces[k]
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
                    row_grads = [got.pop(0) if t.requires_grad else None for t in leaves]
                    for i, t in enumerate(other_leaves):
                        if t.requires_grad:
                            other_grads[i] = _add(other_grads[i], got.pop(0))
                    for i, g in enumerate(got):
                        param_grads[i] = _add(param_grads[i], g)
                del rows, leaves
                if k == 0:  # owned from here on (index_add_ below): never the incoming grad
                    source_grads = [g.clone() if g is not None and _shares(g, grad) else g
                                    for g in row_grads]
                elif send_back:
                    if returning is not None:
                        _receive_grads(returning, source_grads, sources)
                    returning = (_return_grads(spec, k, row_grads, sources),
                                 spec.schedule.send_index(k))
                    if not spec.prefetch:  # no round's gradients held while computing
                        _receive_grads(returning, source_grads, sources)
                        returning = None
            if returning is not None:
                _receive_grads(returning, source_grads, sources)
        source_grads = [g if g is not None or not s.requires_grad else torch.zeros_like(s)
                        for g, s in zip(source_grads, sources)]
        return (None, *source_grads, *other_grads, *param_grads)


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
    block = _pack(grads, torch.arange(grads[0].size(0), device=grads[0].device))
    return start_round(block, schedule.recv_from(k), schedule.send_to(k),
                       schedule.send_index(k).numel(), spec.ctx.group, spec.ctx.codec,
                       spec.ctx.stats, spec.key + ".grad", backward=True)


def _receive_grads(returning, source_grads: List[Optional[Tensor]],
                   sources: Sequence[Tensor]) -> None:
    r"""Adds the gradients this rank's rows got from a peer into
    :obj:`source_grads` (in place)."""
    transfer, index = returning
    block = transfer.wait()
    if block is None:
        return
    for i, (s, part) in enumerate(zip(sources, _unpack(block, sources))):
        if s.requires_grad:
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


def sequential_aggregate(ctx, key: str, graph, sources: List[Tensor], others: List[Tensor],
                         run: Run, aggr: str, module: torch.nn.Module) -> Tensor:
    r"""The layer's aggregation over :obj:`graph` (the current plan's, in
    its source ids) computed piece by piece: :obj:`run` ``(piece, rows,
    others)`` aggregates one piece given its rows of each of
    :obj:`sources` (inner rows) and the :obj:`others` tensors it reads
    (target rows, per-edge tensors; gradients flow to them and to the
    module's parameters)."""
    plan = ctx.plan
    if plan.data is not ctx.data or plan.trim_input:
        raise NotImplementedError("exchange='sequential' runs on full-graph plans (the "
                                  "full-graph loader, with or without a halo sampler)")
    world = dist.get_world_size(ctx.group) if dist.is_initialized() else 1
    schedule = RingSchedule.of(plan, ctx.rank if world > 1 else 0, world)
    # Kept on the graph, so they live as long as it does (a plan's adjacency
    # for the plan's lifetime, a per-call graph for the call); the plan is
    # held weakly: a plan's cache holds its graphs.
    hit = getattr(graph, "_dist_pieces", None)
    if hit is not None and hit[0]() is plan:
        pieces = hit[1]
    else:
        pieces = cut(graph, plan.num_inner, schedule)
        graph._dist_pieces = (weakref.ref(plan), pieces)
    ctx.stats.count("sequential_layers", 1)
    if ctx.observers:
        raise NotImplementedError("exchange='sequential' never holds a layer's halo rows "
                                  "at once: a sampler that learns from them (PSC-GCN's) "
                                  "needs exchange='halo'")
    params = message_params(module) if torch.is_grad_enabled() else []
    spec = _Spec(ctx, key, schedule, pieces, run, aggr, len(sources), len(others), params,
                 module, bool(ctx.overlap))
    return _SequentialAggregation.apply(spec, *sources, *others, *params)


def source_args(module: MessagePassing, user_args: str = "_user_args") -> List[str]:
    r"""Arguments of propagate (or of the edge updater) that messages read
    at the source (``*_j``), in the order of the message signature: every
    rank exchanges them in the same order (a set's order follows each
    process's string hashing, so two tensors of one shape could be swapped
    between ranks)."""
    return list(dict.fromkeys(arg[:-2] for arg in getattr(module, user_args)
                              if arg.endswith("_j")))


def target_args(module: MessagePassing, user_args: str = "_user_args") -> List[str]:
    r"""Arguments of propagate (or of the edge updater) read at the target
    (``*_i``)."""
    return [arg[:-2] for arg in getattr(module, user_args) if arg.endswith("_i")]


class Deferred(NamedTuple):
    r"""An edge update (e.g. GAT's attention logits and softmax) left to
    each piece: the arguments it was called with."""
    kwargs: Dict[str, Any]


def defer_edge_update(module: MessagePassing, edge_index, size=None, **kwargs) -> Deferred:
    r"""``edge_updater`` under the sequential exchange: the per-edge values
    it would compute over the whole neighbourhood are computed per piece,
    inside propagate (:func:`sequential_propagate`)."""
    return Deferred(kwargs)


class _Slots:
    r"""A layer's propagate arguments split into the source rows that travel
    (``sources``), the other tensors (``others``: target rows, per-edge
    tensors) and constants, rebuilt per piece by :meth:`build`."""

    def __init__(self, module: MessagePassing, kwargs: Dict[str, Any]) -> None:
        self.module = module
        self.sources: List[Tensor] = []
        self.names: List[str] = []  # of the sources
        self.others: List[Tensor] = []
        self.items = self._split(kwargs, "_user_args")

    def _split(self, kwargs: Dict[str, Any], user_args: str) -> list:
        sources = source_args(self.module, user_args)
        targets = target_args(self.module, user_args)
        items = []
        for name, value in kwargs.items():
            if isinstance(value, Deferred):
                items.append((name, "deferred", self._split(value.kwargs, "_edge_user_args")))
            elif name in sources and isinstance(value, (Tensor, tuple, list)):
                pair = not isinstance(value, Tensor)
                source, target = (value[0], value[1]) if pair else \
                    (value, value if name in targets else None)
                # one tensor given to the edge updater and to propagate travels once
                known = [i for i, t in enumerate(self.sources) if t is source]
                if not known:
                    self.sources.append(source)
                    self.names.append(name)
                index = known[0] if known else len(self.sources) - 1
                slot = None
                if target is not None:
                    self.others.append(target)
                    slot = len(self.others) - 1
                items.append((name, "source", (index, slot, pair or slot is not None)))
            elif isinstance(value, Tensor):
                self.others.append(value)
                kind = "edge" if name.startswith("edge_") else "tensor"
                items.append((name, kind, len(self.others) - 1))
            else:
                items.append((name, "const", value))
        return items

    def build(self, items: list, piece: Piece, rows: List[Tensor],
              others: List[Tensor], num_inner: int) -> Dict[str, Any]:
        kwargs = {}
        for name, kind, slot in items:
            if kind == "source":
                source, target, pair = slot
                rows_ = rows[source]
                kwargs[name] = (rows_, None if target is None else others[target]) \
                    if pair else rows_
            elif kind == "edge":
                value = others[slot]
                kwargs[name] = value if piece.edge_id is None else \
                    value.index_select(0, piece.edge_id)
            elif kind == "tensor":
                kwargs[name] = others[slot]
            elif kind == "deferred":
                kwargs[name] = type(self.module).edge_updater(
                    self.module, piece.graph, size=(piece.num_rows, num_inner),
                    **self.build(slot, piece, rows, others, num_inner))
            else:
                kwargs[name] = slot
        return kwargs


def sequential_propagate(module: MessagePassing, edge_index, size=None, **kwargs):
    r"""``propagate`` under the sequential exchange: the layer's own
    propagate (and deferred edge update) runs on each piece of the plan's
    graph, given that piece's source rows and the inner nodes as targets
    (bipartite), and :func:`sequential_aggregate` folds the results."""
    ctx = module._dist_ctx
    ctx.enter(module._dist_key)
    call = getattr(module, "_dist_calls", 0)
    module._dist_calls = call + 1
    if getattr(module, "_dist_plan_graph", False):  # already the plan's (DistGATConv)
        graph, weight = edge_index, None
    elif ctx.is_local_graph(edge_index):
        graph, weight, kwargs = ctx.propagate_args(module, edge_index, kwargs,
                                                   source_args(module))
    else:
        raise NotImplementedError(
            f"Layer '{module._dist_key}': exchange='sequential' aggregates the partition's "
            f"own graph (data.edge_index or data.adj_t)")
    slots = _Slots(module, kwargs)
    num_inner = ctx.num_inner
    # counted like the halo exchange's keys: layer.arg, #k for the k-th propagate
    key = f"{module._dist_key}.{'+'.join(slots.names)}" + (f"#{call}" if call else "")

    def run(piece: Piece, rows: List[Tensor], others: List[Tensor]) -> Tensor:
        module._dist_prepared = True
        module._dist_message_weight = None if weight is None else \
            weight.index_select(0, piece.edge_id)
        try:
            return type(module).propagate(module, piece.graph, size=(piece.num_rows, num_inner),
                                          **slots.build(slots.items, piece, rows, others,
                                                        num_inner))
        finally:
            module._dist_prepared, module._dist_message_weight = False, None
            if hasattr(module, "_alpha"):  # TransformerConv keeps a piece's scores
                module._alpha = None

    return sequential_aggregate(ctx, key, graph, slots.sources, slots.others, run,
                                module.aggr, module)


def refuse_attention_weights(module: MessagePassing, args, kwargs) -> None:
    r"""Forward pre-hook: no layer returns attention weights under the
    sequential exchange (no piece holds a whole neighbourhood's)."""
    given = dict(zip(inspect.signature(module.forward).parameters, args), **kwargs)
    if given.get("return_attention_weights"):
        raise NotImplementedError(
            f"Layer '{module._dist_key}': exchange='sequential' returns no attention weights "
            f"(each peer's piece holds only part of a neighbourhood's)")
