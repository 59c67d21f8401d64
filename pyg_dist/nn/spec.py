r"""``LayerSpec``: what pyg_dist knows about each PyG class, in one table.

Every engine reads :data:`LAYERS` and never tests a layer's class:
:func:`~pyg_dist.nn.distribute` (which classes are exact, which get a
subclass, which precompute), the engines (which normalisation a layer's
graph takes, which layers the sequential engine verified and the
parameters their messages read, which the per-node schedule runs, which
transform before they aggregate), per-layer trimming of mini-batches
(:mod:`pyg_dist.nn.trim`), the neighbour loader's first-layer projection,
the samplers (the weight a layer applies to the rows it aggregates) and the
table of supported layers in ``docs/layers.md``
(:func:`~pyg_dist.nn.support.markdown_table`).

A class is looked up by the PyG class itself (:func:`spec_of`); pyg_dist's
subclasses (``DistGCNConv``...) by the PyG class they extend. A user's
subclass of a PyG layer has no spec: it is the user's to vouch for, and
only the facts that hold for any layer apply to it.
"""
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Set, Tuple

import torch
from torch_geometric.nn.conv import MessagePassing

from pyg_dist.nn.conv.sage_conv import LINEAR_AGGREGATIONS
from pyg_dist.nn.conv import (DistChebConv, DistGATConv, DistGATv2Conv, DistGCNConv,
                              DistGraphConv, DistSAGEConv)

#: Roles: ``"propagates"`` (exact: each propagate call fetches the halo
#: rows of its source-side inputs), ``"gcn_norm"`` (exact: calls PyG's
#: ``gcn_norm``, made the whole graph's by :mod:`pyg_dist.nn.gcn_norm`),
#: ``"row_wise"`` (per node, per target or a container), ``"refused"``.
ROLES = ("propagates", "gcn_norm", "row_wise", "refused")
#: How a layer runs on a trimmed mini-batch layer (:mod:`pyg_dist.nn.trim`):
#: on ``(x, x[:n_dst])`` and the block's rows (``"bipartite"``), on the
#: block's first edges (``"edges"``), or on the rows of the batch's
#: normalised graph (``"normalised"``).
TRIMS = ("bipartite", "edges", "normalised")
#: Norms that act row by row (statistics over a layer's rows would change
#: with the rows computed): accepted between layers trimmed per layer or
#: scheduled per node.
ROW_WISE_NORMS = (torch.nn.Identity, torch.nn.LayerNorm, torch.nn.RMSNorm)


@dataclass(frozen=True)
class LayerSpec:
    r"""One PyG class under :func:`~pyg_dist.nn.distribute`."""
    name: str
    role: str = "propagates"
    #: Why distribute() refuses it (role ``"refused"``).
    refusal: Optional[str] = None
    #: The subclass it becomes: its forward does node-count dependent work
    #: before propagate, or projects before it aggregates.
    subclass: Optional[type] = None
    #: Its subclass fetches the halo rows in its forward
    #: (:meth:`~pyg_dist.nn.engine.Engine.attention_inputs`), not in propagate.
    self_exchanging: bool = False
    #: Its forward normalises a sparse adjacency it takes to be square (the
    #: partition's ``adj_t`` is ``[inner, inner + halo]``): given the
    #: ``edge_index`` instead.
    edge_index_only: bool = False
    #: Its propagate aggregates the raw input with no parameter involved
    #: (GCN through :math:`(\hat A X)\Theta = \hat A(X\Theta)`): the first
    #: layer's aggregation can be precomputed.
    precomputable: bool = False
    #: Verified exact under the sequential exchange (``tests/comm/test_sequential.py``).
    sequential: bool = False
    #: The submodules its messages or edge updates use (recomputed per piece
    #: by the sequential exchange, so differentiated there).
    message_params: Tuple[str, ...] = ()
    #: Scheduled per node across layers (``overlap="nodes"``).
    node_schedule: bool = False
    #: The linear layer it applies to the rows it aggregates, when the rows
    #: it exchanges are not yet multiplied by it (samplers estimating the
    #: aggregated terms read its weight).
    neighbour_weight: Optional[str] = None
    #: The linear layer it applies to its target's own row (root weight).
    root_weight: Optional[str] = None
    #: PyG's order multiplies the rows by :attr:`neighbour_weight` before it
    #: aggregates them (GCN's :math:`\hat A (X \Theta)`), so those are the
    #: rows exchanged; else it aggregates its input.
    transform_first: bool = False
    #: ``"gcn"``: its propagate aggregates over its graph normalised with
    #: GCN's symmetric degrees (the whole graph's, distributed).
    normalisation: Optional[str] = None
    #: How it runs trimmed per layer (one of :data:`TRIMS`; ``None``: not).
    trim: Optional[str] = None
    #: The plain PyG model built of it takes a ``torch.sparse`` ``adj_t``
    #: (GATConv adds its self-loops to an ``edge_index`` only).
    takes_adj_t: bool = True

    def __post_init__(self) -> None:
        if self.role not in ROLES or (self.role == "refused") != (self.refusal is not None) \
                or self.trim not in TRIMS + (None, ):
            raise ValueError(f"LayerSpec {self.name}: role {self.role!r} with refusal "
                             f"{self.refusal!r}, trim {self.trim!r}")


