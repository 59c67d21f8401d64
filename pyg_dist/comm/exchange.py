"""The differentiable halo exchange."""
import math
from contextlib import nullcontext
from typing import Callable, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm.compress import RowCodec
from pyg_dist.comm.plan import HaloPlan
from pyg_dist.comm.stats import CommStats


class Pending:
    r"""An ``all_to_all`` in flight: :meth:`wait` blocks until every row has
    arrived and returns them decoded (see :func:`start_exchange`)."""

    def __init__(self, recv: Tensor, works: list, decode: Callable[[Tensor], Tensor],
                 row_bytes: int, keep_alive: Tensor) -> None:
        self.recv, self.works, self.decode = recv, works, decode
        self.row_bytes = row_bytes
        self._send = keep_alive  # the send buffer must outlive the transfer

    def wait(self) -> Tensor:
        for work in self.works:
            work.wait()
        self.works, self._send = [], None
        return self.decode(self.recv)


def _start(send: Tensor, send_counts: List[int], recv_counts: List[int], group) -> tuple:
    recv = send.new_empty((sum(recv_counts), ) + tuple(send.shape[1:]))
    send = send.contiguous()
    if dist.get_backend(group) != "gloo":
        work = dist.all_to_all_single(recv, send, output_split_sizes=recv_counts,
                                      input_split_sizes=send_counts, group=group,
                                      async_op=True)
        return recv, [work], send
    rank = dist.get_rank(group)
    ins, outs = recv.split(recv_counts), send.split(send_counts)
    ins[rank].copy_(outs[rank])
    peer = (lambda q: q) if group is None else (lambda q: dist.get_global_rank(group, q))
    works = [dist.irecv(ins[q], peer(q), group=group)
             for q in range(len(ins)) if q != rank and recv_counts[q] > 0]
    works += [dist.isend(outs[q], peer(q), group=group)
              for q in range(len(outs)) if q != rank and send_counts[q] > 0]
    return recv, works, send


def all_to_all(send: Tensor, send_counts: List[int], recv_counts: List[int],
               group=None) -> Tensor:
    r"""All-to-all of the rows of :obj:`send` (split sizes in rows) into a
    new tensor.

    On gloo it is point-to-point: every receive is posted before any send.
    gloo's ``all_to_all_single`` announces a rank's receive on the same
    connection as its data, so ranks that arrive apart take turns on a link
    instead of using both directions (measured on an emulated 1gbit link:
    half the throughput). NCCL keeps its native collective."""
    recv, works, _ = _start(send, send_counts, recv_counts, group)
    for work in works:
        work.wait()
    return recv


def start_exchange(rows: Tensor, send_counts: List[int], recv_counts: List[int],
                   group=None, codec: Optional[RowCodec] = None) -> Pending:
    r"""Starts the ``all_to_all`` of :obj:`rows` (encoded by :obj:`codec`
    on the wire) and returns at once: the transfer proceeds in the
    backend's own threads (gloo) or stream (NCCL) while the caller computes.
    Every rank must start its exchanges in the same order."""
    if codec is None:
        recv, works, send = _start(rows, send_counts, recv_counts, group)
        return Pending(recv, works, lambda out: out,
                       math.prod(rows.shape[1:]) * rows.element_size(), send)
    payload = codec.encode(rows.flatten(1))
    recv, works, send = _start(payload, send_counts, recv_counts, group)
    shape, dtype = tuple(rows.shape[1:]), rows.dtype
    return Pending(recv, works, lambda out: codec.decode(out, dtype).view((-1, ) + shape),
                   payload.size(1), send)


def _exchange(rows: Tensor, send_counts: List[int], recv_counts: List[int], group,
              codec: Optional[RowCodec]):
    r"""Blocking :func:`start_exchange`; returns the received rows and the
    bytes one row took."""
    pending = start_exchange(rows, send_counts, recv_counts, group, codec)
    return pending.wait(), pending.row_bytes


def exchange_rows(x: Tensor, plan: HaloPlan, group, stats: Optional[CommStats],
                  key: str, codec: Optional[RowCodec] = None):
    r"""The rows of :obj:`x` (inner rows) that :obj:`plan` sends, exchanged
    now, without autograd, timed and counted under :obj:`key`; returns the
    received halo rows and the bytes one row took."""
    send = x.index_select(0, plan.send_index)
    if stats is None:
        return _exchange(send, plan.send_counts, plan.recv_counts, group, codec)
    with stats.timer("comm"):
        rows, row_bytes = _exchange(send, plan.send_counts, plan.recv_counts, group, codec)
    stats.add_bytes(key, plan.num_send * row_bytes, plan.num_recv * row_bytes)
    return rows, row_bytes


