from typing import Optional

from torch import Tensor
from torch_geometric.nn import GCNConv
from torch_geometric.typing import Adj


class DistGCNConv(GCNConv):
    r"""Distributed :class:`torch_geometric.nn.GCNConv`.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{\Theta}^{\top} \sum_{j \in
        \mathcal{N}(i) \cup \{ i \}} \frac{e_{j,i}}{\sqrt{\hat{d}_j
        \hat{d}_i}} \mathbf{x}_j

    with :math:`\hat{d}` the degrees of the *whole* graph, so the result
    equals single-graph PyG. The linear transform runs before the exchange
    (as in PyG), so only :math:`\mathbf{\Theta}^{\top}\mathbf{x}_j` of halo
    nodes travels, computed once by their owners.
    """

    def forward(self, x: Tensor, edge_index: Adj,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        ctx = self._dist_ctx
        if self.normalize:
            edge_index, edge_weight = ctx.gcn_norm(edge_index, edge_weight,
                                                   self.improved,
                                                   self.add_self_loops, x.dtype)
        else:
            edge_index = ctx.adjacency(edge_index, fused=edge_weight is None)
        x = ctx.extend(self._dist_key, self.lin(x))
        out = self.propagate(edge_index, x=x, edge_weight=edge_weight,
                             size=(ctx.num_src, ctx.num_inner))
        if self.bias is not None:
            out = out + self.bias
        return out