def _refused(why: str, *names: str) -> Tuple[LayerSpec, ...]:
    return tuple(LayerSpec(name, "refused", why) for name in names)


def _all(role: str, *names: str) -> Tuple[LayerSpec, ...]:
    return tuple(LayerSpec(name, role) for name in names)


_ORDER = "depends on the order and padding of neighbourhoods"
_READOUT = "a graph-level readout over this rank's nodes only"

#: Every PyG class pyg_dist knows, by name; any other is refused.
LAYERS: Dict[str, LayerSpec] = {spec.name: spec for spec in (
    LayerSpec("GCNConv", subclass=DistGCNConv, precomputable=True, sequential=True,
              node_schedule=True, neighbour_weight="lin", transform_first=True,
              normalisation="gcn", trim="normalised"),
    LayerSpec("SAGEConv", subclass=DistSAGEConv, precomputable=True, sequential=True,
              node_schedule=True, neighbour_weight="lin_l",
              root_weight="lin_r", trim="bipartite"),
    LayerSpec("GINConv", precomputable=True, sequential=True, node_schedule=True,
              trim="bipartite"),
    LayerSpec("GraphConv", subclass=DistGraphConv, precomputable=True, sequential=True,
              node_schedule=True, neighbour_weight="lin_rel",
              root_weight="lin_root", trim="bipartite"),
    LayerSpec("GINEConv", sequential=True, message_params=("lin", )),
    LayerSpec("GATConv", subclass=DistGATConv, self_exchanging=True, sequential=True,
              message_params=("lin_edge", "att_edge"), takes_adj_t=False, trim="edges"),
    LayerSpec("GATv2Conv", subclass=DistGATv2Conv, self_exchanging=True, sequential=True,
              message_params=("att", "lin_edge")),
    LayerSpec("TransformerConv", sequential=True, message_params=("lin_edge", )),
    LayerSpec("ChebConv", subclass=DistChebConv),
    # normalises by in-degrees of its targets (inner nodes: all their edges are local)
    LayerSpec("ClusterGCNConv", edge_index_only=True),
    *_all("propagates", "GatedGraphConv", "ResGatedGraphConv", "NNConv", "CGConv",
          "EdgeConv", "FeaStConv", "LEConv", "GENConv", "FiLMConv", "GeneralConv",
          "AntiSymmetricConv", "SimpleConv", "PointTransformerConv",
          # read target rows (x_i): given (halo-extended, inner) pairs
          "AGNNConv", "PNAConv", "MFConv", "WLConvContinuous"),
    *_all("gcn_norm", "SGConv", "SSGConv", "APPNP", "TAGConv", "GCN2Conv", "MixHopConv",
          "LGConv", "FAConv", "EGConv", "PDNConv"),
    *_all("row_wise", "Linear", "MLP", "JumpingKnowledge", "Sequential", "Reshape",
          "DiffGroupNorm", "TrimToLayer", "FusedAggregation", "MessageNorm", "GCN",
          "GraphSAGE", "GIN", "GAT", "PNA", "EdgeCNN", "MultiAggregation", "SumAggregation",
          "MeanAggregation", "MaxAggregation", "MinAggregation", "MulAggregation",
          "VarAggregation", "StdAggregation", "SoftmaxAggregation", "PowerMeanAggregation",
          "MedianAggregation", "QuantileAggregation", "VariancePreservingAggregation",
          "DegreeScalerAggregation"),
    *_refused("propagates node features of shape [K, N, C] (nodes not in the first "
              "dimension)", "ARMAConv"),
    *_refused("samples positive and negative edges of the graph it is given (the "
              "partition's) for its attention loss", "SuperGATConv"),
    *_refused("propagates over the reversed graph, whose edges cross the partition the "
              "other way", "DirGNNConv"),
    *_refused("its global attention would attend over this rank's nodes only", "GPSConv"),
    *_refused("takes every layer's history (x of shape [N, L, C])", "DNAConv"),
    *_refused("pads and orders each neighbourhood as PyG does on the whole graph (the "
              "largest in-degree differs per partition)", "LSTMAggregation"),
    *_refused(_ORDER, "GRUAggregation", "SetTransformerAggregation", "MLPAggregation",
              "PatchTransformerAggregation"),
    *_refused(_READOUT, "SortAggregation", "GraphMultisetTransformer", "Set2Set",
              "AttentionalAggregation", "EquilibriumAggregation"),
    *_refused("a set readout whose padding depends on the largest degree",
              "DeepSetsAggregation"),
    *_refused("heterogeneous norms are not supported", "HeteroBatchNorm", "HeteroLayerNorm"),
)}


