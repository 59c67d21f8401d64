r"""The whole-block exchange of CAGNET's 1-D algorithm (and SANCUS's
broadcasts): every rank's block of rows reaches every other rank, and the
gradients of the halo rows return to their owners as whole blocks.

With :math:`P` ranks and rank :math:`j` owning the block :math:`H_j`
(its :math:`n_j` inner rows), a layer's forward gives every rank every
other block, :math:`\{H_j\}_{j \ne i}`, and rank :math:`i` takes its halo
rows from them. The backward sends rank :math:`i`'s dense gradient of each
block, :math:`\nabla_i H_j` (zero where :math:`i` has no halo row of
:math:`j`), to :math:`j`, which adds them up:
:math:`\nabla H_j = \sum_{i \ne j} \nabla_i H_j` (a reduce per block).
Per layer, rank :math:`i` sends :math:`(P - 1)\, n_i` rows forward and
:math:`\sum_{j \ne i} n_j` rows backward, whatever its halo is: that is
what the 1-D algorithm moves (the halo exchange of
:mod:`~pyg_dist.comm.halo` moves only the halo rows).

The blocks travel point to point, every receive posted before any send, all
peers at once (a direct one-to-all broadcast per rank): on gloo over
loopback with 4 ranks this took 29 ms for 5 MB blocks where sequential
``broadcast`` calls took 30 ms and a ring ``all_gather`` 110 ms, and it
lets a rank skip its broadcast (SANCUS) without padding the others.
"""
from contextlib import nullcontext
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm.compress import RowCodec
from pyg_dist.comm.exchange import Exchange
from pyg_dist.comm.plan import HaloPlan
from pyg_dist.comm.stats import CommStats
from pyg_dist.comm.transfer import decode, encode, p2p, wire_row


def block_sizes(data) -> List[int]:
    r"""Inner rows of every rank (the sizes of the blocks)."""
    return data.partptr.diff().tolist()


def halo_ranges(data) -> List[slice]:
    r"""Per owner, its rows in this rank's halo block (halo rows are
    grouped by owner in rank order)."""
    ends = data.recv_counts.cumsum(0).tolist()
    return [slice(end - count, end) for end, count in zip(ends, data.recv_counts.tolist())]


def broadcast_blocks(x: Tensor, sources: Sequence[bool], sizes: Sequence[int], group,
                     stats: Optional[CommStats], key: str,
                     codec: Optional[RowCodec] = None) -> Dict[int, Tensor]:
    r"""Every rank :math:`q` with ``sources[q]`` sends its block :obj:`x`
    (``sizes[q]`` rows) to every other rank; returns the received blocks
    by rank (this rank's own is not in it). Without autograd; timed and
    counted (the bytes that travelled) under :obj:`key`."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    wire = wire_row(x, codec)
    recvs = {q: wire.new_empty((sizes[q], ) + tuple(wire.shape[1:]))
             for q in range(world) if q != rank and sources[q]}
    sends = {}
    if sources[rank]:
        payload = encode(x.detach(), codec)
        sends = {q: payload for q in range(world) if q != rank}
    with stats.timer("comm") if stats is not None else nullcontext():
        p2p(sends, recvs, group)
    if stats is not None:
        row_bytes = wire.numel() * wire.element_size()
        stats.add_bytes(key, len(sends) * sizes[rank] * row_bytes,
                        sum(sizes[q] for q in recvs) * row_bytes)
    return {q: decode(buf, codec, x) for q, buf in recvs.items()}


def reduce_blocks(grad_halo: Tensor, data, group, stats: Optional[CommStats], key: str,
                  codec: Optional[RowCodec] = None) -> Tensor:
    r"""The backward of :func:`broadcast_blocks` for the full halo:
    :obj:`grad_halo` (one row per halo row) becomes a dense gradient of
    every peer's block, sent to that peer, and this rank returns the sum of
    the blocks it receives, the gradient of its own inner rows."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    sizes, ranges = block_sizes(data), halo_ranges(data)
    remote = data.halo_remote_id.to(grad_halo.device)
    shape = tuple(grad_halo.shape[1:])
    sends = {}
    for q in range(world):
        if q == rank:
            continue
        dense = grad_halo.new_zeros((sizes[q], ) + shape)
        dense.index_add_(0, remote[ranges[q]], grad_halo[ranges[q]])
        sends[q] = encode(dense, codec)
    wire = wire_row(grad_halo, codec)
    recvs = {q: wire.new_empty((sizes[rank], ) + tuple(wire.shape[1:]))
             for q in range(world) if q != rank}
    if stats is None:
        p2p(sends, recvs, group)
    else:
        with stats.timer("comm"), stats.timer("comm_backward"):
            p2p(sends, recvs, group)
        row_bytes = wire.numel() * wire.element_size()
        stats.add_bytes(key + ".grad", sum(sizes[q] for q in sends) * row_bytes,
                        len(recvs) * sizes[rank] * row_bytes)
    grad = grad_halo.new_zeros((sizes[rank], ) + shape)
    for q in sorted(recvs):  # in rank order: the same sum on every run
        grad += decode(recvs[q], codec, grad_halo)
    return grad


