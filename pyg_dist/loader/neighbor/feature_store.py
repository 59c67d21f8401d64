r"""DistDGL's distributed key-value store for node data, on collectives."""
import math
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from pyg_dist.cache.feature import capacity_rows
from pyg_dist.comm.request import OwnerRequest
from pyg_dist.data import DistData
from pyg_dist.comm.stats import CommStats
from pyg_dist.loader.neighbor.rows_plan import RowsPlan
from pyg_dist.partition.book import owner_of
from pyg_dist.utils.hugepages import empty_like_rows


class PartitionFeatureStore:
    r"""Node data of the whole graph, each row stored once on its owner
    (DistDGL §4.1.3). :meth:`pull` returns the rows of any relabelled global
    ids: rows this rank owns are read from its partition directly, the others
    are requested from their owners with one ``all_to_all`` of ids and one of
    rows per key.

    Keys: ``x`` (features), ``y`` (labels) and ``n_id`` (original node ids)
    of the inner nodes of :obj:`data`.

    With :obj:`cache_capacity` (rows, a share of the halo rows such as
    ``"25%"``, or a size such as ``"8MB"``), the rank keeps a copy of the
    hottest remote rows: the halo nodes that feed the most of its in-edges,
    i.e. the remote nodes its own seeds sample first. They are filled once,
    by one collective :meth:`pull` over :obj:`group` when the store is built,
    and served locally afterwards (``cache_hits`` / ``cache_lookups`` in a
    pull's stats). Node data is static, so a cached row never goes stale.

    :meth:`pull` is collective over its group: every rank calls it, in the
    same order, with its own ids.
    """

    KEYS = ("x", "y", "n_id")

    def __init__(self, data: DistData, cache_capacity: Union[int, str] = 0,
                 group=None) -> None:
        self.partptr = data.partptr.cpu()
        self.start = int(self.partptr[data.rank])
        self.rank = data.rank
        # Held on the CPU, as DistDGL's KVStore: the group is gloo's.
        self.tensors: Dict[str, Tensor] = {
            "x": data.x.cpu(), "y": data.y.cpu(), "n_id": data.n_id[:data.num_inner].cpu()}
        self.cached_ids = torch.empty(0, dtype=torch.long)
        self.cached: Dict[str, Tensor] = {}
        hot = self._hottest_halo(data, cache_capacity)
        pulled = self.pull(hot, self.KEYS, group)  # collective: every rank fills at once
        self.cached_ids, order = hot.sort()
        self.cached = {key: rows[order] for key, rows in pulled.items()}

    def _hottest_halo(self, data: DistData, capacity: Union[int, str]) -> Tensor:
        rows = capacity_rows(capacity, data.num_halo,
                             data.x[0].numel() * data.x.element_size())
        src = data.edge_index[0].cpu()
        feeds = torch.bincount(src[src >= data.num_inner] - data.num_inner,
                               minlength=data.num_halo)
        hottest = torch.argsort(feeds, descending=True, stable=True)[:rows]
        return data.global_id[data.num_inner + hottest].cpu()

    @property
    def num_cached(self) -> int:
        return self.cached_ids.numel()

    def pull(self, ids: Tensor, keys: Sequence[str] = ("x", ), group=None,
             stats: Optional[CommStats] = None) -> Dict[str, Tensor]:
        r"""The rows of the relabelled global :obj:`ids` for each key in
        :obj:`keys`, in the order of :obj:`ids` (CPU tensors), requested over
        :obj:`group`; bytes and cache hits counted in :obj:`stats`."""
        return self._pull(ids, keys, group, stats)[0]

    def pull_plan(self, ids: Tensor, keys: Sequence[str], group=None,
                  stats: Optional[CommStats] = None) -> Tuple[Dict[str, Tensor], RowsPlan]:
        r""":meth:`pull` of :obj:`keys` (which may leave out ``x``), and the
        :class:`RowsPlan` that moves rows derived from ``x`` (a projection
        of them, computed by their owners) to where :obj:`ids` needs them,
        from the same request. Without a cache only: cached rows would be
        rows the owners are not asked for."""
        if self.num_cached:
            raise ValueError("pull_plan needs a store without a feature cache")
        return self._pull(ids, keys, group, stats, plan=True)

    def _pull(self, ids: Tensor, keys: Sequence[str], group, stats: Optional[CommStats],
              plan: bool = False) -> Tuple[Dict[str, Tensor], Optional[RowsPlan]]:
        ids = ids.cpu()
        owner = owner_of(ids, self.partptr)
        is_local = owner == self.rank
        local, remote = is_local.nonzero().view(-1), (~is_local).nonzero().view(-1)
        local_rows = ids.index_select(0, local) - self.start
        slot = self._cache_slots(ids.index_select(0, remote))
        hit, miss = remote[slot >= 0], remote[slot < 0]
        if stats is not None:
            stats.count("cache_hits", hit.numel())
            stats.count("cache_lookups", remote.numel())  # every remote row asked for
        request = OwnerRequest(ids.index_select(0, miss), owner.index_select(0, miss), group,
                               stats, "features")
        served = request.received - self.start
        answered = miss.index_select(0, request.order)  # where the replies' rows go
        # One gather writes the local rows in place (the others read row 0 and
        # are overwritten below): a pass over the batch's rows fewer than
        # gathering the local rows apart and scattering them.
        gather = torch.zeros_like(ids)
        gather[local] = local_rows
        replies = self._replies(request, served, keys)
        out = {}
        for key in keys:
            table = self.tensors[key]
            rows = empty_like_rows(table, ids.numel())
            if table.size(0):
                torch.index_select(table, 0, gather, out=rows)
            if hit.numel():
                rows.index_copy_(0, hit, self.cached[key].index_select(0, slot[slot >= 0]))
            rows.index_copy_(0, answered, replies[key])
            out[key] = rows
        return out, (RowsPlan.of(ids.numel(), local, local_rows, answered, served, request,
                                 self.tensors["x"].size(0)) if plan else None)

    def _replies(self, request: OwnerRequest, served: Tensor,
                 keys: Sequence[str]) -> Dict[str, Tensor]:
        r"""The owners' rows of each key in :obj:`keys` for :obj:`request`
        (:obj:`served`: the rows asked of this rank). Keys of 64-bit integer
        rows (labels, original ids), when there are several, travel as the
        columns of one tensor in one reply: an ``all_to_all`` (a round trip
        between the ranks) fewer per such key beyond the first. Every other
        key travels in a reply of its own."""
        packed = [key for key in keys if self.tensors[key].dtype == torch.long]
        packed = packed if len(packed) > 1 else []
        replies = {key: request.reply(self._served_rows(key, served))
                   for key in keys if key not in packed}
        if not packed:
            return replies
        widths = [math.prod(self.tensors[key].shape[1:]) for key in packed]
        received = request.reply(torch.cat(
            [self.tensors[key].index_select(0, served).reshape(served.numel(), width)
             for key, width in zip(packed, widths)], dim=1))
        start = 0
        for key, width in zip(packed, widths):
            replies[key] = received[:, start:start + width].reshape(
                (received.size(0), ) + tuple(self.tensors[key].shape[1:]))
            start += width
        return replies

    def _served_rows(self, key: str, served: Tensor) -> Tensor:
        table = self.tensors[key]
        return torch.index_select(table, 0, served, out=empty_like_rows(table, served.numel()))

    def _cache_slots(self, ids: Tensor) -> Tensor:
        r"""Per id: its row in the cache, or -1."""
        if not self.num_cached or not ids.numel():
            return torch.full_like(ids, -1)
        pos = torch.searchsorted(self.cached_ids, ids).clamp(max=self.num_cached - 1)
        return torch.where(self.cached_ids[pos] == ids, pos, -1)
