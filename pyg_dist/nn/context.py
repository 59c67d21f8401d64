"""``DistContext``: what every distributed layer of a model shares — the
partition, the halo plan, the process group and the byte counters."""
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm import HaloPlan, halo_exchange
from pyg_dist.data import DistData
from pyg_dist.metrics import CommStats


class DistContext:
    r"""Binds distributed layers to one rank's :class:`~pyg_dist.DistData`.

    Layers call :meth:`extend` to turn a node-level tensor of inner rows into
    ``[inner | halo]`` rows, and :meth:`adjacency` to get the local bipartite
    graph in the form their propagate runs fastest on.
    """

    def __init__(self, data: DistData, group=None,
                 stats: Optional[CommStats] = None) -> None:
        world = dist.get_world_size(group) if dist.is_initialized() else 1
        if world != data.num_parts:
            raise RuntimeError(
                f"The partition has {data.num_parts} parts but the process group "
                f"has {world} rank(s)" + ("" if dist.is_initialized() else
                " (call pyg_dist.init() or torch.distributed.init_process_group() first)"))
        self.data = data
        self.group = group
        self.plan = HaloPlan.full(data)
        self.stats = stats if stats is not None else CommStats()
        self.num_inner = data.num_inner
        self.num_src = data.num_inner + data.num_halo
        self._gcn_cache: Dict[tuple, Tuple[Tensor, Optional[Tensor]]] = {}

    def fetch(self, key: str, x: Tensor) -> Tensor:
        r"""The halo rows of :obj:`x` (inner rows), with autograd."""
        return halo_exchange(x, self.plan, self.group, self.stats, key)

    def extend(self, key: str, x: Tensor) -> Tensor:
        r"""``[x | halo rows of x]``: the source rows of the local graph."""
        if x.size(0) != self.num_inner:
            raise ValueError(
                f"Layer '{key}' received {x.size(0)} node rows, but this rank "
                f"owns {self.num_inner} inner nodes: pass the rank's inner "
                f"rows (e.g. DistData.x), not the whole graph")
        if self.num_src == self.num_inner:  # no halo: skip a full copy of x
            return x
        return torch.cat([x, self.fetch(key, x)], dim=0)

    def is_local_graph(self, edge_index) -> bool:
        return edge_index is self.data.edge_index or edge_index is self.data.adj_t

    def adjacency(self, edge_index, fused: bool):
        r"""The partition's own graph as CSR ``adj_t`` (fused sparse
        aggregation) or ``edge_index`` (per-edge messages); any other graph
        is returned as given."""
        if not self.is_local_graph(edge_index):
            return edge_index
        return self.data.adj_t if fused else self.data.edge_index

    def gcn_norm(self, edge_index, edge_weight: Optional[Tensor], improved: bool,
                 add_self_loops: bool, dtype: torch.dtype):
        r"""GCN's symmetric normalisation with degrees of the *whole* graph:
        :math:`w_{ji} / \sqrt{\hat d_j \hat d_i}` with
        :math:`\hat d_i = \sum_{j \in \mathcal N(i) \cup \{i\}} w_{ji}`.

        An inner node's in-edges all live on its owner, so each rank computes
        its inner degrees and one tiny halo exchange brings the halo degrees.
        For the partition's own unweighted graph the result is cached as a
        weighted CSR ``adj_t`` (fused path); it returns ``(adj, edge_weight)``.
        """
        own = self.is_local_graph(edge_index) and edge_weight is None
        cache_key = (improved, add_self_loops, dtype)
        if own and cache_key in self._gcn_cache:
            return self._gcn_cache[cache_key]
        if own:
            edge_index = self.data.edge_index
        elif not isinstance(edge_index, Tensor) or edge_index.layout != torch.strided:
            raise NotImplementedError("Distributed GCNConv takes the partition's "
                                      "adjacency or a local bipartite edge_index")
        src, dst = edge_index
        weight = (torch.ones(src.numel(), dtype=dtype, device=src.device)
                  if edge_weight is None else edge_weight.to(dtype))
        if add_self_loops:  # as PyG's add_remaining_self_loops
            has_loop = torch.zeros(self.num_inner, dtype=torch.bool, device=src.device)
            has_loop[dst[src == dst]] = True
            loop = torch.arange(self.num_inner, device=src.device)[~has_loop]
            src, dst = torch.cat([src, loop]), torch.cat([dst, loop])
            weight = torch.cat([weight, weight.new_full((loop.numel(), ),
                                                        2.0 if improved else 1.0)])
        deg = weight.new_zeros(self.num_inner).scatter_add_(0, dst, weight)
        deg = torch.cat([deg, self.fetch("gcn_norm", deg.unsqueeze(-1)).view(-1)])
        deg_inv_sqrt = deg.pow(-0.5).masked_fill_(deg == 0, 0.0)
        weight = deg_inv_sqrt[src] * weight * deg_inv_sqrt[dst]
        if not own:
            return torch.stack([src, dst]), weight
        order = torch.argsort(dst * self.num_src + src)
        adj_t = self.data.csr_adj_t(torch.stack([src[order], dst[order]]), weight[order])
        self._gcn_cache[cache_key] = (adj_t, None)
        return adj_t, None
