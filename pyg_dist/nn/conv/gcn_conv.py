from typing import NamedTuple, Optional

import torch
from torch import Tensor
from torch_geometric.nn import GCNConv
from torch_geometric.typing import Adj
from torch_geometric.utils import is_torch_sparse_tensor

from pyg_dist.comm import HaloPlan
from pyg_dist.data import DistData
from pyg_dist.utils.aggregate import keep_transpose, spmm
from pyg_dist.utils import csr
from pyg_dist.nn.state import engine_of


class DistGCNConv(GCNConv):
    r"""Distributed :class:`torch_geometric.nn.GCNConv`.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{\Theta}^{\top} \sum_{j \in
        \mathcal{N}(i) \cup \{ i \}} \frac{e_{j,i}}{\sqrt{\hat{d}_j
        \hat{d}_i}} \mathbf{x}_j

    with :math:`\hat{d}` the degrees of the *whole* graph, so the result
    equals single-graph PyG. Under the exact cache the linear transform runs
    before the exchange (as in PyG), so only
    :math:`\mathbf{\Theta}^{\top}\mathbf{x}_j` of halo nodes travels,
    computed once by their owners. Under a sampled plan the
    surviving edge weights are multiplied by their :math:`1/p` and the
    normalisation stays the whole graph's.

    With ``precompute_layer0`` (see :func:`~pyg_dist.nn.distribute`) and
    the partition's own features as input, the layer uses
    :math:`(\hat A X)\Theta` with :math:`\hat A X` aggregated once on the
    exact plan: no exchange at all, equal to the exact layer up to
    floating-point rounding. When the halo rows must travel untransformed,
    it computes :math:`(\hat A X)\Theta` as well: when a feature cache
    holds the input features, and under every stale cache, which keeps the
    features :math:`\mathbf{x}_j` stale but always applies the current
    :math:`\mathbf{\Theta}` (PipeGCN and PSC-GCN stale features and
    feature gradients, never weights).
    """

    def forward(self, x: Tensor, edge_index: Adj,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        engine = engine_of(self)
        # Whether the rows aggregated are X (Θ applied after), not XΘ:
        # Â(XΘ) = (ÂX)Θ, so the layer exchanges X where its engine says the
        # rows must travel as they are.
        raw = not engine.may_project(self, x)
        engine.exchanges(self, raw)
        if raw:
            out = self.lin(self.propagate(edge_index, x=x, edge_weight=edge_weight))
        else:
            out = self.propagate(edge_index, x=self.lin(x), edge_weight=edge_weight)
        if self.bias is not None:
            out = out + self.bias
        return out

    def message_and_aggregate(self, adj_t: Adj, x: Tensor) -> Tensor:
        if isinstance(adj_t, Tensor):  # a torch.sparse adjacency: pyg_dist.utils.aggregate
            return spmm(adj_t, x, reduce=self.aggr)
        return super().message_and_aggregate(adj_t, x)


def gcn_graph(ctx, conv: GCNConv, edge_index: Adj, edge_weight: Optional[Tensor],
              dtype: torch.dtype):
    r"""``(adj, edge_weight)``: the graph :obj:`conv` aggregates over on the
    context's current plan: normalised with the whole graph's degrees
    (:func:`whole_graph_norm`) when ``conv.normalize``, else the plan's
    edges with their sampling weights."""
    if not conv.normalize:
        return ctx.weighted_adjacency(edge_index, edge_weight, conv.aggr)
    # As PyG: on an edge_index without weights the self-loops get weight 1
    # whatever `improved` says; sparse inputs apply it.
    improved = conv.improved and (edge_weight is not None
                                  or not isinstance(edge_index, Tensor)
                                  or is_torch_sparse_tensor(edge_index))
    return whole_graph_norm(ctx, edge_index, edge_weight, improved, conv.add_self_loops, dtype)


class GCNNorm(NamedTuple):
    r"""GCN-normalised edges of the partition's graph plus self-loops, sorted
    by (target, source); ``edge_id`` is ``-1`` for the added self-loops and
    ``position[e]`` is where partition edge ``e`` went."""
    src: Tensor
    dst: Tensor
    weight: Tensor
    edge_id: Tensor
    adj_t: Optional[Tensor]
    position: Optional[Tensor]
    deg: Tensor  # of the partition's inner and halo nodes


def whole_graph_norm(ctx, edge_index, edge_weight: Optional[Tensor], improved: bool,
                     add_self_loops: bool, dtype: torch.dtype):
    r"""GCN's symmetric normalisation with degrees of the *whole* graph:
    :math:`w_{ji} / \sqrt{\hat d_j \hat d_i}` with
    :math:`\hat d_i = \sum_{j \in \mathcal N(i) \cup \{i\}} w_{ji}`,
    restricted to the plan's edges and multiplied by their sampling
    scale (the normalisation stays the exact graph's).

    An inner node's in-edges all live on its owner, so each rank computes
    its inner degrees and one tiny halo exchange brings the halo degrees.
    For the partition's own graph the result is a weighted CSR ``adj_t``
    (fused path), cached per plan; it returns ``(adj, edge_weight)``.
    :obj:`ctx` is the layer's :class:`~pyg_dist.nn.HaloContext`.
    """
    if not ctx.is_local_graph(edge_index):
        ctx.require_exact_plan()
        if not isinstance(edge_index, Tensor) or edge_index.layout != torch.strided:
            raise NotImplementedError("Distributed GCNConv takes the partition's "
                                      "adjacency or a local bipartite edge_index")
        norm = _normalise(ctx, ctx.data, edge_index, edge_weight, improved,
                          add_self_loops, dtype, sort=False)
        return torch.stack([norm.src, norm.dst]), norm.weight
    key = (improved, add_self_loops, dtype)
    plan = ctx.plan
    if plan.data is not ctx.data:  # a sub-partition: normalised once per plan
        if edge_weight is not None:
            raise NotImplementedError("GCNConv with edge weights on a mini-batch's "
                                      "sub-partition")
        if ("gcn_norm", key) not in plan.cache:
            norm = _normalise(ctx, plan.data, plan.data.edge_index, None, improved,
                              add_self_loops, dtype, sort=True)
            plan.cache[("gcn_norm", key)] = keep_transpose(_scaled_norm(norm, plan, dtype))
        return plan.cache[("gcn_norm", key)], None
    norm = (_partition_norm(ctx, *key) if edge_weight is None else
            _normalise(ctx, ctx.data, ctx.data.edge_index, edge_weight, improved,
                       add_self_loops, dtype, sort=True))
    if plan.is_exact:
        return (keep_transpose(norm.adj_t) if edge_weight is None else norm.adj_t), None
    if edge_weight is None and ("gcn_norm", key) in plan.cache:
        return plan.cache[("gcn_norm", key)], None
    with ctx.stats.timer("sample"):  # building a sampled graph is plan building
        adj_t = _scaled_norm(norm, plan, dtype)
    if edge_weight is None:
        plan.cache[("gcn_norm", key)] = keep_transpose(adj_t)
    return adj_t, None


def _partition_norm(ctx, improved: bool, add_self_loops: bool,
                    dtype: torch.dtype) -> GCNNorm:
    r"""The GCN norm of the partition's own graph (unweighted), cached."""
    key = (improved, add_self_loops, dtype)
    memo = ctx.memo.setdefault("gcn_norm", {})
    if key not in memo:
        memo[key] = _normalise(ctx, ctx.data, ctx.data.edge_index, None, improved,
                               add_self_loops, dtype, sort=True)
    return memo[key]


def _normalise(ctx, data: DistData, edge_index: Tensor, edge_weight: Optional[Tensor],
               improved: bool, add_self_loops: bool, dtype: torch.dtype,
               sort: bool) -> GCNNorm:
    r"""GCN weights of :obj:`edge_index` on :obj:`data`: the rank's
    partition, a sub-partition of it (``inner_id`` / ``halo_id``
    locate its rows), which takes the partition's degrees since its
    edges are a subset, or a balanced batch's part, which carries the
    whole graph's degrees (``deg_in``, ``has_loop``)."""
    src, dst = edge_index
    num_inner = data.num_inner
    edge_id = torch.arange(src.numel(), device=src.device)
    weight = (torch.ones(src.numel(), dtype=dtype, device=src.device)
              if edge_weight is None else edge_weight.to(dtype))
    if add_self_loops:  # as PyG's add_remaining_self_loops
        has_loop = torch.zeros(num_inner, dtype=torch.bool, device=src.device)
        has_loop[dst[src == dst]] = True
        loop = torch.arange(num_inner, device=src.device)[~has_loop]
        src, dst = torch.cat([src, loop]), torch.cat([dst, loop])
        edge_id = torch.cat([edge_id, torch.full_like(loop, -1)])
        weight = torch.cat([weight, weight.new_full((loop.numel(), ),
                                                    2.0 if improved else 1.0)])
    if "has_loop" in data:  # a balanced batch's part: the whole graph's degrees
        deg = data.deg_in.to(dtype)
        if add_self_loops:
            deg = deg + (~data.has_loop).to(dtype) * (2.0 if improved else 1.0)
    elif data is not ctx.data:
        deg = _partition_norm(ctx, improved, add_self_loops, dtype).deg[
            torch.cat([data.inner_id, ctx.data.num_inner + data.halo_id])]
    else:
        deg = weight.new_zeros(num_inner).scatter_add_(0, dst, weight)
        with ctx.use(ctx.full_plan):
            deg = torch.cat([deg, ctx.fetch("gcn_norm", deg.unsqueeze(-1), exact=True
                                            ).view(-1)])
    deg_inv_sqrt = deg.pow(-0.5).masked_fill_(deg == 0, 0.0)
    weight = deg_inv_sqrt[src] * weight * deg_inv_sqrt[dst]
    if not sort:
        return GCNNorm(src, dst, weight, edge_id, None, None, deg)
    order = torch.argsort(dst * (num_inner + data.num_halo) + src)
    src, dst, weight, edge_id = src[order], dst[order], weight[order], edge_id[order]
    adj_t = data.csr_adj_t(torch.stack([src, dst]), weight)
    is_edge = (edge_id >= 0).nonzero().view(-1)
    position = torch.empty_like(is_edge)
    position[edge_id[is_edge]] = is_edge
    return GCNNorm(src, dst, weight, edge_id, adj_t, position, deg)


def _scaled_norm(norm: GCNNorm, plan: HaloPlan, dtype: torch.dtype) -> Tensor:
    r"""The normalised CSR restricted to :obj:`plan`'s edges, each scaled by
    its factor (self-loops always stay)."""
    if plan.patch is not None:  # few edges change: patch the cached CSR
        return plan.patch.apply(norm.adj_t, plan.num_src, norm.position)
    factor = torch.cat([plan.edge_factor().to(dtype), norm.weight.new_ones(1)])
    num_edges = factor.numel() - 1
    factor = factor[torch.where(norm.edge_id < 0, num_edges, norm.edge_id)]
    keep = factor.nonzero().view(-1)
    src = plan.source_map()[norm.src[keep]]
    return csr(torch.stack([src, norm.dst[keep]]), norm.weight[keep] * factor[keep],
               plan.num_inner, plan.num_src)
