r"""The sequential engine: the layer side of the sequential exchange (SAR,
:class:`~pyg_dist.comm.sequential.Sequential`, whose module gives the
formulas): a layer's propagate runs once per peer's *piece* of its graph,
given that piece's source rows, and the exchange folds the partial
aggregates. Which PyG layers it computes exactly is
:data:`~pyg_dist.nn.spec.LAYERS`' ``sequential`` field; a layer of the
user's own is taken on trust when its aggregation decomposes.

Given a memory budget (``memory_budget``, bytes), a layer whose halo rows
fit in what is left of it receives them all at once instead (SAR's
one-shot; the gather engine's path): :meth:`SequentialEngine.materialises`.
"""
import inspect
import math
from typing import Any, Dict, List, NamedTuple, Optional

import torch
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing

from pyg_dist.distributed import max_over_ranks
from pyg_dist.nn.arguments import source_args, target_args
from pyg_dist.nn.engine import Engine
from pyg_dist.nn.spec import is_layer, layer_names, pyg_class, spec_of
from pyg_dist.nn.state import LayerState, state_of


def message_params(module: torch.nn.Module) -> List[Tensor]:
    r"""The trainable parameters :obj:`module`'s propagate reads (all of
    them for a class without a spec, a user's subclass of a PyG layer
    included)."""
    spec = spec_of(module)
    names = None if spec is None else spec.message_params
    return [p for name, p in module.named_parameters() if p.requires_grad
            and (names is None or name.split(".")[0] in names)]


def check_model(model: torch.nn.Module, exchange) -> None:
    r"""Raises :class:`NotImplementedError`, naming each, for the layers of
    :obj:`model` the sequential :obj:`exchange` cannot compute exactly."""
    refused = []
    verified = layer_names(sequential=True)
    for path, module in model.named_modules():
        if not is_layer(module):
            continue
        cls = type(module)
        name = cls.__name__
        pyg = pyg_class(cls) is not None
        if pyg and name not in verified:
            refused.append(f"'{path}' ({name}): not among the layers verified under the "
                           f"sequential exchange ({', '.join(sorted(verified))})")
        elif not isinstance(module.aggr, str) or module.aggr not in exchange.aggregations:
            refused.append(f"'{path}' ({name}): its aggregation {module.aggr!r} does not "
                           f"decompose over peers (supported: sum, mean, max, min)")
        elif cls.update is not MessagePassing.update \
                or cls.aggregate is not MessagePassing.aggregate:
            refused.append(f"'{path}' ({name}): it overrides update or aggregate, which "
                           f"would run once per peer's piece instead of once")
    if refused:
        raise NotImplementedError("exchange='sequential' cannot compute these layers "
                                  "exactly (use exchange='halo'):\n  " + "\n  ".join(refused))


