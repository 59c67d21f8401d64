r"""``Engine``: how the layers of one distributed model aggregate with the
rows of their halo.

:func:`~pyg_dist.nn.distribute` picks one engine per model, once, from the
run's exchange and overlap settings (:data:`pyg_dist.nn.engines.ENGINES`,
:func:`~pyg_dist.nn.engines.select_engine`), and gives every
``MessagePassing`` layer of the model the class :func:`distributed_class`
makes of its own: the layer's ``propagate`` and ``edge_updater`` are the
engine's (:class:`DistributedLayer`). Everything the engine keeps about a
layer lives in one record, its :class:`LayerState`.

:class:`Engine` is the default, ``"gather"``: each layer receives its whole
halo (through the :class:`~pyg_dist.nn.HaloContext`'s cache and exchange),
appends it to its inner rows and runs PyG's propagate on the plan's graph.
:class:`OverlapEngine` (``"overlap"``) aggregates a layer's interior
targets while its halo rows travel; the sequential engine
(:mod:`pyg_dist.nn.sequential`) aggregates one peer's rows at a time; the
per-node engine (:mod:`pyg_dist.nn.async_layers`) schedules rows across
layers. ``docs/architecture.md`` maps flags to engines.

A layer of pyg_dist's (:mod:`pyg_dist.nn.conv`) asks its engine one
question, :meth:`Engine.may_project` (may it aggregate its projected rows
instead of projecting their aggregate?); self-exchanging layers (GAT) ask
:meth:`Engine.attention_inputs` for their inputs on the plan.
"""
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_dist.comm import exchange_class, get_exchange
from pyg_dist.nn import gcn_norm
from pyg_dist.nn.arguments import source_args, target_args
from pyg_dist.nn.context import HaloContext
from pyg_dist.nn.conv.gcn_conv import gcn_graph
from pyg_dist.nn.pieces import aggregate_csr_pieces, csr_pieces_apply, propagate_pieces
from pyg_dist.nn.spec import LayerSpec
from pyg_dist.nn.state import STATE, LayerState, state_of

class DistributedLayer:
    r"""Mixed into a distributed layer's class (:func:`distributed_class`):
    its ``propagate`` and ``edge_updater`` are its engine's (and its fused
    aggregation, where the engine sets one for a call);
    :meth:`pyg_propagate` and :meth:`pyg_edge_updater` are PyG's, which the
    engine calls on the plan's arguments."""

    def propagate(self, edge_index, size=None, **kwargs):
        state = self.__dict__[STATE]
        return state.engine.propagate(state, edge_index, size, kwargs)

    def edge_updater(self, edge_index, size=None, **kwargs):
        state = self.__dict__[STATE]
        return state.engine.edge_updater(state, edge_index, size, kwargs)

    def message_and_aggregate(self, edge_index, *args, **kwargs):
        state = self.__dict__[STATE]
        if state.aggregation is not None:  # the engine's, for this call
            return state.aggregation(edge_index, *args, **kwargs)
        return super().message_and_aggregate(edge_index, *args, **kwargs)

    def pyg_propagate(self, edge_index, size=None, **kwargs):
        return super().propagate(edge_index, size=size, **kwargs)

    def pyg_edge_updater(self, edge_index, size=None, **kwargs):
        return super().edge_updater(edge_index, size=size, **kwargs)


_CLASSES: Dict[type, type] = {}


def distributed_class(cls: type) -> type:
    r"""The class a layer of class :obj:`cls` (its spec's subclass where it
    has one, e.g. ``DistGCNConv``) takes under :func:`~pyg_dist.nn.distribute`:
    :obj:`cls` with :class:`DistributedLayer` first, made once per class and
    named as :obj:`cls` (``repr`` and ``state_dict`` are PyG's)."""
    if issubclass(cls, DistributedLayer):
        return cls
    made = _CLASSES.get(cls)
    if made is None:
        # propagate and edge_updater in the class' own namespace: PyG compiles
        # its templates over a class that lacks them (e.g. on unpickling).
        made = type(cls.__name__, (DistributedLayer, cls), {
            "__module__": __name__, "__qualname__": cls.__qualname__,
            "propagate": DistributedLayer.propagate,
            "edge_updater": DistributedLayer.edge_updater})
        _CLASSES[cls] = made
    return made


