r"""The point-to-point exchange (``exchange="halo"``): every rank sends each
peer exactly the rows of its halo, differentiably."""
from typing import Callable, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm.compress import RowCodec
from pyg_dist.comm.exchange import Exchange
from pyg_dist.comm.plan import HaloPlan
from pyg_dist.comm.stats import CommStats
from pyg_dist.comm.transfer import Transfer, start_all_to_all
from pyg_dist.utils.allocator import sample_live_peak, sample_live_peak_after
from pyg_dist.utils.hugepages import empty_like_rows


def exchange_rows(x: Tensor, plan: HaloPlan, group, stats: Optional[CommStats],
                  key: str, codec: Optional[RowCodec] = None):
    r"""The rows of :obj:`x` (inner rows) that :obj:`plan` sends, exchanged
    now, without autograd, timed and counted under :obj:`key`; returns the
    received halo rows and the bytes one row took."""
    transfer = start_all_to_all(x.index_select(0, plan.send_index), plan.send_counts,
                                plan.recv_counts, group, codec, stats, key)
    return transfer.wait(), transfer.row_bytes


def start_grads(grad_halo: Tensor, plan: HaloPlan, group, stats: Optional[CommStats],
                key: str, codec: Optional[RowCodec]) -> Transfer:
    r"""Starts sending the gradients of the halo rows of :obj:`plan` to
    their owners (counted under ``key + ".grad"``); the transfer returns,
    on the owner, one gradient per row of ``plan.send_index``."""
    return start_all_to_all(grad_halo, plan.recv_counts, plan.send_counts, group, codec,
                            stats, key + ".grad", backward=True)


def return_grads(grad_halo: Tensor, plan: HaloPlan, num_inner: int, group,
                 stats: Optional[CommStats], key: str, codec: Optional[RowCodec],
                 own: Optional[Tensor] = None) -> Tensor:
    r"""The backward of a halo exchange: the gradients of the halo rows of
    :obj:`plan` travel to their owners, which add them into a gradient of
    their :obj:`num_inner` inner rows (returned): zeros, or a copy of
    :obj:`own` (the inner rows' own gradient, made while the rows travel)."""
    transfer = start_grads(grad_halo, plan, group, stats, key, codec)
    grad = (grad_halo.new_zeros((num_inner, ) + tuple(grad_halo.shape[1:])) if own is None
            else own.clone())
    received = transfer.wait()
    sample_live_peak()  # the step's peak: activations, both gradients, received rows
    return grad.index_add_(0, plan.send_index, received)


class _HaloRows(torch.autograd.Function):
    r"""Forward: the halo rows of a transfer started earlier (every rank
    sent the inner rows its peers need), :math:`H_{\mathrm{halo}} =
    \mathrm{A2A}(H_{\mathrm{inner}}[\mathrm{send}])`. Backward: the halo
    gradients travel back to their owners, which add them into their inner
    gradients, :math:`\nabla H_{\mathrm{inner}} \mathrel{+}= \mathrm{scatter}(
    \mathrm{A2A}^{-1}(\nabla H_{\mathrm{halo}}), \mathrm{send})`.

    Both directions travel encoded by :obj:`codec` when one is given
    (:mod:`~pyg_dist.comm.compress`)."""

    @staticmethod
    def forward(ctx, x: Tensor, transfer: Transfer, plan: HaloPlan, group,
                stats: Optional[CommStats], key: str, codec: Optional[RowCodec]) -> Tensor:
        ctx.plan, ctx.group, ctx.stats, ctx.key, ctx.codec = plan, group, stats, key, codec
        ctx.num_inner = x.size(0)
        sample_live_peak_after(x)
        return transfer.wait()

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        grad = return_grads(grad_halo, ctx.plan, ctx.num_inner, ctx.group, ctx.stats,
                            ctx.key, ctx.codec)
        return grad, None, None, None, None, None, None


