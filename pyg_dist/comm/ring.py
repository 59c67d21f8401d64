r"""The ring schedule of sequential aggregation (SAR): one peer's halo rows
at a time.

With :math:`P` ranks, round :math:`k \in \{1, \dots, P - 1\}` of rank
:math:`r` receives the rows it needs from rank :math:`(r - k) \bmod P` and
sends the rows rank :math:`(r + k) \bmod P` needs from it, so every round
is a permutation of the ranks (each sends once and receives once) and a
rank holds one peer's rows at a time. The gradients of a round's rows go
back the other way. Round 0 is the rank's own inner rows (nothing
travels).
"""
from typing import Optional

import torch
from torch import Tensor

from pyg_dist.comm.compress import RowCodec
from pyg_dist.comm.transfer import Transfer, decode, encode, start_p2p, wire_row
from pyg_dist.comm.plan import HaloPlan
from pyg_dist.comm.stats import CommStats


class RingSchedule:
    r"""Which rows of a :class:`~pyg_dist.comm.HaloPlan` travel in each
    round of the ring: ``recv_from(k)``'s rows are the plan's source ids
    ``sources(k)``, and ``send_index(k)`` are the inner rows that go to
    ``send_to(k)``."""

    def __init__(self, plan: HaloPlan, rank: int, world: int) -> None:
        self.plan, self.rank, self.world = plan, rank, world
        self._send_end = torch.tensor(plan.send_counts).cumsum(0).tolist()
        self._recv_end = torch.tensor(plan.recv_counts).cumsum(0).tolist()

    @classmethod
    def of(cls, plan: HaloPlan, rank: int, world: int) -> "RingSchedule":
        r"""The schedule of :obj:`plan`, built once per plan."""
        if "ring" not in plan.cache:
            plan.cache["ring"] = cls(plan, rank, world)
        return plan.cache["ring"]

    def send_to(self, k: int) -> int:
        return (self.rank + k) % self.world

    def recv_from(self, k: int) -> int:
        return (self.rank - k) % self.world

    def sources(self, k: int) -> slice:
        r"""Round :obj:`k`'s rows as source ids of the plan's graph."""
        if k == 0:
            return slice(0, self.plan.num_inner)
        q = self.recv_from(k)
        end = self.plan.num_inner + self._recv_end[q]
        return slice(end - self.plan.recv_counts[q], end)

    def send_index(self, k: int) -> Tensor:
        q = self.send_to(k)
        end = self._send_end[q]
        return self.plan.send_index[end - self.plan.send_counts[q]:end]


def start_round(send: Tensor, send_to: int, recv_from: int, num_recv: int, group,
                codec: Optional[RowCodec] = None, stats: Optional[CommStats] = None,
                key: str = "", backward: bool = False) -> Transfer:
    r"""Sends the rows of :obj:`send` to rank :obj:`send_to` and receives
    :obj:`num_recv` rows of the same shape from :obj:`recv_from` (a round
    of the ring, or its gradients going back); returns at once. The bytes
    are counted under :obj:`key`; the caller's wait is timed as ``comm``
    (and ``comm_backward`` when :obj:`backward`)."""
    wire = wire_row(send, codec)
    sends, recvs = {}, {}
    if send.size(0) > 0:
        sends[send_to] = encode(send.detach(), codec)
    if num_recv > 0:
        recvs[recv_from] = wire.new_empty((num_recv, ) + tuple(wire.shape[1:]))
    works = start_p2p(sends, recvs, group)
    row_bytes = wire.numel() * wire.element_size()
    if stats is not None:
        stats.add_bytes(key, send.size(0) * row_bytes, num_recv * row_bytes)
    return Transfer(works, recvs.get(recv_from), lambda out: decode(out, codec, send),
                    row_bytes, sends.get(send_to), stats, backward)
