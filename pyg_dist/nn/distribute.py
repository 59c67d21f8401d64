"""``distribute()``: turn a plain PyG model into a partition-parallel one.

It checks the model, chooses the model's engine once
(:func:`~pyg_dist.nn.engines.select_engine`), converts the modules in one
place (:func:`~pyg_dist.nn.convert.convert`) and hands every layer to the
engine. The facts about each PyG layer (which get a subclass, which fetch
their halo rows themselves, which precompute) are
:data:`pyg_dist.nn.spec.LAYERS`'.
"""
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch_geometric.nn.conv import MessagePassing

from pyg_dist.cache import FeatureCache, HaloCache
from pyg_dist.comm import DEFAULT_EXCHANGE, Exchange, get_exchange
from pyg_dist.comm.stats import CommStats
from pyg_dist.data import DistData
from pyg_dist.nn import gcn_norm
from pyg_dist.nn.compat import refusals
from pyg_dist.nn.context import HaloContext
from pyg_dist.nn.convert import convert
from pyg_dist.nn.dropout import Dropout
from pyg_dist.nn.engine import DistributedLayer, Engine, distributed_class
from pyg_dist.nn.engines import select_engine
from pyg_dist.nn.norm import NORMS
from pyg_dist.nn.spec import LayerSpec, is_layer, layer_names, spec_of
from pyg_dist.nn.support import check_model


def distribute(model: torch.nn.Module, data: DistData, group=None,
               stats: Optional[CommStats] = None, precompute_layer0: bool = False,
               exchange_dtype: str = "fp32", cache: Optional[HaloCache] = None,
               feature_cache: Optional[FeatureCache] = None,
               overlap: Union[bool, str] = False,
               exchange: Union[str, Exchange] = DEFAULT_EXCHANGE,
               memory_budget: Optional[int] = None) -> torch.nn.Module:
    r"""Converts every :class:`~torch_geometric.nn.conv.MessagePassing`
    layer of :obj:`model` in place into its partition-parallel version, like
    :meth:`torch.nn.SyncBatchNorm.convert_sync_batchnorm` (parameters,
    constructor arguments, ``state_dict`` keys and ``forward`` signatures
    stay those of PyG), and every norm that averages over nodes into one
    that averages over the nodes of all ranks (:mod:`pyg_dist.nn.norm`).

    Every module is checked first (:mod:`pyg_dist.nn.support`): one that
    would not compute what single-process PyG computes raises
    :class:`NotImplementedError` naming its path and the reason, before
    anything is converted; settings that do not compose raise
    :class:`ValueError` (:func:`pyg_dist.nn.compat.refusals`).

    The model runs on one engine, chosen here from :obj:`exchange` and
    :obj:`overlap` (:mod:`pyg_dist.nn.engines`; ``model.dist_engine``):
    every layer's propagate is the engine's. The modules are converted in
    one place (:func:`pyg_dist.nn.convert.convert`): each keeps its object,
    parameters and hooks. Distributing a model again replaces its engine.

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
            :class:`~pyg_dist.nn.engine.OverlapEngine`). Applies to layers
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
        memory_budget: with ``exchange="sequential"``, the bytes of halo
            rows the layers may receive all at once: a layer whose halo rows
            fit in what is left of it does (faster, SAR's one-shot), the
            others one peer's rows at a time (see
            :meth:`~pyg_dist.nn.sequential.SequentialEngine.materialises`;
            ``model.dist_engine.choices()`` says which did). ``None``: every
            layer sequential.
    """
    # keyed by their paths (a lone layer by its class): its exchanges are counted so
    layers = [(name or type(m).__name__, m) for name, m in model.named_modules() if is_layer(m)]
    if not layers:
        raise ValueError(f"'{type(model).__name__}' contains no MessagePassing "
                         f"layer to distribute")
    _check_partition(data, group)
    check_model(model, getattr(data, "num_global_nodes", None), data.num_features)
    exchange = get_exchange(exchange)
    engine_class = select_engine(exchange, overlap)
    engine_class.check(model, exchange)
    refused = refusals(exchange=type(exchange), engine=engine_class,
                       cache=None if cache is None else type(cache),
                       feature_cache=True if feature_cache is not None else None,
                       precompute=precompute_layer0, overlap=overlap,
                       memory_budget=memory_budget, names={"exchange": exchange.name})
    if refused:
        raise ValueError(refused[0])
    for name, module in layers:
        _check_edge_updates(name, module)
    if precompute_layer0:
        _check_precompute(*layers[0])
    gcn_norm.install()
    ctx = HaloContext(data, group, stats, exchange_dtype, cache, feature_cache, overlap,
                      exchange)
    ctx.num_layers = len(layers)
    previous = model.__dict__.get("dist_engine")
    if previous is not None:  # distributed again: the new engine replaces its hooks
        previous.detach()
    engine = engine_class(ctx, model, memory_budget)
    convert(model, lambda module: _distributed_class(module, engine))
    for name, module in layers:
        engine.attach(module, name, spec_of(module) or _USERS)
    if precompute_layer0:
        engine.layers[0].precompute = True
    for module in model.modules():
        if isinstance(module, tuple(NORMS.values())):
            module.process_group = group  # statistics over the ranks of this group
    engine.install(model)
    model.comm_stats = ctx.stats
    model.dist_context = ctx
    model.dist_engine = engine
    return model


#: What a layer without a spec (a user's) is taken to be: it propagates.
_USERS = LayerSpec("a user's layer")


def _distributed_class(module: torch.nn.Module, engine: Engine) -> Optional[type]:
    r"""The class :obj:`module` takes under :obj:`engine` (``None``: its own):
    a layer its :func:`~pyg_dist.nn.engine.distributed_class`, a norm over
    nodes its whole-graph one, a dropout the fast CPU one, and the model
    whatever the engine runs it as (the per-node schedule's BasicGNN)."""
    if is_layer(module):
        spec = spec_of(module)
        base = spec.subclass if spec is not None and spec.subclass is not None \
            and not isinstance(module, spec.subclass) else type(module)
        return distributed_class(base)
    if type(module) in NORMS:
        return NORMS[type(module)]
    if type(module) is torch.nn.Dropout:
        return Dropout
    return engine.model_class(module)


def _check_edge_updates(name: str, module: MessagePassing) -> None:
    spec = spec_of(module)
    if (spec is None or spec.subclass is None) and not isinstance(module, DistributedLayer) \
            and module.inspector.implements("edge_update"):  # a user's layer
        raise NotImplementedError(
            f"pyg_dist cannot distribute '{name}' ({type(module).__name__}): it updates "
            f"edges on the graph it is given before propagating, which would be "
            f"wrong on a partition")


def _check_precompute(name: str, module: MessagePassing) -> None:
    spec = spec_of(module)
    if spec is None or not spec.precomputable or getattr(module, "project", False):
        raise NotImplementedError(
            f"precompute_layer0: the first layer '{name}' ({type(module).__name__}) "
            f"transforms its input with parameters before aggregating; supported: "
            f"{', '.join(sorted(layer_names(precomputable=True)))} (SAGEConv with "
            f"project=False)")
    if spec.normalisation == "gcn" and module.aggr not in ("add", "sum", "mean"):
        raise NotImplementedError(
            f"precompute_layer0: the first layer '{name}' ({type(module).__name__}) "
            f"aggregates with aggr={module.aggr!r}; its precomputation aggregates the "
            f"features before its weight multiplies them, which equals the layer only "
            f"for a sum or mean (aggr='add' or 'mean')")


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
