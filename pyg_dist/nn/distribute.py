"""``distribute()``: turn a plain PyG model into a partition-parallel one."""
from typing import Optional, Set

import torch
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv
from torch_geometric.nn.conv import MessagePassing

from pyg_dist.data import DistData
from pyg_dist.metrics import CommStats
from pyg_dist.nn.context import DistContext
from pyg_dist.nn.conv import DistGATConv, DistGCNConv

# Layers whose forward does node-count dependent work before propagate get a
# subclass; the others are distributed by a propagate pre-hook.
SUBCLASSES = {GCNConv: DistGCNConv, GATConv: DistGATConv}

# Layers that normalise by degrees or node counts of the graph they are given
# (local degrees would be wrong) or iterate propagation internally.
UNSUPPORTED = {
    "APPNP", "ARMAConv", "ChebConv", "ClusterGCNConv", "DNAConv", "EGConv",
    "FAConv", "GCN2Conv", "LGConv", "MFConv", "MixHopConv", "PDNConv",
    "SGConv", "SSGConv", "TAGConv", "WLConv",
}


def distribute(model: torch.nn.Module, data: DistData, group=None,
               stats: Optional[CommStats] = None) -> torch.nn.Module:
    r"""Converts every :class:`~torch_geometric.nn.conv.MessagePassing`
    layer of :obj:`model` in place into its partition-parallel version, like
    :meth:`torch.nn.SyncBatchNorm.convert_sync_batchnorm` (parameters,
    constructor arguments, ``state_dict`` keys and ``forward`` signatures
    stay those of PyG).

    The converted model takes this rank's inner rows and the partition's
    adjacency, ``model(data.x, data.edge_index)`` or
    ``model(data.x, data.adj_t)``, and returns one row per inner node. Each
    layer fetches the halo rows it aggregates over ``torch.distributed``
    (their gradients flow back to the owners) and aggregates with the
    fastest form of the local graph it supports: PyG's fused sparse
    ``message_and_aggregate`` where it exists (e.g. SAGE, GCN, GIN,
    GraphConv), per-edge messages otherwise (e.g. GAT).

    Args:
        model: a PyG model or layer.
        data: this rank's partition.
        group: the process group (default: the default group).
        stats: byte/time counters to update (default: a new
            :class:`~pyg_dist.metrics.CommStats`, kept as ``model.comm_stats``).
    """
    ctx = DistContext(data, group, stats)
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, MessagePassing)]
    if not layers:
        raise ValueError(f"'{type(model).__name__}' contains no MessagePassing "
                         f"layer to distribute")
    for name, module in layers:
        _convert(module, name or type(module).__name__, ctx)
    model.comm_stats = ctx.stats
    return model


def _convert(module: MessagePassing, name: str, ctx: DistContext) -> None:
    if getattr(module, "_dist_ctx", None) is None:  # not converted yet
        cls = type(module)
        if cls in SUBCLASSES:
            module.__class__ = SUBCLASSES[cls]
        elif cls.__name__ in UNSUPPORTED or module.inspector.implements("edge_update"):
            raise NotImplementedError(
                f"pyg_dist cannot distribute '{name}' ({cls.__name__}): its "
                f"forward computes degree- or node-count-dependent values (or "
                f"edge updates) on the graph it is given before propagating, "
                f"which would be wrong on a partition. Supported: GCNConv, "
                f"SAGEConv, GATConv, GINConv, GraphConv and layers that only "
                f"propagate node features")
        elif not isinstance(module, (DistGCNConv, DistGATConv)):
            module.register_propagate_forward_pre_hook(_propagate_pre_hook)
    module._dist_ctx = ctx
    module._dist_key = name


def _source_args(module: MessagePassing) -> Set[str]:
    r"""Arguments of propagate that messages read at the source (``*_j``)."""
    return {arg[:-2] for arg in module._user_args if arg.endswith("_j")}


def _propagate_pre_hook(module: MessagePassing, inputs):
    r"""Extends every source-side node tensor with its halo rows and swaps
    the partition's adjacency for the form this layer aggregates fastest."""
    edge_index, size, kwargs = inputs
    ctx: DistContext = module._dist_ctx
    sources = _source_args(module)
    for arg in sources:
        value, key = kwargs.get(arg), f"{module._dist_key}.{arg}"
        if isinstance(value, Tensor):
            kwargs[arg] = ctx.extend(key, value)
        elif isinstance(value, (tuple, list)) and isinstance(value[0], Tensor):
            kwargs[arg] = (ctx.extend(key, value[0]), value[1])
    # The fused path cannot carry extra per-edge arguments (e.g. edge_weight).
    edge_args_unused = all(kwargs.get(a) is None for a in kwargs if a not in sources)
    edge_index = ctx.adjacency(edge_index, fused=module.fuse and edge_args_unused)
    return edge_index, (ctx.num_src, ctx.num_inner), kwargs
