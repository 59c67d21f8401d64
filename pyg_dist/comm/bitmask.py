"""Receivers tell owners which halo rows they want: one bit per row."""
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm.stats import CommStats

_BIT_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def tell_owners(data, halo_keep: Tensor, group=None, stats: Optional[CommStats] = None,
                key: str = "plan") -> Tensor:
    r"""The mirror of a receiver-side choice of halo rows: given this rank's
    :obj:`halo_keep` (one flag per halo row of :obj:`data`), returns the
    flags of its own send rows (``data.send_index`` order) that its peers
    chose. One ``all_to_all`` of bitmasks, counted under :obj:`key`: never
    larger than a list of ids once more than 1/32 of the rows are kept."""
    from pyg_dist.comm.transfer import all_to_all
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return halo_keep.new_zeros(0)
    recv_counts = data.recv_counts.tolist()  # my halo rows per owner
    send_counts = data.send_counts.tolist()  # rows I own per receiver
    packed = torch.cat([pack(m) for m in halo_keep.cpu().split(recv_counts)])
    out_bytes = [num_bytes(c) for c in recv_counts]
    in_bytes = [num_bytes(c) for c in send_counts]
    device = halo_keep.device
    if stats is None:
        masks = all_to_all(packed.to(device), out_bytes, in_bytes, group)
    else:
        with stats.timer("comm"):
            masks = all_to_all(packed.to(device), out_bytes, in_bytes, group)
        stats.add_bytes(key, sum(out_bytes), sum(in_bytes))
    masks = masks.cpu()
    return torch.cat([unpack(m, c) for m, c in zip(masks.split(in_bytes), send_counts)]
                     ).to(device)


def num_bytes(bits: int) -> int:
    return (bits + 7) // 8


def pack(bits: Tensor) -> Tensor:
    padded = torch.zeros(num_bytes(bits.numel()) * 8, dtype=torch.uint8)
    padded[:bits.numel()] = bits
    return (padded.view(-1, 8) * _BIT_WEIGHTS).sum(1).to(torch.uint8)


def unpack(packed: Tensor, num_bits: int) -> Tensor:
    bits = packed.unsqueeze(1).bitwise_and(_BIT_WEIGHTS) != 0
    return bits.view(-1)[:num_bits]
