"""``HaloPlan``: which rows travel in one iteration's halo exchanges, and the
local graph the layers aggregate over with them."""
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from pyg_dist.utils import csr, csr_tensor

# Aggregations whose sampled estimate is made unbiased by edge weights.
SUM_AGGRS = ("add", "sum")


class EdgePatch(NamedTuple):
    r"""A sampled graph written as a change of the partition's graph: the
    edges at ``position`` (in partition edge order) take source ``col`` (a
    source id of the plan) and have their weight multiplied by ``factor``
    (0: dropped). Building the sampled graph from a patch costs one copy of
    the kept entries and :math:`O(|E_{\mathrm{cut}}| \log |E_{\mathrm{cut}}|)`
    for the patched ones, never a pass over the partition's edges in Python
    or a sort."""
    position: Tensor
    col: Tensor
    factor: Tensor

    def apply(self, adj_t: Tensor, num_cols: int, position_map: Optional[Tensor] = None,
              mean: bool = False) -> Tensor:
        r"""The CSR :obj:`adj_t` (in partition edge order, or mapped there
        by :obj:`position_map`) with the patch applied and the dropped
        entries removed, so the sampled graph holds, and aggregations visit,
        only its kept edges. :obj:`mean`: the values of every row that lost
        entries are also multiplied by (kept entries / all entries), so
        that a mean (which divides by the kept entries) keeps dividing by
        the full degree, as its unbiased estimate requires."""
        crow, col, value = adj_t.crow_indices(), adj_t.col_indices(), adj_t.values()
        kept = self.factor != 0
        if position_map is None:  # positions ascend (the sampler's cut edges)
            pos = self.position
            dropped = pos[~kept]
        else:
            pos = position_map[self.position]
            dropped = pos[~kept].sort().values
        keep = torch.ones(col.numel(), dtype=torch.bool, device=col.device)
        keep[dropped] = False
        lost = torch.bincount(torch.searchsorted(crow, dropped, right=True) - 1,
                              minlength=crow.numel() - 1)
        new_crow = crow.clone()
        new_crow[1:] -= lost.cumsum(0)
        survivors = keep.nonzero().view(-1)
        new_col, new_value = col.index_select(0, survivors), value.index_select(0, survivors)
        kept_pos = pos[kept]  # where the kept patched entries moved to
        kept_pos = kept_pos - torch.searchsorted(dropped, kept_pos)
        new_col[kept_pos] = self.col[kept]
        new_value[kept_pos] *= self.factor[kept].to(value.dtype)
        if mean and dropped.numel() > 0:
            length = new_crow.diff()
            ratio = (length / (length + lost).clamp(min=1)).to(value.dtype)
            new_value *= ratio.repeat_interleave(length, output_size=new_value.numel())
        return csr_tensor(new_crow, new_col, new_value, (adj_t.size(0), num_cols))


class CompactGraph(NamedTuple):
    r"""The surviving edges only, sources relabelled to the plan's ids."""
    edge_index: Tensor
    edge_id: Tensor  # positions in the partition's edge order
    edge_scale: Optional[Tensor]  # 1/p per surviving edge