def halo_of_blocks(blocks: Dict[int, Tensor], data, out: Tensor,
                   owners: Optional[Sequence[int]] = None) -> None:
    r"""Writes into :obj:`out` (one row per halo row) the halo rows of the
    received :obj:`blocks` (of :obj:`owners`, default all of them)."""
    ranges = halo_ranges(data)
    remote = data.halo_remote_id.to(out.device)
    for q in (blocks if owners is None else owners):
        out[ranges[q]] = blocks[q].index_select(0, remote[ranges[q]]).to(out.dtype)


class BlockBroadcast(torch.autograd.Function):
    r"""Forward: every rank's block :math:`H_j` reaches every other rank,
    which takes its halo rows from it. Backward: the dense gradients of
    every block return to its owner and add up there (see the module)."""

    @staticmethod
    def forward(ctx, x: Tensor, data, group, stats: Optional[CommStats], key: str,
                codec: Optional[RowCodec] = None) -> Tensor:
        ctx.data, ctx.group, ctx.stats, ctx.key, ctx.codec = data, group, stats, key, codec
        world = dist.get_world_size(group)
        blocks = broadcast_blocks(x, [True] * world, block_sizes(data), group, stats, key,
                                  codec)
        out = x.new_empty((data.num_halo, ) + tuple(x.shape[1:]))
        halo_of_blocks(blocks, data, out)
        return out

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        grad = reduce_blocks(grad_halo.contiguous(), ctx.data, ctx.group, ctx.stats, ctx.key,
                             ctx.codec)
        return grad, None, None, None, None, None


def require_full_plan(plan: HaloPlan, data) -> None:
    r"""Refuses a plan the whole-block exchange cannot serve: it moves
    whole blocks and fills the whole halo of the rank's partition."""
    if not plan.is_exact or plan.data is not data or plan.trim_input:
        raise ValueError("The broadcast exchange moves whole blocks and serves the whole "
                         "halo of the rank's partition: it runs on the exact full-graph "
                         "plan only (no halo sampler, no mini-batch loader; use "
                         "exchange='halo' for those)")


def block_exchange(x: Tensor, plan: HaloPlan, data, group=None,
                   stats: Optional[CommStats] = None, key: str = "",
                   codec: Optional[RowCodec] = None) -> Tensor:
    r"""The halo rows of :obj:`x` (the inner rows of partition
    :obj:`data`) on its exact plan, by the whole-block exchange,
    differentiably (the counterpart of :func:`~pyg_dist.comm.halo.halo_exchange`:
    the same rows, other bytes)."""
    require_full_plan(plan, data)
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return x.new_empty((0, ) + tuple(x.shape[1:]))
    return BlockBroadcast.apply(x, data, group, stats, key, codec)


class Broadcast(Exchange):
    r"""CAGNET's 1-D algorithm: every rank's whole block of inner rows
    reaches every other rank, and the gradients return to the owners as
    whole blocks (see the module). On the exact full-graph plan only; stale
    caches that refresh whole blocks (SANCUS's skip-broadcast) run on it."""
    name = "broadcast"
    summary = ("moves every rank's whole block on the exact full-graph plan (CAGNET's 1-D "
               "algorithm)")
    sampled_plans = False
    minibatch = False
    feature_cache = False
    whole_blocks = True

    def fetch(self, ctx, key: str, x: Tensor, plan: HaloPlan,
              codec: Optional[RowCodec]) -> Tensor:
        return block_exchange(x, plan, ctx.data, ctx.group, ctx.stats, key, codec)
