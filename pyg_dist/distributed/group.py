r"""The process group: its set-up (from torchrun's environment, explicit
arguments or a world of one), the device a rank computes on, a free port
for a rendezvous, and the few collectives over every rank that metrics and
loaders share. Setting up a group of more than one rank also starts its
heartbeat (:mod:`~pyg_dist.distributed.heartbeat`), so that a lost rank is
named rather than only a closed socket."""
import os
import socket
from datetime import timedelta
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.distributed.heartbeat import Heartbeat

DEFAULT_TIMEOUT = 300.0  # seconds a collective may wait for a peer


def under_torchrun() -> bool:
    r"""Whether this process is a rank torchrun (or a launcher like it)
    started: its ``RANK`` and ``WORLD_SIZE`` are in the environment."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init(backend: Optional[str] = None, init_method: Optional[str] = None,
         rank: Optional[int] = None, world_size: Optional[int] = None,
         timeout: float = DEFAULT_TIMEOUT) -> int:
    r"""Creates the default process group unless one exists, and returns
    this process' rank.

    Without arguments it reads torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); a single process with
    no such environment becomes a world of one. The backend defaults to NCCL
    when CUDA is available (each process then uses GPU ``LOCAL_RANK``) and
    gloo otherwise. :obj:`timeout` bounds how long any collective waits for a
    peer, so a dead rank makes the others raise instead of hanging.
    """
    if dist.is_initialized():
        return dist.get_rank()
    backend = backend or default_backend()
    if init_method is None and "MASTER_ADDR" not in os.environ and world_size in (None, 1):
        init_method = f"tcp://127.0.0.1:{free_port()}"
        rank, world_size = 0, 1
    elif init_method is None:  # torchrun's environment (torch 2.13 wants rank and size)
        init_method = "env://"
        rank = int(os.environ["RANK"]) if rank is None else rank
        world_size = int(os.environ["WORLD_SIZE"]) if world_size is None else world_size
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout))
    if dist.get_world_size() > 1:
        host, port = _store_address(init_method)
        Heartbeat.start(host, port, dist.get_rank(), dist.get_world_size())
    return dist.get_rank()


def _store_address(init_method: str) -> Tuple[str, int]:
    if init_method.startswith("tcp://"):
        host, port = init_method[len("tcp://"):].rsplit(":", 1)
        return host.strip("[]"), int(port)
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


def device() -> torch.device:
    r"""The device this rank computes on: its local GPU under NCCL, else CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class NoFreePortError(RuntimeError):
    r"""No TCP port is free for the ranks' rendezvous."""


def free_port() -> int:
    r"""A TCP port of 127.0.0.1 that no socket holds now, picked by the
    kernel from its ephemeral range; :class:`NoFreePortError` in one line
    naming the range when every port of it is taken."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 0))
        except OSError as e:
            raise NoFreePortError(
                f"no free TCP port on 127.0.0.1 for the ranks' rendezvous: {_port_range()} "
                f"({e.strerror or e}); end what holds them or widen the range") from None
        return s.getsockname()[1]


def _port_range() -> str:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = f.read().split()
        return f"ports {low}-{high} (net.ipv4.ip_local_port_range) are all taken"
    except (OSError, ValueError):  # not Linux
        return "the ephemeral ports are all taken"


def new_gloo_group():
    r"""A new gloo group of every rank (CPU collectives, also beside an NCCL
    world, and traffic apart from the default group's), with the default
    group's timeout so a dead peer fails it as fast."""
    timeout = timedelta(seconds=DEFAULT_TIMEOUT)
    try:
        device = torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")
        timeout = dist.group.WORLD._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):  # private API: keep the default
        pass
    return dist.new_group(backend="gloo", timeout=timeout)


def sum_over_ranks(t: Tensor) -> Tensor:
    r"""In-place sum of :obj:`t` over the default group's ranks."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


def gather_over_ranks(value: float, device: Optional[torch.device] = None) -> List[float]:
    r"""Every rank's :obj:`value`, in rank order (a collective)."""
    t = torch.tensor([float(value)], dtype=torch.double, device=device)
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [float(t)]
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(v) for v in out]


def max_over_ranks(t: Tensor, group=None) -> Tensor:
    r"""In-place maximum of :obj:`t` over the ranks of :obj:`group` (default:
    the default group)."""
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t