def return_grads(grad_halo: Tensor, plan: HaloPlan, num_inner: int, group,
                 stats: Optional[CommStats], key: str,
                 codec: Optional[RowCodec]) -> Tensor:
    r"""The backward of a halo exchange: the gradients of the halo rows of
    :obj:`plan` travel to their owners, which add them into a gradient of
    their :obj:`num_inner` inner rows (returned)."""
    if stats is None:
        grad_send = _exchange(grad_halo, plan.recv_counts, plan.send_counts, group, codec)[0]
    else:
        with stats.timer("comm"), stats.timer("comm_backward"):
            grad_send, row_bytes = _exchange(grad_halo, plan.recv_counts, plan.send_counts,
                                             group, codec)
        stats.add_bytes(key + ".grad", plan.num_recv * row_bytes, plan.num_send * row_bytes)
    grad = grad_halo.new_zeros((num_inner, ) + tuple(grad_halo.shape[1:]))
    return grad.index_add_(0, plan.send_index, grad_send)


class HaloExchange(torch.autograd.Function):
    r"""Forward: every rank sends the inner rows its peers need and receives
    its halo rows, :math:`H_{\mathrm{halo}} = \mathrm{A2A}(H_{\mathrm{inner}}
    [\mathrm{send}])`. Backward: the halo gradients travel back to their
    owners, which add them into their inner gradients,
    :math:`\nabla H_{\mathrm{inner}} \mathrel{+}= \mathrm{scatter}(
    \mathrm{A2A}^{-1}(\nabla H_{\mathrm{halo}}), \mathrm{send})`.

    Both directions travel encoded by :obj:`codec` when one is given
    (:mod:`~pyg_dist.comm.compress`)."""

    @staticmethod
    def forward(ctx, x: Tensor, plan: HaloPlan, group, stats: Optional[CommStats],
                key: str, codec: Optional[RowCodec] = None) -> Tensor:
        ctx.plan, ctx.group, ctx.stats, ctx.key, ctx.codec = plan, group, stats, key, codec
        ctx.num_inner = x.size(0)
        return exchange_rows(x, plan, group, stats, key, codec)[0]

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        grad = return_grads(grad_halo, ctx.plan, ctx.num_inner, ctx.group, ctx.stats,
                            ctx.key, ctx.codec)
        return grad, None, None, None, None, None


def halo_exchange(x: Tensor, plan: HaloPlan, group=None,
                  stats: Optional[CommStats] = None, key: str = "",
                  codec: Optional[RowCodec] = None) -> Tensor:
    r"""Returns this rank's halo rows of the node-level tensor :obj:`x`
    (inner rows) that :obj:`plan` receives, differentiably. A world of one
    rank, or a plan that isolates the partitions, exchanges nothing."""
    if (plan.skip_exchange or not dist.is_initialized()
            or dist.get_world_size(group) == 1):
        return x.new_empty((0, ) + tuple(x.shape[1:]))
    return HaloExchange.apply(x, plan, group, stats, key, codec)


class _AwaitedExchange(torch.autograd.Function):
    r"""The end of a halo exchange started earlier (:func:`start_halo_exchange`):
    forward waits for the rows, backward is :class:`HaloExchange`'s."""

    @staticmethod
    def forward(ctx, x: Tensor, pending: Pending, plan: HaloPlan, group,
                stats: Optional[CommStats], key: str, codec: Optional[RowCodec]) -> Tensor:
        ctx.plan, ctx.group, ctx.stats, ctx.key, ctx.codec = plan, group, stats, key, codec
        ctx.num_inner = x.size(0)
        if stats is None:
            return pending.wait()
        with stats.timer("comm"):  # only the time the caller actually waits
            return pending.wait()

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        grad = return_grads(grad_halo, ctx.plan, ctx.num_inner, ctx.group, ctx.stats,
                            ctx.key, ctx.codec)
        return grad, None, None, None, None, None, None


def start_halo_exchange(x: Tensor, plan: HaloPlan, group=None,
                        stats: Optional[CommStats] = None, key: str = "",
                        codec: Optional[RowCodec] = None) -> Callable[[], Tensor]:
    r""":func:`halo_exchange` split in two: the rows leave now, and the
    returned function waits for this rank's halo rows (differentiably, as
    :func:`halo_exchange`), so the caller can compute in between."""
    with stats.timer("comm") if stats is not None else nullcontext():
        pending = start_exchange(x.detach().index_select(0, plan.send_index),
                                 plan.send_counts, plan.recv_counts, group, codec)
    if stats is not None:
        stats.add_bytes(key, plan.num_send * pending.row_bytes,
                        plan.num_recv * pending.row_bytes)
    return lambda: _AwaitedExchange.apply(x, pending, plan, group, stats, key, codec)
