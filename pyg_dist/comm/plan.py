"""``HaloPlan``: which rows travel in one iteration's halo exchanges, and the
local graph the layers aggregate over with them."""
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

# Aggregations whose sampled estimate is made unbiased by edge weights.
SUM_AGGRS = ("add", "sum")


@dataclass
class HaloPlan:
    r"""One iteration's halo exchange and the local graph it serves.

    Exchange: ``send_index`` lists local inner ids, grouped by destination
    peer in rank order with ``send_counts[q]`` rows for peer ``q``; the
    receiver gets ``recv_counts[q]`` rows from each peer ``q`` (the split
    sizes of ``all_to_all_single``), which fill its *received halo block* in
    order.

    Graph: sources are ``[inner | received halo]`` (``num_src`` rows),
    targets the ``num_inner`` inner nodes. ``halo_index`` says which of the
    partition's halo rows were received (``None``: all), ``edge_id`` which
    of the partition's edges survive (``None``: all) and ``edge_scale`` the
    factor :math:`1/p` each surviving edge's contribution is multiplied by
    so that sampled sums stay unbiased (``None``: no scaling). A plan with
    all three ``None`` is the exact one.

    ``skip_exchange`` is set when every rank knows that no rank exchanges a
    row (isolated partitions), so the collective itself can be skipped.
    """
    send_index: Tensor
    send_counts: List[int]
    recv_counts: List[int]
    num_inner: int
    edge_index: Tensor
    adj_t: Tensor
    halo_index: Optional[Tensor] = None
    edge_id: Optional[Tensor] = None
    edge_scale: Optional[Tensor] = None
    skip_exchange: bool = False
    _cache: Dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def full(cls, data, skip_exchange: bool = False) -> "HaloPlan":
        r"""The exact plan of a :class:`~pyg_dist.DistData`: every halo row
        and every edge, unscaled."""
        return cls(data.send_index, data.send_counts.tolist(), data.recv_counts.tolist(),
                   data.num_inner, data.edge_index, data.adj_t,
                   skip_exchange=skip_exchange)

    @classmethod
    def sampled(cls, data, send_keep: Tensor, halo_keep: Tensor,
                edge_keep: Optional[Tensor] = None, edge_scale: Optional[Tensor] = None,
                skip_exchange: bool = False) -> "HaloPlan":
        r"""The plan that sends the rows of ``data.send_index`` selected by
        :obj:`send_keep`, receives the halo rows selected by
        :obj:`halo_keep`, and keeps the edges selected by :obj:`edge_keep`
        (default: all) whose source is inner or a received halo row, each
        scaled by its entry of :obj:`edge_scale` (per partition edge;
        default: none).

        The caller guarantees that every peer's :obj:`send_keep` matches
        this rank's :obj:`halo_keep` row for row.
        """
        num_parts, num_inner = data.num_parts, data.num_inner
        src, dst = data.edge_index
        keep = torch.cat([halo_keep.new_ones(num_inner), halo_keep])[src]
        if edge_keep is not None:
            keep &= edge_keep
        edge_id = keep.nonzero().view(-1)
        # Compact source ids: inner rows stay, received halo rows follow in order.
        src_map = torch.cat([torch.arange(num_inner, device=src.device),
                             num_inner + halo_keep.cumsum(0) - 1])
        edge_index = torch.stack([src_map[src[edge_id]], dst[edge_id]])
        scale = None if edge_scale is None else edge_scale[edge_id].to(data.adj_t.dtype)
        send_owner = torch.repeat_interleave(
            torch.arange(num_parts, device=src.device), data.send_counts.to(src.device),
            output_size=data.send_index.numel())
        num_src = num_inner + int(halo_keep.sum())
        plan = cls(data.send_index[send_keep], _counts(send_owner[send_keep], num_parts),
                   _counts(data.halo_owner[halo_keep], num_parts), num_inner, edge_index,
                   csr(edge_index, scale, num_inner, num_src, data.adj_t.dtype),
                   halo_index=halo_keep.nonzero().view(-1), edge_id=edge_id,
                   edge_scale=scale, skip_exchange=skip_exchange)
        plan._cache["in_degree"] = data.deg_in[:num_inner]
        return plan

    @property
    def num_send(self) -> int:
        return sum(self.send_counts)

    @property
    def num_recv(self) -> int:
        return sum(self.recv_counts)

    @property
    def num_src(self) -> int:
        return self.num_inner + self.num_recv

    @property
    def is_exact(self) -> bool:
        return self.halo_index is None and self.edge_id is None and self.edge_scale is None

    def edge_weight(self, aggr: Optional[str]) -> Optional[Tensor]:
        r"""The weight per surviving edge that makes a sampled aggregation
        :obj:`aggr` an unbiased estimate of the exact one:

        * sum: :math:`1/p_{ij}`;
        * mean: :math:`\frac{1}{p_{ij}} \cdot \frac{|\tilde{\mathcal N}(i)|}
          {|\mathcal N(i)|}`, since the aggregation divides by the number of
          *surviving* neighbours :math:`|\tilde{\mathcal N}(i)|` while the
          exact mean divides by all of them;
        * anything else (max, min, learnable): ``None``, the sampled graph
          is used unweighted.
        """
        if self.edge_scale is None or aggr not in SUM_AGGRS + ("mean", ):
            return None
        if aggr in SUM_AGGRS:
            return self.edge_scale
        if "mean" not in self._cache:
            dst = self.edge_index[1]
            kept = torch.bincount(dst, minlength=self.num_inner)
            full = self._cache["in_degree"]
            self._cache["mean"] = self.edge_scale * (kept[dst] / full[dst].clamp(min=1))
        return self._cache["mean"]

    def adjacency(self, aggr: Optional[str], fused: bool):
        r"""The plan's graph for a layer aggregating with :obj:`aggr`: a CSR
        ``adj_t`` whose values are :meth:`edge_weight` (fused path) or the
        ``edge_index`` (per-edge path, where the weight is applied to the
        messages)."""
        if not fused:
            return self.edge_index
        weight = self.edge_weight(aggr)
        if weight is self.edge_scale:  # a sum, or an unscaled plan
            return self.adj_t
        key = ("adj_t", None if weight is None else aggr)
        if key not in self._cache:
            self._cache[key] = csr(self.edge_index, weight, self.num_inner, self.num_src,
                                   self.adj_t.dtype)
        return self._cache[key]

    def edges(self, value: Tensor) -> Tensor:
        r"""The rows of a per-edge tensor of the partition (e.g.
        ``edge_attr``) that belong to this plan's surviving edges."""
        return value if self.edge_id is None else value[self.edge_id]

    def source_map(self, num_halo: int) -> Tensor:
        r"""Partition source id → this plan's source id (``-1``: not received)."""
        if self.halo_index is None:
            return torch.arange(self.num_inner + num_halo, device=self.edge_index.device)
        out = torch.full((self.num_inner + num_halo, ), -1, dtype=torch.long,
                         device=self.edge_index.device)
        out[:self.num_inner] = torch.arange(self.num_inner, device=out.device)
        out[self.num_inner + self.halo_index] = torch.arange(
            self.num_inner, self.num_src, device=out.device)
        return out

    @property
    def cache(self) -> Dict[Any, Any]:
        r"""Per-plan storage for values derived from it (e.g. the GCN-normalised
        adjacency), shared by all layers of one iteration."""
        return self._cache


def _counts(owner: Tensor, num_parts: int) -> List[int]:
    return torch.bincount(owner, minlength=num_parts).tolist()


def csr(edge_index: Tensor, value: Optional[Tensor], num_rows: int, num_cols: int,
        dtype: torch.dtype = torch.float) -> Tensor:
    r"""A ``torch.sparse`` CSR matrix (rows = targets) of an ``edge_index``
    sorted by target; unit values when :obj:`value` is ``None``."""
    src, dst = edge_index
    crow = torch.zeros(num_rows + 1, dtype=torch.long, device=src.device)
    crow[1:] = torch.bincount(dst, minlength=num_rows).cumsum(0)
    if value is None:
        value = torch.ones(src.numel(), dtype=dtype, device=src.device)
    with warnings.catch_warnings():  # "CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, src, value, (num_rows, num_cols),
                                       check_invariants=False)
