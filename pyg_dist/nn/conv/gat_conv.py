from typing import Optional

from torch import Tensor
from torch_geometric.nn import GATConv
from torch_geometric.typing import Adj


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
    """

    def forward(self, x: Tensor, edge_index: Adj, edge_attr: Optional[Tensor] = None,
                size=None, return_attention_weights=None):
        ctx = self._dist_ctx
        ctx.enter(self._dist_key)
        x_src = ctx.extend(self._dist_key, x)
        if edge_attr is not None and ctx.is_local_graph(edge_index):
            edge_attr = ctx.plan.edges(edge_attr)
        edge_index = ctx.adjacency(edge_index, fused=False)
        return super().forward((x_src, x), edge_index, edge_attr,
                               return_attention_weights=return_attention_weights)