class Engine:
    r"""The default engine, ``"gather"``: every layer gathers its halo rows
    (``[inner | halo]``, through :meth:`HaloContext.extend
    <pyg_dist.nn.HaloContext.extend>`), then aggregates them with PyG's
    propagate on the plan's graph (see the module)."""
    #: Its key in :data:`~pyg_dist.nn.engines.ENGINES`.
    name: ClassVar[str] = "gather"
    #: What it does, in a few words (docs, refusals).
    summary: ClassVar[str] = "each layer receives its whole halo, then aggregates"
    #: Capabilities (:mod:`pyg_dist.nn.compat`): it serves stale caches, a
    #: feature cache, ``precompute_layer0``; it posts raw transfers itself
    #: (:meth:`~pyg_dist.comm.exchange.Exchange.start`).
    stale_caches: ClassVar[bool] = True
    feature_cache: ClassVar[bool] = True
    precompute: ClassVar[bool] = True
    asynchronous_exchange: ClassVar[bool] = False
    #: It chooses per layer by a memory budget (``memory_budget``).
    budgets_memory: ClassVar[bool] = False

    def __init__(self, ctx: HaloContext, model: torch.nn.Module,
                 memory_budget: Optional[int] = None) -> None:
        self.ctx = ctx
        self.model = model
        self.memory_budget = memory_budget  # bytes; read where budgets_memory
        self.layers: List[LayerState] = []
        self._handles: List[Any] = []  # hooks on modules other than the layers

    # ---- set-up --------------------------------------------------------------
    @classmethod
    def check(cls, model: torch.nn.Module, exchange) -> None:
        r"""Raises, before any work, for a :obj:`model` this engine cannot
        run exactly on :obj:`exchange` (what composes with what is
        :func:`pyg_dist.nn.compat.refusals`); by default nothing."""

    def model_class(self, module: torch.nn.Module) -> Optional[type]:
        r"""The class :obj:`module` (not a layer) takes under this engine
        (``None``: its own)."""
        return None

    def attach(self, module: torch.nn.Module, key: str, spec: LayerSpec) -> LayerState:
        r"""Takes on :obj:`module` (already of its :func:`distributed_class`):
        its record is :func:`~pyg_dist.nn.state.state_of` it."""
        state = LayerState(self, module, key, len(self.layers), spec)
        setattr(module, STATE, state)
        state.hooks += [module.register_forward_pre_hook(self._enter_layer),
                        module.register_forward_hook(self._leave_layer, always_call=True),
                        module.register_message_forward_hook(self._weigh_messages)]
        self.layers.append(state)
        return state

    def install(self, model: torch.nn.Module) -> None:
        r"""Hooks of the model as a whole (called once every layer is attached)."""
        self._handles += [model.register_forward_pre_hook(self._begin_pass, with_kwargs=True),
                          model.register_forward_hook(self._end_pass, always_call=True)]
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                self._handles.append(module.register_forward_hook(self._remember_undropped))

    def detach(self) -> None:
        r"""Removes every hook this engine registered (a model distributed
        again gets a new engine)."""
        for handle in self._handles + [h for s in self.layers for h in s.hooks]:
            handle.remove()
        self._handles = []
        for state in self.layers:
            state.hooks = []

    def forward(self, model: torch.nn.Module, args: tuple, kwargs: Dict[str, Any]) -> Any:
        r"""The model's forward, for an engine that runs the model as a whole
        (``NotImplemented``: each layer runs its own)."""
        return NotImplemented

    # ---- hooks ---------------------------------------------------------------
    def _begin_pass(self, model, args, kwargs) -> None:
        self.ctx.begin_pass(args[0] if args else kwargs.get("x"))

    def _end_pass(self, model, args, out) -> None:
        self.ctx.end_pass()

    def _remember_undropped(self, module: torch.nn.Dropout, inputs, out: Tensor) -> None:
        r"""Remembers a dropout's input with its output, so that a stale
        cache can exchange the undropped rows (see :meth:`HaloContext.fetch
        <pyg_dist.nn.HaloContext.fetch>`)."""
        if module.training and module.p > 0 and out is not inputs[0] \
                and self.ctx.active_cache.stale:
            self.ctx.undropped[out] = (inputs[0], module.p)

    def _enter_layer(self, module, args):
        r"""Cuts the node rows a layer is given to its plan's inputs when the
        plan says so (a mini-batch's layers run on shrinking prefixes), and
        gives a layer whose spec is ``edge_index_only`` the partition's
        ``edge_index`` for its ``adj_t``."""
        state, ctx = state_of(module), self.ctx
        gcn_norm.enter(ctx)  # first: _leave_layer runs even if this hook raises
        ctx.enter(state)
        state.calls = 0
        args = list(args)
        if state.spec.edge_index_only and len(args) > 1 and args[1] is ctx.data.adj_t:
            args[1] = ctx.data.edge_index
        x = args[0] if args else None
        if ctx.plan.trim_input and isinstance(x, Tensor) and x.size(0) > ctx.num_inner:
            args[0] = x[:ctx.num_inner]
        state.given = args[0] if args else None
        return tuple(args)

    def _leave_layer(self, module, args, out) -> None:
        state_of(module).given = None
        gcn_norm.leave()

    def _weigh_messages(self, module, inputs, messages: Tensor):
        r"""Multiplies each message of a sampled plan's edge by its weight
        (:meth:`~pyg_dist.comm.HaloPlan.edge_weight`) on the per-edge path."""
        weight = state_of(module).message_weight
        if weight is None:
            return None
        if messages.size(0) != weight.numel():
            raise RuntimeError(
                f"Layer '{state_of(module).key}' made {messages.size(0)} messages for "
                f"the {weight.numel()} edges of the sampled plan: a layer that adds or "
                f"removes edges inside its forward cannot be sampled with rescaling")
        return messages * weight.to(messages.dtype).view((-1, ) + (1, ) * (messages.dim() - 1))

    # ---- what layers ask -----------------------------------------------------
    def may_project(self, layer: torch.nn.Module, x_src: Tensor) -> bool:
        r"""Whether :obj:`layer` may aggregate (and exchange) a projection of
        its source rows :obj:`x_src` instead of the rows themselves: not
        when they must travel as they are (the input features under a
        feature cache or precomputed, every layer under a stale cache, which
        keeps features stale, never weights), nor on whole-block exchanges
        (CAGNET's blocks are the layer's input)."""
        state, ctx = state_of(layer), self.ctx
        if ctx.exchange.whole_blocks:
            return False
        if state is not None and state.precompute and ctx.is_input_features(x_src):
            return False
        return not ctx.exchanges_raw(x_src)

    def exchanges(self, layer: torch.nn.Module, raw: bool) -> None:
        r"""Told by :obj:`layer` whether the rows it aggregates this pass are
        its input (``raw``) or already multiplied by its neighbour weight."""
        state_of(layer).exchanges_raw = raw

    def attention_inputs(self, layer: torch.nn.Module, x: Tensor, edge_index,
                         edge_attr: Optional[Tensor]):
        r"""``(x, edge_index, edge_attr)`` for a layer that attends over the
        plan's edges: its sources ``(x_inner | x_halo, x_inner)`` and the
        plan's ``edge_index`` and per-edge attributes."""
        state, ctx = state_of(layer), self.ctx
        ctx.enter(state)
        if edge_attr is not None and ctx.is_local_graph(edge_index):
            edge_attr = ctx.plan.edges(edge_attr)
        edge_index = ctx.adjacency(edge_index, fused=False)
        return (ctx.extend(state.key, x), x), edge_index, edge_attr

    # ---- propagate -----------------------------------------------------------
    def propagate(self, state: LayerState, edge_index, size, kwargs: Dict[str, Any]):
        r"""A distributed layer's propagate: PyG's on the plan's arguments."""
        layer = state.module
        if state.prepared or state.spec.self_exchanging:  # its forward gathered them
            return layer.pyg_propagate(edge_index, size=size, **kwargs)
        ctx = self.ctx
        ctx.enter(state)
        if state.spec.normalisation == "gcn":
            return self._normalised(state, edge_index, kwargs)
        if state.precompute and self._precomputes(kwargs):
            if self.precomputes_piecewise(state, edge_index):
                def compute() -> Tensor:
                    return propagate_pieces(self, state, edge_index, kwargs,
                                            get_exchange("sequential"))
            else:
                def compute() -> Tensor:
                    return self._propagate(state, edge_index, size, kwargs)
            return ctx.precompute(state.key, compute)
        return self._propagate(state, edge_index, size, kwargs)

    def precomputes_piecewise(self, state: LayerState, edge_index) -> bool:
        r"""Whether a precomputed first layer (``precompute_layer0``)
        aggregates the input features one peer's rows at a time, through a
        sequential exchange made for that pass
        (:func:`~pyg_dist.nn.pieces.propagate_pieces`), instead of as any
        pass, the whole halo received at once. The pass runs once and
        without autograd, so no row is fetched twice, and the input features
        are the widest rows a model receives: held all at once, joined to
        the inner rows, they set a rank's peak memory (4 METIS parts of
        ``reddit_shaped(30000)``, 602 features, GraphSAGE: peak RSS per rank
        487 MiB at once, 450 piece by piece, ``benchmarks/sar.py``). Piece
        by piece where the exchange moves rows point to point, exactly (no
        codec), with no feature cache and nothing observing the rows, on the
        partition's own graph, with more than one rank, for an aggregation
        that folds over the pieces (sum, mean, min, max)."""
        ctx, aggr = self.ctx, state.module.aggr
        # the partition's own graph only, not a batch's (HaloContext.is_local_graph
        # takes both): the pass runs on the full plan, which pieces its own graph
        return (ctx.exchange.point_to_point and ctx.codec is None and ctx.feature_cache is None
                and not ctx.observers and ctx.exchanges_now(ctx.full_plan)
                and any(edge_index is g for g in (ctx.data.edge_index, ctx.data.adj_t))
                and isinstance(aggr, str) and aggr in exchange_class("sequential").aggregations)

    def edge_updater(self, state: LayerState, edge_index, size, kwargs: Dict[str, Any]):
        return state.module.pyg_edge_updater(edge_index, size=size, **kwargs)

    def _precomputes(self, kwargs: Dict[str, Any]) -> bool:
        x = kwargs.get("x")
        x_src = x[0] if isinstance(x, (tuple, list)) else x
        return (isinstance(x_src, Tensor) and self.ctx.is_input_features(x_src)
                and all(v is None for k, v in kwargs.items() if k != "x"))

    def plain(self, state: LayerState, graph, size, **kwargs):
        r"""PyG's propagate of the layer on arguments the engine prepared."""
        state.prepared = True
        try:
            return state.module.pyg_propagate(graph, size=size, **kwargs)
        finally:
            state.prepared = False

    def _propagate(self, state: LayerState, edge_index, size, kwargs: Dict[str, Any]):
        r"""Extends every source-side node tensor with the plan's halo rows,
        restricts per-edge arguments (``edge_*``) to the plan's edges and
        swaps the partition's adjacency for the form this layer aggregates
        fastest, then runs PyG's propagate."""
        ctx, layer = self.ctx, state.module
        sources = source_args(layer)
        # A layer that propagates K times exchanges K times, each under its own key.
        call, state.calls = state.calls, state.calls + 1
        suffix = f"#{call}" if call else ""
        targets = set(target_args(layer))
        kwargs = dict(kwargs)
        for arg in sources:
            value, key = kwargs.get(arg), f"{state.key}.{arg}{suffix}"
            if ctx.active_cache.stale:
                source = value[0] if isinstance(value, (tuple, list)) else value
                if isinstance(source, Tensor):
                    _check_features_only(state, arg, source)
            if isinstance(value, Tensor):
                # read at targets too (x_i): the targets keep the inner rows
                kwargs[arg] = ((ctx.extend(key, value), value) if arg in targets
                               else ctx.extend(key, value))
            elif isinstance(value, (tuple, list)) and isinstance(value[0], Tensor):
                kwargs[arg] = (ctx.extend(key, value[0]), value[1])
        graph, state.message_weight, kwargs = ctx.propagate_args(layer, edge_index, kwargs,
                                                                 sources)
        try:
            return self.plain(state, graph, (ctx.num_src, ctx.num_inner), **kwargs)
        finally:
            state.message_weight = None

    def _normalised(self, state: LayerState, edge_index, kwargs: Dict[str, Any]):
        r"""GCN's propagate: its graph normalised with the whole graph's
        degrees on the plan's edges (:func:`~pyg_dist.nn.conv.gcn_conv.gcn_graph`),
        aggregated by :meth:`aggregate`; with ``precompute_layer0`` and the
        input features, once on the exact plan."""
        ctx, x = self.ctx, kwargs["x"]
        edge_weight = kwargs.get("edge_weight")

        def aggregate(piecewise: bool = False) -> Tensor:
            graph, weight = gcn_graph(ctx, state.module, edge_index, edge_weight, x.dtype)

            def run(adj, x_src: Tensor, size: Tuple[int, int]) -> Tensor:
                return self.plain(state, adj, size, x=x_src, edge_weight=weight)

            if piecewise and csr_pieces_apply(ctx, graph):
                return aggregate_csr_pieces(self, state, state.key, x, graph, run,
                                            get_exchange("sequential"))
            return self.aggregate(state, state.key, x, graph, run)

        if state.precompute and edge_weight is None and ctx.is_input_features(x):
            piecewise = self.precomputes_piecewise(state, edge_index)
            return ctx.precompute(state.key, lambda: aggregate(piecewise))
        return aggregate()

    def aggregate(self, state: LayerState, key: str, x: Tensor, adj,
                  run: Callable[[Any, Tensor, Tuple[int, int]], Tensor]) -> Tensor:
        r"""``run(adj, x_src, size)``: a layer's aggregation of :obj:`x`'s
        plan sources over :obj:`adj` (the plan's graph), the halo rows
        gathered first."""
        ctx = self.ctx
        return run(adj, ctx.extend(key, x), (ctx.num_src, ctx.num_inner))


