"""``HaloPlan``: who sends which rows to whom in one halo exchange."""
from dataclasses import dataclass
from typing import List

from torch import Tensor


@dataclass
class HaloPlan:
    r"""The rows each rank sends and receives in one exchange.

    ``send_index`` lists local inner ids, grouped by destination peer in
    rank order with ``send_counts[q]`` rows for peer ``q``; the receiver gets
    ``recv_counts[q]`` rows from each peer ``q``, which fill its halo block
    in order (halo rows are grouped by owner). The counts are the split sizes
    of ``all_to_all_single``.
    """
    send_index: Tensor
    send_counts: List[int]
    recv_counts: List[int]

    @classmethod
    def full(cls, data) -> "HaloPlan":
        r"""The exact plan of a :class:`~pyg_dist.DistData`: every halo row."""
        return cls(data.send_index, data.send_counts.tolist(),
                   data.recv_counts.tolist())

    @property
    def num_send(self) -> int:
        return sum(self.send_counts)

    @property
    def num_recv(self) -> int:
        return sum(self.recv_counts)

    def to(self, device) -> "HaloPlan":
        return HaloPlan(self.send_index.to(device), self.send_counts,
                        self.recv_counts)