class _Extended(torch.autograd.Function):
    r""":math:`[H_{\mathrm{inner}} \,|\, H_{\mathrm{halo}}]` in one buffer,
    the halo rows received straight into it: what ``torch.cat([x,
    halo_exchange(x)])`` computes, without the receive buffer and the copy
    out of it. Backward: the inner rows' own gradient, with the halo
    gradients returned by their owners added at the rows they were sent
    from, into one buffer."""

    @staticmethod
    def forward(ctx, x: Tensor, plan: HaloPlan, group, stats: Optional[CommStats],
                key: str) -> Tensor:
        ctx.plan, ctx.group, ctx.stats, ctx.key = plan, group, stats, key
        num_inner = ctx.num_inner = x.size(0)
        sample_live_peak_after(x)
        out = empty_like_rows(x, num_inner + plan.num_recv)
        transfer = start_all_to_all(x.index_select(0, plan.send_index), plan.send_counts,
                                    plan.recv_counts, group, None, stats, key,
                                    out=out[num_inner:])
        out[:num_inner].copy_(x)  # while the halo rows travel
        transfer.wait()
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad, num_inner = grad.contiguous(), ctx.num_inner
        return (return_grads(grad[num_inner:], ctx.plan, num_inner, ctx.group, ctx.stats,
                             ctx.key, None, own=grad[:num_inner]), None, None, None, None)


def _exchanges_nothing(plan: HaloPlan, group) -> bool:
    return plan.skip_exchange or not dist.is_initialized() or dist.get_world_size(group) == 1


def start_halo_exchange(x: Tensor, plan: HaloPlan, group=None,
                        stats: Optional[CommStats] = None, key: str = "",
                        codec: Optional[RowCodec] = None) -> Callable[[], Tensor]:
    r"""The halo exchange split in two: the rows leave now, and the returned
    function waits for this rank's halo rows, differentiably, so the caller
    can compute in between."""
    if _exchanges_nothing(plan, group):
        return lambda: x.new_empty((0, ) + tuple(x.shape[1:]))
    transfer = start_all_to_all(x.detach().index_select(0, plan.send_index),
                                plan.send_counts, plan.recv_counts, group, codec, stats, key)
    return lambda: _HaloRows.apply(x, transfer, plan, group, stats, key, codec)


def halo_exchange(x: Tensor, plan: HaloPlan, group=None,
                  stats: Optional[CommStats] = None, key: str = "",
                  codec: Optional[RowCodec] = None) -> Tensor:
    r"""Returns this rank's halo rows of the node-level tensor :obj:`x`
    (inner rows) that :obj:`plan` receives, differentiably. A world of one
    rank, or a plan that isolates the partitions, exchanges nothing."""
    return start_halo_exchange(x, plan, group, stats, key, codec)()


def extend_rows(x: Tensor, plan, group=None, stats: Optional[CommStats] = None,
                key: str = "") -> Tensor:
    r"""``torch.cat([x, halo_exchange(x, plan)])`` in one buffer, the halo
    rows received straight into it (differentiably). :obj:`plan` needs only
    ``send_index``, ``send_counts``, ``recv_counts``, ``num_recv`` and
    ``skip_exchange`` of a :class:`~pyg_dist.comm.HaloPlan`."""
    if _exchanges_nothing(plan, group):
        return x
    return _Extended.apply(x, plan, group, stats, key)


class PointToPoint(Exchange):
    r"""Each rank sends each peer exactly the rows of its halo (one
    all-to-all per layer and direction), :attr:`asynchronous`ly on request:
    the overlapping engines (:mod:`pyg_dist.nn.engine`,
    :mod:`pyg_dist.nn.async_layers`) compute while the rows travel."""
    name = "halo"
    summary = "sends each peer the rows it needs"
    point_to_point = True
    asynchronous = True

    def fetch(self, ctx, key: str, x: Tensor, plan: HaloPlan,
              codec: Optional[RowCodec]) -> Tensor:
        return halo_exchange(x, plan, ctx.group, ctx.stats, key, codec)

    def extend(self, ctx, key: str, x: Tensor, plan: HaloPlan) -> Tensor:
        if _exchanges_nothing(plan, ctx.group):
            return super().extend(ctx, key, x, plan)
        return _Extended.apply(x, plan, ctx.group, ctx.stats, key)

    def start(self, ctx, key: str, rows: Tensor, send_counts: List[int],
              recv_counts: List[int], backward: bool = False) -> Transfer:
        r"""Starts the all-to-all of :obj:`rows` (no autograd), counted
        under :obj:`key`: the transfers of the per-node schedule."""
        return start_all_to_all(rows, send_counts, recv_counts, ctx.group, ctx.codec,
                                ctx.stats, key, backward)

    def start_fetch(self, ctx, key: str, x: Tensor, plan: HaloPlan,
                    codec: Optional[RowCodec]) -> Callable[[], Tensor]:
        return start_halo_exchange(x, plan, ctx.group, ctx.stats, key, codec)
