r"""``LayerSpec``: what pyg_dist knows about each PyG class, in one table.

Every engine reads :data:`LAYERS`: :func:`~pyg_dist.nn.distribute` (which
classes are exact, which get a subclass, which precompute), the sequential
exchange (which layers it verified and the parameters their messages
read), the per-node schedule (which layers it runs), the samplers (the
weight a layer applies to the rows it aggregates) and the table of
supported layers in ``docs/layers.md`` (:func:`~pyg_dist.nn.support.markdown_table`).

A class is looked up by the PyG class itself (:func:`spec_of`); pyg_dist's
subclasses (``DistGCNConv``...) by the PyG class they extend. A user's
subclass of a PyG layer has no spec: it is the user's to vouch for, and
only the facts that hold for any layer apply to it.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Set, Tuple

from pyg_dist.nn.conv import (DistChebConv, DistGATConv, DistGATv2Conv, DistGCNConv,
                              DistGraphConv, DistSAGEConv)

#: Roles: ``"propagates"`` (exact: each propagate call fetches the halo
#: rows of its source-side inputs), ``"gcn_norm"`` (exact: calls PyG's
#: ``gcn_norm``, made the whole graph's by :mod:`pyg_dist.nn.gcn_norm`),
#: ``"row_wise"`` (per node, per target or a container), ``"refused"``.
ROLES = ("propagates", "gcn_norm", "row_wise", "refused")


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
    #: Its subclass fetches the halo rows itself (no propagate hook).
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
    #: Its rows can be computed for any subset of targets: its forward
    #: takes ``(x_src, x_dst)`` and a CSR ``adj_t`` of those targets.
    bipartite: bool = False
    #: The linear layer it applies to the rows it aggregates, when the rows
    #: it exchanges are not yet multiplied by it (samplers estimating the
    #: aggregated terms read its weight).
    neighbour_weight: Optional[str] = None
    #: The plain PyG model built of it takes a ``torch.sparse`` ``adj_t``
    #: (GATConv adds its self-loops to an ``edge_index`` only).
    takes_adj_t: bool = True

    def __post_init__(self) -> None:
        if self.role not in ROLES or (self.role == "refused") != (self.refusal is not None):
            raise ValueError(f"LayerSpec {self.name}: role {self.role!r} with refusal "
                             f"{self.refusal!r}")


def _refused(why: str, *names: str) -> Tuple[LayerSpec, ...]:
    return tuple(LayerSpec(name, "refused", why) for name in names)


def _all(role: str, *names: str) -> Tuple[LayerSpec, ...]:
    return tuple(LayerSpec(name, role) for name in names)


_ORDER = "depends on the order and padding of neighbourhoods"
_READOUT = "a graph-level readout over this rank's nodes only"

#: Every PyG class pyg_dist knows, by name; any other is refused.
LAYERS: Dict[str, LayerSpec] = {spec.name: spec for spec in (
    LayerSpec("GCNConv", subclass=DistGCNConv, self_exchanging=True, precomputable=True,
              sequential=True, node_schedule=True, neighbour_weight="lin"),
    LayerSpec("SAGEConv", subclass=DistSAGEConv, precomputable=True, sequential=True, node_schedule=True,
              bipartite=True, neighbour_weight="lin_l"),
    LayerSpec("GINConv", precomputable=True, sequential=True, node_schedule=True,
              bipartite=True),
    LayerSpec("GraphConv", subclass=DistGraphConv, precomputable=True, sequential=True, node_schedule=True,
              bipartite=True, neighbour_weight="lin_rel"),
    LayerSpec("GINEConv", sequential=True, message_params=("lin", )),
    LayerSpec("GATConv", subclass=DistGATConv, self_exchanging=True, sequential=True,
              message_params=("lin_edge", "att_edge"), takes_adj_t=False),
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
