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
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing

from pyg_dist.distributed import max_over_ranks
from pyg_dist.nn.arguments import source_args
from pyg_dist.nn.engine import Engine
from pyg_dist.nn.pieces import (Deferred, aggregate_csr_pieces, csr_pieces_apply,
                                 propagate_pieces)
from pyg_dist.nn.spec import is_layer, layer_names, pyg_class
from pyg_dist.nn.state import LayerState, state_of


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
        layer computes from them. Where no rank has a halo (one rank) every
        layer materialises, budget or none: there is nothing to receive, and
        the whole graph multiplies faster than its one piece (in column
        blocks, :func:`~pyg_dist.utils.aggregate.column_blocks`)."""
        if state.materialised is None:
            need = self._halo * sum(math.prod(r.shape[1:]) * r.element_size() for r in rows)
            state.materialised = self._halo == 0 or (self._left is not None
                                                     and need <= self._left)
            if state.materialised and self._left is not None:
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
        return propagate_pieces(self, state, edge_index, kwargs, self.ctx.exchange)

    def aggregate(self, state: LayerState, key: str, x: Tensor, adj, run) -> Tensor:
        r"""GCN's aggregation over its normalised CSR, piece by piece."""
        if self.materialises(state, [x]):
            return super().aggregate(state, key, x, adj, run)
        if not csr_pieces_apply(self.ctx, adj):
            raise NotImplementedError(
                f"Layer '{key}': exchange='sequential' runs GCNConv on the partition's "
                f"own graph through its normalised CSR (normalize=True), with edge "
                f"weights that need no gradient; use exchange='halo' for this layer")
        return aggregate_csr_pieces(self, state, key, x, adj, run, self.ctx.exchange)

    def precomputes_piecewise(self, state: LayerState, edge_index) -> bool:
        r"""``False``: a precomputed layer runs as every layer does here
        (piece by piece, or materialised where the budget lets it)."""
        return False


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
