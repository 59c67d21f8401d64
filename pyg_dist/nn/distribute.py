"""``distribute()``: turn a plain PyG model into a partition-parallel one."""
import inspect
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing

from pyg_dist.cache import FeatureCache, HaloCache
from pyg_dist.comm import DEFAULT_EXCHANGE, Exchange, get_exchange
from pyg_dist.comm.stats import CommStats
from pyg_dist.data import DistData
from pyg_dist.nn import async_layers, gcn_norm, sequential
from pyg_dist.nn.arguments import source_args, target_args
from pyg_dist.nn.context import HaloContext
from pyg_dist.nn.dropout import fast_dropout
from pyg_dist.nn.conv import DistGCNConv
from pyg_dist.nn.norm import NORMS
from pyg_dist.nn.spec import LayerSpec, layer_names, spec_of
from pyg_dist.nn.support import check_model

# The facts about each PyG layer (which get a subclass, which fetch their
# halo rows themselves, which precompute) are pyg_dist.nn.spec.LAYERS'.


def distribute(model: torch.nn.Module, data: DistData, group=None,
               stats: Optional[CommStats] = None, precompute_layer0: bool = False,
               exchange_dtype: str = "fp32", cache: Optional[HaloCache] = None,
               feature_cache: Optional[FeatureCache] = None,
               overlap: Union[bool, str] = False,
               exchange: Union[str, Exchange] = DEFAULT_EXCHANGE) -> torch.nn.Module:
    r"""Converts every :class:`~torch_geometric.nn.conv.MessagePassing`
    layer of :obj:`model` in place into its partition-parallel version, like
    :meth:`torch.nn.SyncBatchNorm.convert_sync_batchnorm` (parameters,
    constructor arguments, ``state_dict`` keys and ``forward`` signatures
    stay those of PyG), and every norm that averages over nodes into one
    that averages over the nodes of all ranks (:mod:`pyg_dist.nn.norm`).

    Every module is checked first (:mod:`pyg_dist.nn.support`): one that
    would not compute what single-process PyG computes raises
    :class:`NotImplementedError` naming its path and the reason, before
    anything is converted.

    The converted model takes this rank's inner rows and the partition's
    adjacency, ``model(data.x, data.edge_index)`` or
    ``model(data.x, data.adj_t)``, and returns one row per inner node. Each
    layer fetches the halo rows it aggregates over ``torch.distributed``
    (their gradients flow back to the owners) and aggregates with the
    fastest form of the local graph it supports: PyG's fused sparse
    ``message_and_aggregate`` where it exists (e.g. SAGE, GCN, GIN,
    GraphConv), per-edge messages otherwise (e.g. GAT).

    Which halo rows and edges a forward pass uses is the context's current
    :class:`~pyg_dist.comm.HaloPlan` (``model.dist_context.plan``; the exact
    plan unless a :mod:`~pyg_dist.sampler` installs another with
    ``model.dist_context.use(plan)``). Under a sampled plan every layer
    aggregates the sampled graph with the plan's :math:`1/p` weights: in
    the CSR values on the fused path, on the messages otherwise.

    Args:
        model: a PyG model or layer.
        data: this rank's partition.
        group: the process group (default: the default group).
        stats: byte/time counters to update (default: a new
            :class:`~pyg_dist.comm.stats.CommStats`, kept as ``model.comm_stats``).
        precompute_layer0: the first layer aggregates the partition's raw
            features once, on the exact plan, and reuses the result (the
            reference BNS-GCN's ``--use-pp``): that layer then needs no
            communication. Exact (up to rounding) whenever it applies: for
            GCN, GraphSAGE (without ``project``), GIN and GraphConv without
            edge weights, when the first layer is given ``data.x`` itself;
            under sampling, the first layer sees the whole neighbourhood.
        exchange_dtype: how halo rows and their gradients travel: ``"fp32"``
            (as they are), ``"bf16"``, ``"fp16"`` or ``"int8"`` (per-row
            scale; see :mod:`pyg_dist.comm.compress`). Computation stays in
            the model's dtype.
        cache: how fresh the halo rows are (a :class:`~pyg_dist.cache.HaloCache`;
            default exact). Under a stale cache the rows a layer exchanges
            are taken before the model's dropout, which is applied to the
            received rows after the exchange; this covers
            :class:`torch.nn.Dropout` modules whose output a layer receives
            as is (PyG's BasicGNN models), not functional dropout or a
            transform between the dropout and the exchange.
        feature_cache: a :class:`~pyg_dist.cache.FeatureCache` holding
            halo rows of the input features.
        overlap: each layer aggregates its interior targets (no halo
            in-edge) while its halo rows travel and its border targets once
            they arrive (CM-GCN §III-C; exact, see
            :meth:`~pyg_dist.nn.HaloContext.aggregate`). Applies to layers
            on the fused sparse path (e.g. SAGE, GCN, GIN, GraphConv) under
            the exact cache; others exchange first as usual. ``"layers"``
            is the same. ``"nodes"``: CM-GCN's asynchronous computation
            across layers, forward and backward (no barrier between
            layers; exact, see :mod:`pyg_dist.nn.async_layers`): for PyG
            BasicGNN chains of SAGE, GCN, GIN or GraphConv layers under the
            exact cache, other models refused before any work.
        exchange: how halo rows travel: ``"halo"`` (each rank sends its
            peers the rows they need, point to point), ``"broadcast"``
            (CAGNET's 1-D algorithm: every rank's whole block of inner rows
            reaches every other rank, and the gradients return to the owners
            as whole blocks; see :mod:`pyg_dist.comm.broadcast`) or
            ``"sequential"`` (SAR: one peer's rows at a time, aggregated
            into partial aggregates and freed, re-fetched in the backward
            pass; memory per rank falls with the ranks; see
            :mod:`pyg_dist.nn.sequential`). The same result, other bytes
            and memory; ``"broadcast"`` runs on the exact full-graph plan
            only and does not combine with :obj:`overlap`, a feature cache
            or the pipeline cache; ``"sequential"`` runs on full-graph
            plans (a halo sampler's too) under the exact cache, without a
            feature cache or ``overlap="nodes"`` (``overlap=True`` fetches
            the next peer's rows while the current ones aggregate), for
            the layers :data:`~pyg_dist.nn.spec.LAYERS` marks
            ``sequential`` and layers of the user's own with a sum, mean,
            max or min aggregation; others are refused before any work.
            Any :data:`~pyg_dist.comm.EXCHANGES` name, or an
            :class:`~pyg_dist.comm.exchange.Exchange`.
    """
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, MessagePassing)]
    if not layers:
        raise ValueError(f"'{type(model).__name__}' contains no MessagePassing "
                         f"layer to distribute")
    _check_partition(data, group)
    check_model(model, getattr(data, "num_global_nodes", None), data.num_features)
    exchange = get_exchange(exchange)
    if exchange.piecewise:
        sequential.check_model(model, exchange)
    async_layers.check_overlap(overlap)
    if overlap == "nodes":
        async_layers.check_nodes(model, cache, feature_cache, precompute_layer0, exchange)
    gcn_norm.install()
    ctx = HaloContext(data, group, stats, exchange_dtype, cache, feature_cache, overlap,
                      exchange)
    for i, (name, module) in enumerate(layers):
        _convert(module, name or type(module).__name__, ctx)
        ctx.layer_index[module._dist_key] = i
    if precompute_layer0:
        _precompute_first(*layers[0])
    for module in model.modules():
        if type(module) in NORMS:
            module.__class__ = NORMS[type(module)]
        if isinstance(module, tuple(NORMS.values())):
            module._dist_ctx = ctx
    fast_dropout(model)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) and not hasattr(module, "_dist_hook"):
            module._dist_hook = module.register_forward_hook(_remember_undropped)
    if not hasattr(model, "_dist_pass_hooks"):
        model._dist_pass_hooks = (
            model.register_forward_pre_hook(_begin_pass, with_kwargs=True),
            model.register_forward_hook(_end_pass, always_call=True))
    model.comm_stats = ctx.stats
    model.dist_context = ctx
    if overlap == "nodes" and not hasattr(model, "dist_async"):
        async_layers.install(model)
    return model


