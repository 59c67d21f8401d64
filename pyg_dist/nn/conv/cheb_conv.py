from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.nn import ChebConv

from pyg_dist.nn.state import engine_of


class DistChebConv(ChebConv):
    r"""Distributed :class:`torch_geometric.nn.ChebConv`.

    The scaled Laplacian :math:`\hat L = 2L / \lambda_{\max} - I` is that of
    the whole graph, restricted to the rank's inner targets: PyG's
    :func:`~torch_geometric.utils.get_laplacian` takes degrees over source
    rows (out-degrees), which the partition holds for its inner and halo
    nodes (``deg_out``, less the self-loops PyG removes first, a halo
    node's counted by its owner). Without ``lambda_max``,
    :math:`\lambda_{\max} = 2 \max \hat w` over all ranks (one all-reduce).
    Each of the :math:`K - 1` propagations fetches the current halo rows;
    the Laplacian itself is computed once per partition (and ``lambda_max``).
    Unweighted graphs on the exact plan only (``edge_weight`` would need
    each node's weighted out-degree from the ranks that hold its out-edges).
    """

    def __norm__(self, edge_index: Tensor, num_nodes: Optional[int],
                 edge_weight: Optional[Tensor], normalization: Optional[str],
                 lambda_max=None, dtype=None, batch: Optional[Tensor] = None):
        ctx = engine_of(self).ctx  # the partition, its plan and group
        if edge_weight is not None or batch is not None:
            raise NotImplementedError("Distributed ChebConv: unweighted graphs without a "
                                      "`batch` vector only")
        if not ctx.is_local_graph(edge_index) or not ctx.plan.is_exact:
            raise NotImplementedError("Distributed ChebConv runs on the partition's own "
                                      "graph under the exact plan")
        if isinstance(lambda_max, Tensor):  # per call: not cached
            return self._laplacian(ctx, normalization, lambda_max, dtype)
        # Fixed for the partition: computed once (with its halo exchange and
        # all-reduce), not in every forward.
        key = ("cheb_norm", normalization, lambda_max, dtype)
        if key not in ctx.plan.cache:
            ctx.plan.cache[key] = self._laplacian(ctx, normalization, lambda_max, dtype)
        return ctx.plan.cache[key]

    @staticmethod
    def _laplacian(ctx, normalization: Optional[str], lambda_max, dtype):
        r"""The scaled Laplacian's edges and weights on the inner targets."""
        data = ctx.data
        src, dst = data.edge_index
        num_inner = data.num_inner
        is_loop = src == dst
        loops = torch.bincount(dst[is_loop], minlength=num_inner).to(dtype).unsqueeze(-1)
        with torch.no_grad():  # the halo nodes' self-loops, from their owners
            loops = torch.cat([loops, ctx.fetch("cheb_norm", loops, exact=True)]).view(-1)
        deg = data.deg_out.to(dtype) - loops
        src, dst = src[~is_loop], dst[~is_loop]
        inner = torch.arange(num_inner, device=src.device)
        ones = deg.new_ones(num_inner)
        if normalization is None:  # L = D - A
            weight, loop_weight = -deg.new_ones(src.numel()), deg[:num_inner]
        elif normalization == "sym":  # L = I - D^-1/2 A D^-1/2
            inv_sqrt = deg.pow(-0.5).masked_fill_(deg == 0, 0.0)
            weight, loop_weight = -inv_sqrt[src] * inv_sqrt[dst], ones
        else:  # "rw": L = I - D^-1 A
            inv = (1.0 / deg).masked_fill_(deg == 0, 0.0)
            weight, loop_weight = -inv[src], ones
        weight = torch.cat([weight, loop_weight])
        if lambda_max is None:
            lambda_max = 2.0 * weight.max()
            if dist.is_initialized():
                dist.all_reduce(lambda_max, op=dist.ReduceOp.MAX, group=ctx.group)
        elif not isinstance(lambda_max, Tensor):
            lambda_max = torch.tensor(lambda_max, dtype=dtype, device=src.device)
        weight = (2.0 * weight) / lambda_max
        weight.masked_fill_(weight == float("inf"), 0)
        weight[src.numel():] -= 1
        edge_index = torch.stack([torch.cat([src, inner]), torch.cat([dst, inner])])
        ctx.normalised[edge_index] = ctx.plan  # already the plan's graph (see HaloContext)
        return edge_index, weight
