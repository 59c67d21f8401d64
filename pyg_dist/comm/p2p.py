"""Point-to-point transfers of encoded row blocks, the transport of the
whole-block (:mod:`~pyg_dist.comm.broadcast`) and ring
(:mod:`~pyg_dist.comm.ring`) exchanges."""
from typing import Dict, List, Optional

import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm.compress import RowCodec


def start_p2p(sends: Dict[int, Tensor], recvs: Dict[int, Tensor], group) -> List:
    r"""Starts sending ``sends[q]`` to and receiving ``recvs[q]`` from each
    peer :math:`q` (ranks of :obj:`group`), every receive posted first;
    returns the works to wait on."""
    peer = (lambda q: q) if group is None else (lambda q: dist.get_global_rank(group, q))
    if dist.get_backend(group) == "gloo":
        works = [dist.irecv(buf, peer(q), group=group) for q, buf in recvs.items()]
        return works + [dist.isend(buf, peer(q), group=group) for q, buf in sends.items()]
    ops = [dist.P2POp(dist.irecv, buf, peer(q), group) for q, buf in recvs.items()]
    ops += [dist.P2POp(dist.isend, buf, peer(q), group) for q, buf in sends.items()]
    return dist.batch_isend_irecv(ops) if ops else []


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