class OverlapEngine(Engine):
    r"""``"overlap"`` (CM-GCN §III-C within a layer): a layer that
    aggregates one source tensor on the fused sparse path, under the exact
    cache, starts its halo rows' transfer, aggregates its *interior*
    targets (no halo in-edge) while they travel and its *border* targets
    once they arrive (:meth:`~pyg_dist.comm.HaloPlan.split_rows`): the same
    result with the transfer behind the interior work. Any other layer or
    call gathers first, as :class:`Engine`."""
    name = "overlap"
    summary = "each layer aggregates its interior targets while its halo rows travel"

    def _propagate(self, state: LayerState, edge_index, size, kwargs: Dict[str, Any]):
        ctx, layer = self.ctx, state.module
        sources = source_args(layer)
        if not (layer.fuse and len(sources) == 1 and ctx.is_local_graph(edge_index)
                and all(v is None for k, v in kwargs.items() if k not in sources)):
            return super()._propagate(state, edge_index, size, kwargs)
        (arg, ) = sources
        value = kwargs[arg]
        pair = isinstance(value, (tuple, list))
        aggr = layer.aggr if isinstance(layer.aggr, str) else None

        def run(adj, x_src: Tensor, size):
            return self.plain(state, adj, size,
                              **{**kwargs, arg: (x_src, value[1]) if pair else x_src})

        return self.aggregate(state, f"{state.key}.{arg}", value[0] if pair else value,
                              ctx.adjacency(edge_index, True, aggr), run)

    def aggregate(self, state: LayerState, key: str, x: Tensor, adj, run) -> Tensor:
        ctx = self.ctx
        plan = ctx.plan
        if not (isinstance(adj, Tensor) and adj.layout == torch.sparse_csr
                and ctx.exchanges_now(plan) and not ctx.active_cache.stale
                and not (ctx.feature_cache is not None and ctx.is_input_features(x))):
            return super().aggregate(state, key, x, adj, run)
        ctx.check_rows(key, x)
        ctx.stats.count("overlapped_layers", 1)
        wait = ctx.exchange.start_fetch(ctx, key, x, plan, ctx.codec)
        interior, border = plan.split_rows(adj)
        out = run(interior, x, (ctx.num_inner, ctx.num_inner))
        x_src = torch.cat([x, wait()], dim=0)
        ctx.observe(key, x_src)
        return out + run(border, x_src, (ctx.num_src, ctx.num_inner))


