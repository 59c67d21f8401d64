r"""Requests to owners: global ids travel to the ranks that own them and the
owners' answers travel back (DistDGL's pull, as collectives)."""
import math
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm.transfer import all_to_all
from pyg_dist.comm.stats import CommStats


class OwnerRequest:
    r"""Sends :obj:`ids` (relabelled global ids) to their owners: one
    ``all_to_all`` of counts and one of ids. Every rank of :obj:`group` must
    take part, with its own (possibly empty) ids.

    On the owner, :attr:`received` holds the ids others asked for, grouped by
    requesting rank (the ids it owns itself included, served without the
    network); :meth:`reply` / :meth:`reply_ragged` send one answer per
    received id back. On the requester, answers arrive in the order
    ``ids[order]`` (grouped by owner).

    Bytes that cross the network (not the rank's own share) are counted in
    :obj:`stats`: the requests under :obj:`key`, the replies under
    ``key + ".rows"``.
    """

    def __init__(self, ids: Tensor, owner: Tensor, group=None,
                 stats: Optional[CommStats] = None, key: str = "request") -> None:
        self.group, self.stats, self.key = group, stats, key
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.order = torch.argsort(owner, stable=True)
        self.send_counts: List[int] = torch.bincount(
            owner, minlength=self.world).tolist()
        ones = [1] * self.world
        self.recv_counts: List[int] = self._exchange(
            torch.tensor(self.send_counts), ones, ones, key).tolist()
        self.received = self._exchange(ids.index_select(0, self.order), self.send_counts,
                                       self.recv_counts, key)

    def _count(self, key: str, sent: List[int], recv: List[int], row_bytes: int) -> None:
        if self.stats is not None:
            self.stats.add_bytes(key, (sum(sent) - sent[self.rank]) * row_bytes,
                                 (sum(recv) - recv[self.rank]) * row_bytes)

    def _exchange(self, rows: Tensor, send_counts: List[int], recv_counts: List[int],
                  key: str) -> Tensor:
        row_bytes = math.prod(rows.shape[1:]) * rows.element_size()
        self._count(key, send_counts, recv_counts, row_bytes)
        if self.stats is None:
            return all_to_all(rows, send_counts, recv_counts, self.group)
        with self.stats.timer("comm"):
            return all_to_all(rows, send_counts, recv_counts, self.group)

    def reply(self, rows: Tensor) -> Tensor:
        r"""Owner side: one row per :attr:`received` id. Returns, on the
        requester, one row per requested id in the order ``ids[order]``."""
        return self._exchange(rows, self.recv_counts, self.send_counts, self.key + ".rows")

    def reply_ragged(self, counts: Tensor, values: Tensor) -> Tuple[Tensor, Tensor]:
        r"""Owner side: ``counts[i]`` values per :attr:`received` id,
        concatenated in :obj:`values`. Returns, on the requester, the counts
        per requested id (order ``ids[order]``) and their values,
        concatenated in that order."""
        recv_counts = self.reply(counts)
        owner_totals = _segment_sums(counts, self.recv_counts)
        requester_totals = _segment_sums(recv_counts, self.send_counts)
        return recv_counts, self._exchange(values, owner_totals, requester_totals,
                                           self.key + ".rows")


def _segment_sums(values: Tensor, sizes: List[int]) -> List[int]:
    if values.numel() == 0:
        return [0] * len(sizes)
    ptr = torch.tensor([0] + sizes).cumsum(0)
    csum = torch.cat([values.new_zeros(1), values.cumsum(0)])
    return (csum[ptr[1:]] - csum[ptr[:-1]]).tolist()
