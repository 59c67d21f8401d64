"""Functions that run inside spawned ranks for tests/comm/test_halo.py."""
from types import SimpleNamespace

import torch
import torch.distributed as dist

import pyg_dist
from pyg_dist.comm import HaloPlan
from pyg_dist.comm.halo import PointToPoint, halo_exchange
from pyg_dist.comm.stats import CommStats


def extend_and_cat(root: str):
    r"""``[x | halo rows]`` and the gradient of ``x`` through a weighted sum
    of them, built in one buffer (:meth:`PointToPoint.extend`) and by
    concatenating the halo exchange's rows; and the bytes each counted."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    plan = HaloPlan.full(part)
    generator = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(part.num_inner, 5, generator=generator)
    weight = torch.randn(part.num_inner + part.num_halo, 5, generator=generator)
    out = []
    for build in ("extend", "cat"):
        leaf, stats = x.clone().requires_grad_(), CommStats()
        ctx = SimpleNamespace(group=None, stats=stats)  # what the exchange reads of a context
        if build == "extend":
            rows = PointToPoint().extend(ctx, "layer", leaf, plan)
        else:
            rows = torch.cat([leaf, halo_exchange(leaf, plan, None, stats, "layer")])
        (rows * weight).sum().backward()
        out.append((rows.detach(), leaf.grad, stats.total_bytes_recv))
    return out


def backward_peak(root: str, width: int):
    r"""The live memory an open :class:`PeakSampler` (whose thread never
    reads) saw above its window's start over the backward of ``[x | halo
    rows]``, and the bytes of that backward's gradient of the extended rows
    and of its copy of the inner rows, both live at its peak."""
    from pyg_dist.utils.allocator import PeakSampler
    part = pyg_dist.DistData.load(root, dist.get_rank())
    plan = HaloPlan.full(part)
    x = torch.randn(part.num_inner, width, requires_grad=True)
    ctx = SimpleNamespace(group=None, stats=CommStats())
    rows = PointToPoint().extend(ctx, "layer", x, plan)
    loss = (rows * 2).sum()  # its backward allocates the extended rows' gradient
    sampler = PeakSampler(interval=3600)
    try:
        start = sampler.reset()
        loss.backward()
        return sampler.peak - start, rows.numel() * 4 + x.numel() * 4
    finally:
        sampler.close()


def peak_after_backward(root: str, width: int):
    r"""As :func:`backward_peak`, for ``[x | halo rows]`` of ``x = inp @
    W`` (8 wide, :obj:`width` wide inputs): the peak the sampler saw, and the
    bytes of the input gradient the node that made ``x`` computes right
    after the exchange's backward."""
    from pyg_dist.utils.allocator import PeakSampler
    part = pyg_dist.DistData.load(root, dist.get_rank())
    sampler = PeakSampler(interval=3600)  # open while the exchange runs, as in training
    try:
        inp = torch.randn(part.num_inner, width, requires_grad=True)
        x = inp @ torch.randn(width, 8)
        ctx = SimpleNamespace(group=None, stats=CommStats())
        loss = (PointToPoint().extend(ctx, "layer", x, HaloPlan.full(part)) * 2).sum()
        start = sampler.reset()
        loss.backward()
        return sampler.peak - start, inp.numel() * 4
    finally:
        sampler.close()