class HaloPlan:
    r"""One iteration's halo exchange and the local graph it serves.

    Exchange: ``send_index`` lists local inner ids, grouped by destination
    peer in rank order with ``send_counts[q]`` rows for peer ``q``; the
    receiver gets ``recv_counts[q]`` rows from each peer ``q`` (the split
    sizes of ``all_to_all_single``), which fill its *received halo block* in
    order. ``halo_index`` says which of the partition's halo rows these are
    (``None``: all). ``skip_exchange`` is set when every rank knows that no
    rank exchanges a row (isolated partitions), so no collective runs.

    Graph: sources are ``[inner | received halo]`` (``num_src`` rows),
    targets the ``num_inner`` inner nodes. A sampled plan keeps some edges
    and scales each kept contribution by :math:`1/p` so that aggregations
    stay unbiased. It is given either per edge (``edge_keep`` /
    ``edge_scale`` over the partition's edges) or, when few edges change
    (BNS drops only cut edges), as an :class:`EdgePatch`; layers ask for
    the form they run on with :meth:`adjacency`, built once per plan and
    holding the surviving edges only.
    """

    def __init__(self, data, send_index: Tensor, send_counts: List[int],
                 recv_counts: List[int], halo_index: Optional[Tensor] = None,
                 edge_keep: Optional[Tensor] = None, edge_scale: Optional[Tensor] = None,
                 patch: Optional[EdgePatch] = None, skip_exchange: bool = False,
                 send_keep: Optional[Tensor] = None) -> None:
        self.data = data
        self.send_index = send_index
        self.send_counts = send_counts
        self.recv_counts = recv_counts
        self.num_inner = data.num_inner
        self.halo_index = halo_index
        self.edge_keep = edge_keep
        self.edge_scale = edge_scale
        self.patch = patch
        self.skip_exchange = skip_exchange
        self.send_keep = send_keep  # which rows of data.send_index (None: all)
        # A layer given more rows than num_inner keeps the first num_inner
        # (a mini-batch's layers run on shrinking prefixes of its rows).
        self.trim_input = False
        self.cache: Dict[Any, Any] = {}  # values derived from the plan, shared by layers

    @classmethod
    def full(cls, data) -> "HaloPlan":
        r"""The exact plan of a :class:`~pyg_dist.DistData`: every halo row
        and every edge, unscaled."""
        return cls(data, data.send_index, data.send_counts.tolist(),
                   data.recv_counts.tolist())

    @classmethod
    def sampled(cls, data, send_keep: Tensor, halo_keep: Tensor,
                edge_keep: Optional[Tensor] = None, edge_scale: Optional[Tensor] = None,
                patch: Optional[EdgePatch] = None, skip_exchange: bool = False
                ) -> "HaloPlan":
        r"""The plan that sends the rows of ``data.send_index`` selected by
        :obj:`send_keep` and receives the halo rows selected by
        :obj:`halo_keep`. Its edges: those selected by :obj:`edge_keep`
        (their halo sources must be received; default: every edge whose
        source is inner or received), scaled by :obj:`edge_scale` (per
        partition edge; default: unscaled), or the partition's graph changed
        by :obj:`patch`.

        The caller guarantees that every peer's :obj:`send_keep` matches
        this rank's :obj:`halo_keep` row for row.
        """
        num_parts = data.num_parts
        device = data.send_index.device
        send_owner = torch.repeat_interleave(
            torch.arange(num_parts, device=device), data.send_counts.to(device),
            output_size=data.send_index.numel())
        return cls(data, data.send_index[send_keep],
                   _counts(send_owner[send_keep], num_parts),
                   _counts(data.halo_owner[halo_keep], num_parts),
                   halo_index=halo_keep.nonzero().view(-1), edge_keep=edge_keep,
                   edge_scale=edge_scale, patch=patch, skip_exchange=skip_exchange,
                   send_keep=send_keep)

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
        return (self.halo_index is None and self.edge_keep is None
                and self.edge_scale is None and self.patch is None)

    def recv_rows(self) -> Tensor:
        r"""The partition's halo rows this plan receives, in order."""
        if self.halo_index is None:
            return torch.arange(self.data.num_halo, device=self.send_index.device)
        return self.halo_index

    def send_rows(self) -> Tensor:
        r"""Positions in ``data.send_index`` of the rows this plan sends."""
        if self.send_keep is None:
            return torch.arange(self.data.send_index.numel(), device=self.send_index.device)
        return self.send_keep.nonzero().view(-1)

    def source_map(self) -> Tensor:
        r"""Partition source id → this plan's source id (``-1``: not received)."""
        num_halo = self.data.num_halo
        device = self.send_index.device
        if self.halo_index is None:
            return torch.arange(self.num_inner + num_halo, device=device)
        out = torch.full((self.num_inner + num_halo, ), -1, dtype=torch.long, device=device)
        out[:self.num_inner] = torch.arange(self.num_inner, device=device)
        out[self.num_inner + self.halo_index] = torch.arange(self.num_inner, self.num_src,
                                                             device=device)
        return out

    def edge_factor(self) -> Optional[Tensor]:
        r"""Per partition edge: :math:`1/p` if it survives, 0 if not
        (``None`` for the exact plan)."""
        if self.is_exact:
            return None
        if "edge_factor" not in self.cache:
            src = self.data.edge_index[0]
            dtype = self.data.adj_t.dtype
            if self.patch is not None:
                factor = torch.ones(src.numel(), dtype=dtype, device=src.device)
                factor[self.patch.position] = self.patch.factor.to(dtype)
            else:
                keep = (self.source_map()[src] >= 0 if self.edge_keep is None
                        else self.edge_keep)
                factor = keep.to(dtype) if self.edge_scale is None else \
                    self.edge_scale.to(dtype) * keep
            self.cache["edge_factor"] = factor
        return self.cache["edge_factor"]

    def compact(self) -> CompactGraph:
        r"""The surviving edges, sources in this plan's ids."""
        if "compact" not in self.cache:
            src, dst = self.data.edge_index
            if self.is_exact:
                graph = CompactGraph(self.data.edge_index,
                                     torch.arange(src.numel(), device=src.device), None)
            else:
                keep = self.edge_factor() if self.edge_keep is None else self.edge_keep
                edge_id = keep.nonzero().view(-1)
                if self.patch is not None:
                    scale = self.edge_factor()[edge_id]
                else:
                    scale = None if self.edge_scale is None else \
                        self.edge_scale[edge_id].to(self.data.adj_t.dtype)
                graph = CompactGraph(torch.stack([self.source_map()[src[edge_id]],
                                                  dst[edge_id]]), edge_id, scale)
            self.cache["compact"] = graph
        return self.cache["compact"]

    @property
    def edge_index(self) -> Tensor:
        return self.data.edge_index if self.is_exact else self.compact().edge_index

    def edges(self, value: Tensor) -> Tensor:
        r"""The rows of a per-edge tensor of the partition (e.g.
        ``edge_attr``) that belong to the surviving edges."""
        if self.trim_input:
            raise NotImplementedError("per-edge tensors (edge_attr, edge_weight) on "
                                      "mini-batch plans")
        return value if self.is_exact else value[self.compact().edge_id]

    def edge_weight(self, aggr: Optional[str]) -> Optional[Tensor]:
        r"""The weight per surviving edge (:meth:`compact` order) that makes
        a sampled aggregation :obj:`aggr` an unbiased estimate of the exact
        one:

        * sum: :math:`1/p_{ij}`;
        * mean: :math:`\frac{1}{p_{ij}} \cdot \frac{|\tilde{\mathcal N}(i)|}
          {|\mathcal N(i)|}`, since the aggregation divides by the number of
          *surviving* neighbours :math:`|\tilde{\mathcal N}(i)|` while the
          exact mean divides by all of them;
        * anything else (max, min, learnable), or a plan without scale (a
          plain subgraph, e.g. isolated partitions): ``None``, the sampled
          graph is used unweighted.
        """
        if self.is_exact or aggr not in SUM_AGGRS + ("mean", ):
            return None
        scale = self.compact().edge_scale
        if scale is None or aggr in SUM_AGGRS:
            return scale
        if "mean" not in self.cache:
            dst = self.compact().edge_index[1]
            kept = torch.bincount(dst, minlength=self.num_inner)
            full = self.data.deg_in[:self.num_inner]
            self.cache["mean"] = scale * (kept[dst] / full[dst].clamp(min=1))
        return self.cache["mean"]

    def adjacency(self, aggr: Optional[str], fused: bool):
        r"""The plan's graph for a layer aggregating with :obj:`aggr`: the
        ``edge_index`` of the surviving edges (per-edge path: the weights of
        :meth:`edge_weight` go on the messages) or a CSR ``adj_t`` whose
        values carry them (fused path). Either holds the surviving edges
        only (a patch is applied by :meth:`EdgePatch.apply`), so a sampled
        iteration stores and aggregates only its kept halo rows and edges."""
        if self.is_exact:
            return self.data.adj_t if fused else self.data.edge_index
        if not fused:
            return self.edge_index
        key = ("adj_t", aggr if aggr in SUM_AGGRS + ("mean", ) else None)
        if key not in self.cache:
            if self.patch is not None and key[1] is not None:
                adj = self.patch.apply(self.data.adj_t, self.num_src, mean=aggr == "mean")
            else:
                adj = csr(self.edge_index, self.edge_weight(aggr), self.num_inner,
                          self.num_src, self.data.adj_t.dtype)
            self.cache[key] = adj
        return self.cache[key]


    def split_rows(self, adj_t: Tensor) -> Tuple[Tensor, Tensor]:
        r"""A CSR ``adj_t`` of this plan's graph split by target rows into
        (*interior*: the rows reading no halo column, as a
        ``num_inner x num_inner`` matrix; *border*: the other rows, all
        columns). Each row lives whole in one part and the other part has
        it empty, so any aggregation of the two adds up to that of
        :obj:`adj_t`. Cached per matrix."""
        hit = self.cache.get(("split_rows", id(adj_t)))
        if hit is not None and hit[0] is adj_t:
            return hit[1], hit[2]
        crow, col, value = adj_t.crow_indices(), adj_t.col_indices(), adj_t.values()
        num_rows = crow.numel() - 1
        row = torch.repeat_interleave(torch.arange(num_rows, device=col.device),
                                      crow.diff(), output_size=col.numel())
        border = torch.zeros(num_rows, dtype=torch.bool, device=col.device)
        border[row[col >= self.num_inner]] = True
        parts = []
        for rows, num_cols in ((~border, self.num_inner), (border, adj_t.size(1))):
            keep = rows[row]
            part_crow = torch.zeros_like(crow)
            part_crow[1:] = torch.cumsum(crow.diff() * rows, 0)
            parts.append(csr_tensor(part_crow, col[keep], value[keep], (num_rows, num_cols)))
        self.cache[("split_rows", id(adj_t))] = (adj_t, *parts)
        return parts[0], parts[1]


def _counts(owner: Tensor, num_parts: int) -> List[int]:
    return torch.bincount(owner, minlength=num_parts).tolist()


Plans = Union[HaloPlan, Sequence[HaloPlan]]  # one plan for every layer, or one per layer