class Deferred(NamedTuple):
    r"""An edge update (e.g. GAT's attention logits and softmax) left to
    each piece: the arguments it was called with."""
    kwargs: Dict[str, Any]


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

    def build(self, items: list, piece, rows: List[Tensor],
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
                kwargs[name] = self.module.pyg_edge_updater(
                    piece.graph, size=(piece.num_rows, num_inner),
                    **self.build(slot, piece, rows, others, num_inner))
            else:
                kwargs[name] = slot
        return kwargs


class SequentialEngine(Engine):
    r"""``"sequential"`` (SAR): a layer's propagate (and deferred edge
    update) runs on each piece of the plan's graph, given that piece's
    source rows and the inner nodes as targets (bipartite), and the
    exchange (:meth:`~pyg_dist.comm.exchange.Exchange.aggregate_pieces`)
    folds the partial aggregates; no layer holds its whole halo, unless
    a memory budget lets it (:meth:`materialises`)."""
    name = "sequential"
    summary = "each layer aggregates one peer's rows at a time (SAR)"
    budgets_memory = True

    def __init__(self, ctx, model: torch.nn.Module,
                 memory_budget: Optional[int] = None) -> None:
        super().__init__(ctx, model, memory_budget)
        # Every rank must choose alike (the two exchanges' collectives differ):
        # the most halo rows of any rank, the smallest budget (none where any
        # rank has none), agreed in one all-reduce of (halo, -budget).
        agreed = max_over_ranks(torch.tensor([ctx.data.num_halo, 1 if memory_budget is None
                                              else -memory_budget], device=ctx.data.x.device),
                                ctx.group)
        self._halo = int(agreed[0])
        self.memory_budget = None if agreed[1] > 0 else -int(agreed[1])
        self._left = self.memory_budget  # bytes of the budget no layer has taken

    def materialises(self, state: LayerState, rows: List[Tensor]) -> bool:
        r"""Whether :obj:`state`'s layer receives its whole halo at once,
        decided at its first pass and kept: under a memory budget, when the
        halo rows it receives in one propagate call (the most halo nodes of
        any rank times the bytes of a row of :obj:`rows`, its source
        tensors) fit in what is left of the budget, which the layers take
        from in the order they first run (a precomputed first layer's pass
        too, whose rows are the input features). Such a layer runs as the
        gather engine runs it (one exchange and one aggregation, nothing
        fetched again in the backward pass); every other layer one peer's
        rows at a time. The budget counts received rows only, not what the
        layer computes from them."""
        if state.materialised is None:
            need = self._halo * sum(math.prod(r.shape[1:]) * r.element_size() for r in rows)
            state.materialised = self._left is not None and need <= self._left
            if state.materialised:
                self._left -= need
        return state.materialised

    def choices(self) -> Dict[str, str]:
        r"""How each layer that ran aggregates with remote rows:
        ``"materialised"`` (its whole halo at once) or ``"sequential"``."""
        return {state.key: "materialised" if state.materialised else "sequential"
                for state in self.layers if state.materialised is not None}

    @classmethod
    def check(cls, model: torch.nn.Module, exchange) -> None:
        check_model(model, exchange)

    def attach(self, module: torch.nn.Module, key: str, spec) -> LayerState:
        state = super().attach(module, key, spec)
        if "return_attention_weights" in inspect.signature(module.forward).parameters:
            state.hooks.append(module.register_forward_pre_hook(_refuse_attention_weights,
                                                                with_kwargs=True))
        return state

    def _leave_layer(self, module, args, out) -> None:
        state_of(module).plan_graph = False
        super()._leave_layer(module, args, out)

    def attention_inputs(self, layer, x: Tensor, edge_index, edge_attr):
        r"""An attention layer's inputs: its own rows and the plan's edges.
        Each rank transforms its own rows; every piece's sources travel
        transformed and its edges are scored by the deferred edge update."""
        state, ctx = state_of(layer), self.ctx
        if self.materialises(state, [x]):
            return super().attention_inputs(layer, x, edge_index, edge_attr)
        ctx.enter(state)
        if not ctx.is_local_graph(edge_index):
            raise NotImplementedError(
                f"Layer '{state.key}': exchange='sequential' attends over the "
                f"partition's own graph")
        if edge_attr is not None:
            edge_attr = ctx.plan.edges(edge_attr)
        state.plan_graph = True
        return x, ctx.adjacency(edge_index, fused=False), edge_attr

    def edge_updater(self, state: LayerState, edge_index, size, kwargs: Dict[str, Any]):
        r"""The per-edge values it would compute over the whole neighbourhood
        are computed per piece, inside propagate."""
        if state.prepared or state.materialised:
            return state.module.pyg_edge_updater(edge_index, size=size, **kwargs)
        return Deferred(kwargs)

    def propagate(self, state: LayerState, edge_index, size, kwargs: Dict[str, Any]):
        if state.spec.self_exchanging and not state.prepared and not state.materialised:
            self.ctx.enter(state)
            return self._propagate(state, edge_index, size, kwargs)
        return super().propagate(state, edge_index, size, kwargs)

    def _propagate(self, state: LayerState, edge_index, size, kwargs: Dict[str, Any]):
        if not state.plan_graph and self.materialises(state, _source_rows(state.module, kwargs)):
            return super()._propagate(state, edge_index, size, kwargs)
        ctx, module = self.ctx, state.module
        call, state.calls = state.calls, state.calls + 1
        if state.plan_graph:  # already the plan's (an attention layer's)
            graph, weight = edge_index, None
        elif ctx.is_local_graph(edge_index):
            graph, weight, kwargs = ctx.propagate_args(module, edge_index, kwargs,
                                                       source_args(module))
        else:
            raise NotImplementedError(
                f"Layer '{state.key}': exchange='sequential' aggregates the partition's "
                f"own graph (data.edge_index or data.adj_t)")
        slots = _Slots(module, kwargs)
        num_inner = ctx.num_inner
        # counted like the halo exchange's keys: layer.arg, #k for the k-th propagate
        key = f"{state.key}.{'+'.join(slots.names)}" + (f"#{call}" if call else "")

        def run(piece, rows: List[Tensor], others: List[Tensor]) -> Tensor:
            state.message_weight = None if weight is None else \
                weight.index_select(0, piece.edge_id)
            try:
                return self.plain(state, piece.graph, (piece.num_rows, num_inner),
                                  **slots.build(slots.items, piece, rows, others, num_inner))
            finally:
                state.message_weight = None
                if hasattr(module, "_alpha"):  # TransformerConv keeps a piece's scores
                    module._alpha = None

        # a PyG layer whose propagate aggregates its input's source rows as they are
        # (GCN, SAGE, GIN, GraphConv: the first layer's aggregation precomputes), given
        # nothing but them (a pair's target rows are not read)
        linear = (state.spec.precomputable and weight is None
                  and all(kind in ("source", "const") for _, kind, _ in slots.items))
        return ctx.exchange.aggregate_pieces(ctx, key, graph, slots.sources, slots.others, run,
                                             module.aggr, module, message_params(module),
                                             linear=linear)

    def aggregate(self, state: LayerState, key: str, x: Tensor, adj, run) -> Tensor:
        r"""GCN's aggregation over its normalised CSR, piece by piece."""
        if self.materialises(state, [x]):
            return super().aggregate(state, key, x, adj, run)
        ctx = self.ctx
        if not (isinstance(adj, Tensor) and adj.layout == torch.sparse_csr
                and adj.size(1) == ctx.num_src and not adj.requires_grad):
            raise NotImplementedError(
                f"Layer '{key}': exchange='sequential' runs GCNConv on the partition's "
                f"own graph through its normalised CSR (normalize=True), with edge "
                f"weights that need no gradient; use exchange='halo' for this layer")
        num_inner = ctx.num_inner
        return ctx.exchange.aggregate_pieces(
            ctx, key, adj, [x], [],
            lambda piece, rows, _: run(piece.graph, rows[0], (piece.num_rows, num_inner)),
            "sum", state.module, (), linear=True)


def _source_rows(module: MessagePassing, kwargs: Dict[str, Any]) -> List[Tensor]:
    r"""The source-side node tensors of a propagate call: the rows it exchanges."""
    rows = []
    for name in source_args(module):
        value = kwargs.get(name)
        value = value[0] if isinstance(value, (tuple, list)) else value
        if isinstance(value, Tensor) and value.dim() >= 1:
            rows.append(value)
    return rows


def _refuse_attention_weights(module: MessagePassing, args, kwargs) -> None:
    r"""Forward pre-hook: no layer returns attention weights under the
    sequential exchange (no piece holds a whole neighbourhood's)."""
    given = dict(zip(inspect.signature(module.forward).parameters, args), **kwargs)
    if given.get("return_attention_weights"):
        raise NotImplementedError(
            f"Layer '{state_of(module).key}': exchange='sequential' returns no attention "
            f"weights (each peer's piece holds only part of a neighbourhood's)")