def _begin_pass(model: torch.nn.Module, args, kwargs) -> None:
    model.dist_context.begin_pass(args[0] if args else kwargs.get("x"))


def _end_pass(model: torch.nn.Module, args, out) -> None:
    model.dist_context.end_pass()


def _precompute_first(name: str, module: MessagePassing) -> None:
    if not module._dist_spec.precomputable or getattr(module, "project", False):
        raise NotImplementedError(
            f"precompute_layer0: the first layer '{name}' ({type(module).__name__}) "
            f"transforms its input with parameters before aggregating; supported: "
            f"{', '.join(sorted(layer_names(precomputable=True)))} (SAGEConv with "
            f"project=False)")
    module._dist_precompute = True
    if not isinstance(module, DistGCNConv):  # GCN handles it in its forward
        module.propagate = _precomputed_propagate.__get__(module)


def _remember_undropped(module: torch.nn.Dropout, inputs, out: Tensor) -> None:
    r"""Tags a dropout's output with its input, so that a stale cache can
    exchange the undropped rows (see :meth:`HaloContext.fetch`)."""
    if module.training and module.p > 0 and out is not inputs[0]:
        out._dist_dropout = (inputs[0], module.p)


def _precomputed_propagate(module: MessagePassing, edge_index, size=None, **kwargs):
    r"""``propagate`` that reuses the aggregation of ``data.x`` (computed on
    the exact plan once) and computes anything else as usual."""
    ctx: HaloContext = module._dist_ctx
    x = kwargs.get("x")
    x_src = x[0] if isinstance(x, (tuple, list)) else x
    propagate = type(module).propagate
    ctx.enter(module._dist_key)
    if not (isinstance(x_src, Tensor) and ctx.is_input_features(x_src)) \
            or any(v is not None for k, v in kwargs.items() if k != "x"):
        return propagate(module, edge_index, size=size, **kwargs)
    return ctx.precompute(module._dist_key,
                          lambda: propagate(module, edge_index, size=size, **kwargs))


