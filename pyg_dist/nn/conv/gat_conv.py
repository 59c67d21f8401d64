from typing import Optional

from torch import Tensor
from torch_geometric.nn import GATConv, GATv2Conv
from torch_geometric.typing import Adj


def _attend(layer, x: Tensor, edge_index: Adj, edge_attr: Optional[Tensor],
            return_attention_weights):
    r"""Runs the PyG attention layer bipartitely on ``(x_inner | x_halo,
    x_inner)`` over the plan's ``edge_index``."""
    ctx = layer._dist_ctx
    ctx.enter(layer._dist_key)
    local = ctx.is_local_graph(edge_index)
    if edge_attr is not None and local:
        edge_attr = ctx.plan.edges(edge_attr)
    edge_index = ctx.adjacency(edge_index, fused=False)
    if ctx.exchange.piecewise:
        # Each rank transforms its own rows; every piece's sources travel
        # transformed and its edges are scored by the deferred edge update.
        if not local:  # (attention weights are refused by a pre-hook)
            raise NotImplementedError(
                f"Layer '{layer._dist_key}': exchange='sequential' attends over the "
                f"partition's own graph")
        layer._dist_plan_graph = True
        try:
            return super(type(layer), layer).forward(x, edge_index, edge_attr)
        finally:
            layer._dist_plan_graph = False
    x_src = ctx.extend(layer._dist_key, x)
    return super(type(layer), layer).forward(
        (x_src, x), edge_index, edge_attr, return_attention_weights=return_attention_weights)


class DistGATConv(GATConv):
    r"""Distributed :class:`torch_geometric.nn.GATConv`.

    Attention needs per-edge logits, so this layer takes the gather/scatter
    path on the plan's ``edge_index`` (whatever adjacency form it is
    given). The halo rows of :math:`\mathbf{x}` are fetched before the layer
    runs bipartitely on ``(x_inner | x_halo, x_inner)``; the self-loops GAT
    adds for the first :math:`\min(N_{src}, N_{dst})` nodes are exactly the
    inner nodes, since they come first in local ids.

    Under a sampled plan the dropped edges are simply absent and the kept
    ones are *not* rescaled: the softmax renormalises the attention over the
    surviving neighbours, which is GAT's own estimate of the neighbourhood.

    Under ``exchange="sequential"`` the owners transform their rows
    (:math:`\mathbf{W}\mathbf{x}_j` and its attention term travel) and the
    softmax is folded over the peers' pieces
    (:mod:`pyg_dist.comm.sequential`).
    """

    def forward(self, x: Tensor, edge_index: Adj, edge_attr: Optional[Tensor] = None,
                size=None, return_attention_weights=None):
        return _attend(self, x, edge_index, edge_attr, return_attention_weights)


class DistGATv2Conv(GATv2Conv):
    r"""Distributed :class:`torch_geometric.nn.GATv2Conv`, as
    :class:`DistGATConv`: its edge updater computes the attention logits
    :math:`\mathbf{a}^{\top}\mathrm{LeakyReLU}(\mathbf{W}_s \mathbf{x}_j +
    \mathbf{W}_t \mathbf{x}_i)` on the plan's edges, with the halo rows of
    :math:`\mathbf{x}` as sources (each rank transforms the halo rows it
    receives)."""

    def forward(self, x: Tensor, edge_index: Adj, edge_attr: Optional[Tensor] = None,
                return_attention_weights=None):
        return _attend(self, x, edge_index, edge_attr, return_attention_weights)
