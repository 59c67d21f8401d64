from typing import Optional

from torch import Tensor
from torch_geometric.nn import GCNConv
from torch_geometric.typing import Adj
from torch_geometric.utils import is_torch_sparse_tensor


class DistGCNConv(GCNConv):
    r"""Distributed :class:`torch_geometric.nn.GCNConv`.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{\Theta}^{\top} \sum_{j \in
        \mathcal{N}(i) \cup \{ i \}} \frac{e_{j,i}}{\sqrt{\hat{d}_j
        \hat{d}_i}} \mathbf{x}_j

    with :math:`\hat{d}` the degrees of the *whole* graph, so the result
    equals single-graph PyG. The linear transform runs before the exchange
    (as in PyG), so only :math:`\mathbf{\Theta}^{\top}\mathbf{x}_j` of halo
    nodes travels, computed once by their owners. Under a sampled plan the
    surviving edge weights are multiplied by their :math:`1/p` and the
    normalisation stays the whole graph's.

    With ``precompute_layer0`` (see :func:`~pyg_dist.nn.distribute`) and
    the partition's own features as input, the layer uses
    :math:`(\hat A X)\Theta` with :math:`\hat A X` aggregated once on the
    exact plan: no exchange at all, equal to the exact layer up to
    floating-point rounding. When the halo rows must travel untransformed
    (a feature cache holds the input features, or a stale cache exchanges
    rows before dropout), it computes :math:`(\hat A X)\Theta` as well.
    """

    def forward(self, x: Tensor, edge_index: Adj,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        ctx = self._dist_ctx
        ctx.enter(self._dist_key)
        if getattr(self, "_dist_precompute", False) and x is ctx.data.x \
                and edge_weight is None:
            out = self.lin(ctx.precompute(self._dist_key, x,
                                          lambda: self._aggregate(x, edge_index, None)))
        elif ctx.exchanges_raw(x):  # Â(XΘ) = (ÂX)Θ: exchange X, as the cache needs it
            out = self.lin(self._aggregate(x, edge_index, edge_weight))
        else:
            out = self._aggregate(self.lin(x), edge_index, edge_weight)
        if self.bias is not None:
            out = out + self.bias
        return out

    def _aggregate(self, x: Tensor, edge_index: Adj,
                   edge_weight: Optional[Tensor]) -> Tensor:
        ctx = self._dist_ctx
        if self.normalize:
            # As PyG: on an edge_index without weights the self-loops get
            # weight 1 whatever `improved` says; sparse inputs apply it.
            improved = self.improved and (edge_weight is not None
                                          or not isinstance(edge_index, Tensor)
                                          or is_torch_sparse_tensor(edge_index))
            edge_index, edge_weight = ctx.gcn_norm(edge_index, edge_weight, improved,
                                                   self.add_self_loops, x.dtype)
        else:
            edge_index, edge_weight = ctx.weighted_adjacency(edge_index, edge_weight,
                                                             self.aggr)
        return ctx.aggregate(self._dist_key, x, edge_index, lambda adj, x_src, size:
                             self.propagate(adj, x=x_src, edge_weight=edge_weight,
                                            size=size))
