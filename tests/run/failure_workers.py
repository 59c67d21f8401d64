"""Functions that run inside spawned ranks for tests/run/test_failures.py."""
import os
import time
import torch
import torch.distributed as dist
import pyg_dist
from tests.models import build_model


def die_mid_epoch(root: str, victim: int):
    r"""Trains; the victim rank exits abruptly after its first forward."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    model = pyg_dist.nn.distribute(build_model("GraphSAGE", part.num_features), part)
    for step in range(100):
        out = model(part.x, part.adj_t)
        if step == 1 and dist.get_rank() == victim:
            os._exit(3)
        out.sum().backward()
    return time.time()


def wrong_world_size(root: str):
    pyg_dist.DistData.load(root, dist.get_rank())


def stop_mid_epoch(root: str, victim: int):
    r"""Trains; the victim rank stops itself (SIGSTOP, as a hung device
    would look) after its first forward."""
    import signal
    part = pyg_dist.DistData.load(root, dist.get_rank())
    model = pyg_dist.nn.distribute(build_model("GraphSAGE", part.num_features), part)
    for step in range(100):
        out = model(part.x, part.adj_t)
        if step == 1 and dist.get_rank() == victim:
            os.kill(os.getpid(), signal.SIGSTOP)
        out.sum().backward()


def fail_beside_a_collective(how: str, mark: str):
    r"""Rank 1 fails as :obj:`how` says (``raise``: ``ValueError("boom")``;
    ``kill``: SIGKILL; ``stop``: SIGSTOP; ``sleep``: sleeps ten minutes)
    while rank 0 waits for it in an all-reduce. Each rank first writes the
    time it got there to ``{mark}.{rank}``."""
    import signal
    dist.barrier()  # both ranks are up
    with open(f"{mark}.{dist.get_rank()}", "w") as f:
        f.write(repr(time.time()))
    if dist.get_rank() == 1:
        if how == "raise":
            raise ValueError("boom")
        if how == "sleep":
            time.sleep(600)
        os.kill(os.getpid(), {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}[how])
    dist.all_reduce(torch.ones(1))


def run_without_free_ports(low: int, high: int, argv) -> int:
    r"""In a network namespace of its own (``unshare --net``, as root):
    narrows the ephemeral ports to ``low..high``, holds every one of them
    with a listening socket and runs :obj:`argv`; returns its exit status.
    Only this namespace's ports are touched."""
    import socket
    import subprocess
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
        f.write(f"{low} {high}")
    held = []
    for port in range(low, high + 1):
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen()
        held.append(s)
    return subprocess.run(argv).returncode
