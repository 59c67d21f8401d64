from typing import Optional

from torch import Tensor
from torch_geometric.nn import GATConv, GATv2Conv
from torch_geometric.typing import Adj

from pyg_dist.nn.state import engine_of


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
        x, edge_index, edge_attr = engine_of(self).attention_inputs(self, x, edge_index,
                                                                    edge_attr)
        return super().forward(x, edge_index, edge_attr,
                               return_attention_weights=return_attention_weights)


class DistGATv2Conv(GATv2Conv):
    r"""Distributed :class:`torch_geometric.nn.GATv2Conv`, as
    :class:`DistGATConv`: its edge updater computes the attention logits
    :math:`\mathbf{a}^{\top}\mathrm{LeakyReLU}(\mathbf{W}_s \mathbf{x}_j +
    \mathbf{W}_t \mathbf{x}_i)` on the plan's edges, with the halo rows of
    :math:`\mathbf{x}` as sources (each rank transforms the halo rows it
    receives)."""

    def forward(self, x: Tensor, edge_index: Adj, edge_attr: Optional[Tensor] = None,
                return_attention_weights=None):
        x, edge_index, edge_attr = engine_of(self).attention_inputs(self, x, edge_index,
                                                                    edge_attr)
        return super().forward(x, edge_index, edge_attr,
                               return_attention_weights=return_attention_weights)
