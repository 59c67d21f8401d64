r"""Rows in flight: every exchange starts its transfers here and waits on
one handle, :class:`Transfer`.

Two shapes of transfer: an all-to-all of row blocks split by counts
(:func:`start_all_to_all`, the halo exchange and its gradients) and row
blocks to and from chosen peers (:func:`start_p2p`, the whole-block and ring
exchanges). On gloo both are point to point with every receive posted
before any send: gloo's ``all_to_all_single`` announces a rank's receive on
the same connection as its data, so ranks that arrive apart take turns on a
link instead of using both directions (measured on an emulated 1gbit link:
half the throughput). NCCL keeps its native collective.
"""
import math
from contextlib import ExitStack
from typing import Callable, Dict, List, Optional

import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm.compress import RowCodec
from pyg_dist.comm.stats import CommStats
from pyg_dist.utils.hugepages import empty_like_rows


def _timers(stats: Optional[CommStats], backward: bool) -> ExitStack:
    stack = ExitStack()
    if stats is not None:
        stack.enter_context(stats.timer("comm"))
        if backward:
            stack.enter_context(stats.timer("comm_backward"))
    return stack


class Transfer:
    r"""A transfer in flight: :meth:`wait` blocks until every row has
    arrived and returns them decoded (``None`` where nothing is received).
    With :obj:`stats`, the wait is timed as ``comm`` (and ``comm_backward``
    for gradients): only the time the caller actually waits."""

    def __init__(self, works: list, recv: Optional[Tensor],
                 decode: Callable[[Tensor], Tensor], row_bytes: int,
                 keep_alive: Optional[Tensor] = None, stats: Optional[CommStats] = None,
                 backward: bool = False) -> None:
        self.works, self.recv, self.decode = works, recv, decode
        self.row_bytes = row_bytes  # on the wire
        self.stats, self.backward = stats, backward
        self._send = keep_alive  # the send buffer must outlive the transfer

    def wait(self) -> Optional[Tensor]:
        with _timers(self.stats, self.backward):
            for work in self.works:
                work.wait()
        self.works, self._send = [], None
        return None if self.recv is None else self.decode(self.recv)


def start_p2p(sends: Dict[int, Tensor], recvs: Dict[int, Tensor], group) -> List:
    r"""Starts sending ``sends[q]`` to and receiving ``recvs[q]`` from each
    peer :math:`q` (ranks of :obj:`group`), every receive posted first;
    returns the works to wait on."""
    if not (sends or recvs):
        return []
    peer = (lambda q: q) if group is None else (lambda q: dist.get_global_rank(group, q))
    if dist.get_backend(group) == "gloo":
        works = [dist.irecv(buf, peer(q), group=group) for q, buf in recvs.items()]
        return works + [dist.isend(buf, peer(q), group=group) for q, buf in sends.items()]
    ops = [dist.P2POp(dist.irecv, buf, peer(q), group) for q, buf in recvs.items()]
    ops += [dist.P2POp(dist.isend, buf, peer(q), group) for q, buf in sends.items()]
    return dist.batch_isend_irecv(ops)


def p2p(sends: Dict[int, Tensor], recvs: Dict[int, Tensor], group) -> None:
    r"""Blocking :func:`start_p2p`."""
    for work in start_p2p(sends, recvs, group):
        work.wait()


def encode(x: Tensor, codec: Optional[RowCodec]) -> Tensor:
    return x.contiguous() if codec is None else codec.encode(x.flatten(1))


def decode(payload: Tensor, codec: Optional[RowCodec], like: Tensor) -> Tensor:
    r"""The rows of :obj:`payload` in the dtype and row shape of :obj:`like`."""
    if codec is None:
        return payload
    return codec.decode(payload, like.dtype).view((-1, ) + tuple(like.shape[1:]))


def wire_row(x: Tensor, codec: Optional[RowCodec]) -> Tensor:
    r"""An empty row as it travels (shape and dtype of the payload)."""
    return encode(x.new_zeros((1, ) + tuple(x.shape[1:])), codec)


def wire_row_bytes(x: Tensor, codec: Optional[RowCodec] = None) -> int:
    r"""The bytes one row of :obj:`x` takes on the wire."""
    wire = wire_row(x, codec)
    return wire.numel() * wire.element_size()


def _start_split(send: Tensor, send_counts: List[int], recv_counts: List[int], group,
                 recv: Optional[Tensor] = None):
    recv = empty_like_rows(send, sum(recv_counts)) if recv is None else recv
    send = send.contiguous()
    if dist.get_backend(group) != "gloo":
        work = dist.all_to_all_single(recv, send, output_split_sizes=recv_counts,
                                      input_split_sizes=send_counts, group=group,
                                      async_op=True)
        return recv, [work], send
    rank = dist.get_rank(group)
    ins, outs = recv.split(recv_counts), send.split(send_counts)
    ins[rank].copy_(outs[rank])
    works = start_p2p({q: outs[q] for q in range(len(outs)) if q != rank and send_counts[q]},
                      {q: ins[q] for q in range(len(ins)) if q != rank and recv_counts[q]},
                      group)
    return recv, works, send


def all_to_all(send: Tensor, send_counts: List[int], recv_counts: List[int],
               group=None) -> Tensor:
    r"""All-to-all of the rows of :obj:`send` (split sizes in rows) into a
    new tensor, blocking."""
    recv, works, _ = _start_split(send, send_counts, recv_counts, group)
    for work in works:
        work.wait()
    return recv


def start_all_to_all(rows: Tensor, send_counts: List[int], recv_counts: List[int],
                     group=None, codec: Optional[RowCodec] = None,
                     stats: Optional[CommStats] = None, key: str = "",
                     backward: bool = False, out: Optional[Tensor] = None) -> Transfer:
    r"""Starts the all-to-all of :obj:`rows` (encoded by :obj:`codec` on
    the wire) and returns at once: the transfer proceeds in the backend's
    own threads (gloo) or stream (NCCL) while the caller computes. With
    :obj:`stats`, the rows sent and received (not this rank's own share)
    are counted under :obj:`key` and the start and the wait are timed.
    Without :obj:`codec`, the rows may be received into :obj:`out` (a
    contiguous buffer of the received rows' shape). Every rank must start
    its transfers in the same order."""
    with _timers(stats, backward):
        payload = encode(rows, codec)
        recv, works, send = _start_split(payload, send_counts, recv_counts, group,
                                         out if codec is None else None)
    row_bytes = math.prod(payload.shape[1:]) * payload.element_size()
    if stats is not None:
        rank = dist.get_rank(group)
        stats.add_bytes(key, (sum(send_counts) - send_counts[rank]) * row_bytes,
                        (sum(recv_counts) - recv_counts[rank]) * row_bytes)
    return Transfer(works, recv, lambda out: decode(out, codec, rows), row_bytes, send,
                    stats, backward)