def _check_features_only(state: LayerState, arg: str, value: Tensor) -> None:
    r"""Refuses, under a stale cache, a layer that exchanges rows computed
    with its own parameters (e.g. ``SAGEConv(project=True)``, whose
    ``lin(x)`` precedes propagate): the stale rows would carry the
    parameters of the iteration they were computed at, which PipeGCN,
    PSC-GCN and SANCUS never do (only features and feature gradients go
    stale). Checked once per layer and argument, on its first stale pass,
    by walking the autograd graph from the rows back to the layer's
    input."""
    if arg in state.features_only:
        return
    module = state.module
    given = state.given
    given = list(given) if isinstance(given, (tuple, list)) else [given]
    if not any(value is g for g in given):
        stop = {g.grad_fn for g in given if isinstance(g, Tensor) and g.grad_fn is not None}
        params = {id(p) for p in module.parameters() if p.requires_grad}
        todo, seen = [value.grad_fn], set()
        while todo:
            fn = todo.pop()
            if fn is None or fn in seen or fn in stop:
                continue
            seen.add(fn)
            if id(getattr(fn, "variable", None)) in params:
                raise NotImplementedError(
                    f"Layer '{state.key}' ({type(module).__name__}) exchanges "
                    f"'{arg}' computed with its own parameters: a stale cache would "
                    f"mix the weights of an earlier iteration into this one (the stale "
                    f"methods keep only features stale). Use the exact cache, or a layer "
                    f"that transforms after aggregating (e.g. SAGEConv without project)")
            todo.extend(f for f, _ in fn.next_functions)
    state.features_only.add(arg)
