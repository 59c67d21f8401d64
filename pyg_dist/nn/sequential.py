r"""The layer side of the sequential exchange (SAR,
:class:`~pyg_dist.comm.sequential.Sequential`, whose module gives the
formulas): a layer's propagate runs once per peer's *piece* of its graph,
given that piece's source rows, and the exchange folds the partial
aggregates. Which PyG layers it computes exactly is
:data:`~pyg_dist.nn.spec.LAYERS`' ``sequential`` field; a layer of the
user's own is taken on trust when its aggregation decomposes.
"""
import inspect
from typing import Any, Dict, List, NamedTuple

import torch
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing

from pyg_dist.nn.arguments import source_args, target_args
from pyg_dist.nn.spec import layer_names, spec_of


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
        if not isinstance(module, MessagePassing):
            continue
        cls = type(module)
        name = cls.__name__
        pyg = cls.__module__.startswith("torch_geometric.")
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
    (bipartite), and the exchange folds the results."""
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

    def run(piece, rows: List[Tensor], others: List[Tensor]) -> Tensor:
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

    # a PyG layer whose propagate aggregates its input's source rows as they are
    # (GCN, SAGE, GIN, GraphConv: the first layer's aggregation precomputes), given
    # nothing but them (a pair's target rows are not read)
    spec = spec_of(module)
    linear = (spec is not None and spec.precomputable and weight is None
              and all(kind in ("source", "const") for _, kind, _ in slots.items))
    return ctx.exchange.aggregate_pieces(ctx, key, graph, slots.sources, slots.others, run,
                                         module.aggr, module, message_params(module),
                                         linear=linear)


def refuse_attention_weights(module: MessagePassing, args, kwargs) -> None:
    r"""Forward pre-hook: no layer returns attention weights under the
    sequential exchange (no piece holds a whole neighbourhood's)."""
    given = dict(zip(inspect.signature(module.forward).parameters, args), **kwargs)
    if given.get("return_attention_weights"):
        raise NotImplementedError(
            f"Layer '{module._dist_key}': exchange='sequential' returns no attention weights "
            f"(each peer's piece holds only part of a neighbourhood's)")