#: What a layer without a spec (a user's) is taken to be: it propagates.
_USERS = LayerSpec("a user's layer")


def _check_partition(data: DistData, group) -> None:
    r"""Refuses another rank's partition, or one of another world size:
    its plan would send and receive rows its peers do not expect."""
    if not dist.is_initialized() or "rank" not in data:
        return  # the context's set-up says what is missing
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if (data.rank, data.num_parts) != (rank, world):
        raise ValueError(f"distribute() was given partition {data.rank} of "
                         f"{data.num_parts}, but this is rank {rank} of {world}: load "
                         f"this rank's own (DistData.load(root, dist.get_rank()))")


def _convert(module: MessagePassing, name: str, ctx: HaloContext) -> None:
    if getattr(module, "_dist_ctx", None) is None:  # not converted yet
        cls = type(module)
        module._dist_spec = spec_of(module) or _USERS
        if module._dist_spec.subclass is not None:
            module.__class__ = module._dist_spec.subclass
        elif module.inspector.implements("edge_update"):  # a user's layer
            raise NotImplementedError(
                f"pyg_dist cannot distribute '{name}' ({cls.__name__}): it updates "
                f"edges on the graph it is given before propagating, which would be "
                f"wrong on a partition")
        module._dist_hooks = (module.register_forward_pre_hook(_trim_input).id,
                              module.register_forward_hook(_leave, always_call=True).id)
        if not module._dist_spec.self_exchanging:
            module.register_propagate_forward_pre_hook(_propagate_pre_hook)
            module.register_message_forward_hook(_message_weight_hook)
            if ctx.overlap:
                module.propagate = _overlapped_propagate.__get__(module)
        if ctx.exchange.piecewise and not isinstance(module, DistGCNConv):
            # GCN aggregates through HaloContext.aggregate, which takes this path itself.
            module.propagate = sequential.sequential_propagate.__get__(module)
            if module._dist_spec.self_exchanging:  # GAT, GATv2: their edge updates
                module.edge_updater = sequential.defer_edge_update.__get__(module)
            if "return_attention_weights" in inspect.signature(module.forward).parameters:
                module.register_forward_pre_hook(sequential.refuse_attention_weights,
                                                 with_kwargs=True)
    module._dist_ctx = ctx
    module._dist_key = name
    ctx.layers[name] = module


def _trim_input(module: MessagePassing, args):
    r"""Cuts the node rows a layer is given to its plan's inputs when the
    plan says so (a mini-batch's layers run on shrinking prefixes), and
    gives a layer whose spec is ``edge_index_only`` the partition's
    ``edge_index`` for its ``adj_t``."""
    ctx: HaloContext = module._dist_ctx
    gcn_norm.enter(ctx)  # first: _leave runs even if this hook raises
    ctx.enter(module._dist_key)
    module._dist_calls = 0
    args = list(args)
    if module._dist_spec.edge_index_only and len(args) > 1 and args[1] is ctx.data.adj_t:
        args[1] = ctx.data.edge_index
    x = args[0] if args else None
    if ctx.plan.trim_input and isinstance(x, Tensor) and x.size(0) > ctx.num_inner:
        args[0] = x[:ctx.num_inner]
    module._dist_input = args[0] if args else None
    return tuple(args)


def _leave(module: MessagePassing, args, out) -> None:
    module._dist_input = None
    gcn_norm.leave()


