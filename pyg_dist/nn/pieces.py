r"""Aggregating a layer one peer's *piece* of its graph at a time, through
an exchange's :meth:`~pyg_dist.comm.exchange.Exchange.aggregate_pieces`
(:mod:`pyg_dist.comm.sequential` gives the formulas): a layer's propagate
runs once per piece, given that piece's source rows. The sequential engine
runs every layer so; any engine runs a precomputed first layer so
(:meth:`~pyg_dist.nn.engine.Engine.precomputes_piecewise`), whose rows, the
input features, are the widest a model receives."""
from typing import Any, Dict, List, NamedTuple

import torch
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing

from pyg_dist.nn.arguments import source_args, target_args
from pyg_dist.nn.spec import spec_of
from pyg_dist.nn.state import LayerState


def message_params(module: torch.nn.Module) -> List[Tensor]:
    r"""The trainable parameters :obj:`module`'s propagate reads (all of
    them for a class without a spec, a user's subclass of a PyG layer
    included)."""
    spec = spec_of(module)
    names = None if spec is None else spec.message_params
    return [p for name, p in module.named_parameters() if p.requires_grad
            and (names is None or name.split(".")[0] in names)]


class Deferred(NamedTuple):
    r"""An edge update (e.g. GAT's attention logits and softmax) left to
    each piece: the arguments it was called with."""
    kwargs: Dict[str, Any]


class Slots:
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


def propagate_pieces(engine, state: LayerState, edge_index, kwargs: Dict[str, Any],
                     exchange) -> Tensor:
    r""":obj:`state`'s layer's propagate on the plan's graph, one piece at a
    time through :obj:`exchange` (:obj:`engine` runs PyG's propagate of
    each piece)."""
    ctx, module = engine.ctx, state.module
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
    slots = Slots(module, kwargs)
    num_inner = ctx.num_inner
    # counted like the halo exchange's keys: layer.arg, #k for the k-th propagate
    key = f"{state.key}.{'+'.join(slots.names)}" + (f"#{call}" if call else "")

    def run(piece, rows: List[Tensor], others: List[Tensor]) -> Tensor:
        state.message_weight = None if weight is None else \
            weight.index_select(0, piece.edge_id)
        try:
            return engine.plain(state, piece.graph, (piece.num_rows, num_inner),
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
    return exchange.aggregate_pieces(ctx, key, graph, slots.sources, slots.others, run,
                                     module.aggr, module, message_params(module),
                                     linear=linear)


def csr_pieces_apply(ctx, adj) -> bool:
    r"""Whether :func:`aggregate_csr_pieces` takes :obj:`adj`: a CSR graph
    on the plan's sources whose values need no gradient (GCN's normalised
    graph of the partition's own edges)."""
    return (isinstance(adj, Tensor) and adj.layout == torch.sparse_csr
            and adj.size(1) == ctx.num_src and not adj.requires_grad)


def aggregate_csr_pieces(engine, state: LayerState, key: str, x: Tensor, adj, run,
                         exchange) -> Tensor:
    r"""GCN's aggregation (the layer's ``aggr``) of :obj:`x` over its
    normalised CSR :obj:`adj` (:func:`csr_pieces_apply`), one piece at a
    time through :obj:`exchange` (:meth:`Engine.aggregate
    <pyg_dist.nn.engine.Engine.aggregate>`'s :obj:`run`)."""
    num_inner = engine.ctx.num_inner
    return exchange.aggregate_pieces(
        engine.ctx, key, adj, [x], [],
        lambda piece, rows, _: run(piece.graph, rows[0], (piece.num_rows, num_inner)),
        state.module.aggr, state.module, (), linear=True)