def pyg_class(cls: type) -> Optional[type]:
    r"""The PyG class :obj:`cls` is (pyg_dist's subclasses: the PyG class
    they extend); ``None`` for any other class."""
    if cls.__module__.startswith("pyg_dist."):
        cls = next((c for c in cls.__mro__ if c.__module__.startswith("torch_geometric.")),
                   cls)
    return cls if cls.__module__.startswith("torch_geometric.") else None


def spec_of(module) -> Optional[LayerSpec]:
    r"""The :class:`LayerSpec` of :obj:`module` (a module or a class);
    ``None`` for a class that is not PyG's or not in :data:`LAYERS`."""
    cls = pyg_class(module if isinstance(module, type) else type(module))
    return None if cls is None else LAYERS.get(cls.__name__)


def layer_names(**facts) -> Set[str]:
    r"""The names of the classes whose spec has every field of :obj:`facts`
    (e.g. ``layer_names(sequential=True)``)."""
    return {name for name, spec in LAYERS.items()
            if all(getattr(spec, field) == value for field, value in facts.items())}


def is_layer(module) -> bool:
    r"""Whether :obj:`module` is a PyG message-passing layer (of any class)."""
    return isinstance(module, MessagePassing)


class LinearParts(NamedTuple):
    r"""A layer computing :math:`W_{root} x_i + \mathrm{aggr}_j(W x_j) + b`."""
    aggregated: torch.nn.Linear  # W, its bias added after the aggregation
    root: Optional[torch.nn.Linear]  # W_root, or None
    normalize: bool  # the output rows are L2-normalised


def linear_parts(layer) -> Optional[LinearParts]:
    r"""The linear maps of :obj:`layer` when it may project its source rows
    before aggregating them (its spec has a :attr:`~LayerSpec.root_weight`,
    its aggregation is linear, SAGE's ``project`` is off and the layer was
    not told to keep PyG's order); ``None`` otherwise."""
    spec = spec_of(layer)
    if spec is None or spec.root_weight is None or not getattr(layer, "project_first", True) \
            or getattr(layer, "project", False) or not isinstance(layer.aggr, str) \
            or layer.aggr not in LINEAR_AGGREGATIONS:
        return None
    root = getattr(layer, spec.root_weight) if getattr(layer, "root_weight", True) else None
    return LinearParts(getattr(layer, spec.neighbour_weight), root,
                       bool(getattr(layer, "normalize", False)))