def _check_features_only(module: MessagePassing, arg: str, value: Tensor) -> None:
    r"""Refuses, under a stale cache, a layer that exchanges rows computed
    with its own parameters (e.g. ``SAGEConv(project=True)``, whose
    ``lin(x)`` precedes propagate): the stale rows would carry the
    parameters of the iteration they were computed at, which PipeGCN,
    PSC-GCN and SANCUS never do (only features and feature gradients go
    stale). Checked once per layer and argument, on its first stale pass,
    by walking the autograd graph from the rows back to the layer's
    input."""
    checked = module.__dict__.setdefault("_dist_features_only", set())
    if arg in checked:
        return
    given = module._dist_input
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
                    f"Layer '{module._dist_key}' ({type(module).__name__}) exchanges "
                    f"'{arg}' computed with its own parameters: a stale cache would "
                    f"mix the weights of an earlier iteration into this one (the stale "
                    f"methods keep only features stale). Use the exact cache, or a layer "
                    f"that transforms after aggregating (e.g. SAGEConv without project)")
            todo.extend(f for f, _ in fn.next_functions)
    checked.add(arg)


def _propagate_pre_hook(module: MessagePassing, inputs):
    r"""Extends every source-side node tensor with the plan's halo rows,
    restricts per-edge arguments (``edge_*``) to the plan's edges and swaps
    the partition's adjacency for the form this layer aggregates fastest."""
    if getattr(module, "_dist_prepared", False):  # _overlapped_propagate did it
        return None
    edge_index, size, kwargs = inputs
    ctx: HaloContext = module._dist_ctx
    ctx.enter(module._dist_key)
    sources = source_args(module)
    # A layer that propagates K times exchanges K times, each under its own key.
    call = getattr(module, "_dist_calls", 0)
    module._dist_calls = call + 1
    suffix = f"#{call}" if call else ""
    targets = set(target_args(module))
    for arg in sources:
        value, key = kwargs.get(arg), f"{module._dist_key}.{arg}{suffix}"
        if ctx.active_cache.stale:
            source = value[0] if isinstance(value, (tuple, list)) else value
            if isinstance(source, Tensor):
                _check_features_only(module, arg, source)
        if isinstance(value, Tensor):
            # read at targets too (x_i): the targets keep the inner rows
            kwargs[arg] = ((ctx.extend(key, value), value) if arg in targets
                           else ctx.extend(key, value))
        elif isinstance(value, (tuple, list)) and isinstance(value[0], Tensor):
            kwargs[arg] = (ctx.extend(key, value[0]), value[1])
    edge_index, module._dist_message_weight, kwargs = ctx.propagate_args(
        module, edge_index, kwargs, sources)
    return edge_index, (ctx.num_src, ctx.num_inner), kwargs


def _overlapped_propagate(module: MessagePassing, edge_index, size=None, **kwargs):
    r"""``propagate`` through :meth:`HaloContext.aggregate` (interior
    targets while the halo rows travel) for a layer that aggregates one
    source tensor on the fused path; any other call goes the usual way."""
    ctx: HaloContext = module._dist_ctx
    propagate = type(module).propagate
    sources = source_args(module)
    if not (module.fuse and len(sources) == 1 and ctx.is_local_graph(edge_index)
            and all(v is None for k, v in kwargs.items() if k not in sources)):
        return propagate(module, edge_index, size=size, **kwargs)
    ctx.enter(module._dist_key)
    (arg, ) = sources
    value = kwargs[arg]
    pair = isinstance(value, (tuple, list))
    aggr = module.aggr if isinstance(module.aggr, str) else None

    def run(adj, x_src: Tensor, size):
        module._dist_prepared, module._dist_message_weight = True, None
        try:
            return propagate(module, adj, size=size,
                             **{**kwargs, arg: (x_src, value[1]) if pair else x_src})
        finally:
            module._dist_prepared = False

    return ctx.aggregate(f"{module._dist_key}.{arg}", value[0] if pair else value,
                         ctx.adjacency(edge_index, True, aggr), run)


def _message_weight_hook(module: MessagePassing, inputs, messages: Tensor):
    r"""Multiplies each message of a sampled plan's edge by its weight
    (:meth:`~pyg_dist.comm.HaloPlan.edge_weight`) on the per-edge path."""
    weight = getattr(module, "_dist_message_weight", None)
    if weight is None:
        return None
    if messages.size(0) != weight.numel():
        raise RuntimeError(
            f"Layer '{module._dist_key}' made {messages.size(0)} messages for the "
            f"{weight.numel()} edges of the sampled plan: a layer that adds or "
            f"removes edges inside its forward cannot be sampled with rescaling")
    return messages * weight.to(messages.dtype).view((-1, ) + (1, ) * (messages.dim() - 1))
