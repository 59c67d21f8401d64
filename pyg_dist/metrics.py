"""Per-rank counters and timers: bytes exchanged, time waiting on
communication, peak memory."""
import resource
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Dict, Iterator

import torch


class CommStats:
    r"""Counts the bytes a rank sends per layer, the wall time it spends
    waiting on communication (halo exchange and gradient all-reduce) and
    other event counts (e.g. cache hits)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.bytes_sent: Dict[str, int] = defaultdict(int)
        self.bytes_recv: Dict[str, int] = defaultdict(int)
        self.time: Dict[str, float] = defaultdict(float)
        self.counts: Dict[str, float] = defaultdict(float)

    def add_bytes(self, key: str, sent: int, recv: int) -> None:
        self.bytes_sent[key] += sent
        self.bytes_recv[key] += recv

    def count(self, key: str, amount: float) -> None:
        self.counts[key] += amount

    def merge(self, other: "CommStats") -> None:
        r"""Adds every counter of :obj:`other` (e.g. one mini-batch's) to these."""
        for mine, theirs in ((self.bytes_sent, other.bytes_sent),
                             (self.bytes_recv, other.bytes_recv), (self.time, other.time),
                             (self.counts, other.counts)):
            for key, value in theirs.items():
                mine[key] += value

    @contextmanager
    def timer(self, key: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.time[key] += time.perf_counter() - start

    @property
    def total_bytes_sent(self) -> int:
        return sum(self.bytes_sent.values())

    @property
    def total_bytes_recv(self) -> int:
        return sum(self.bytes_recv.values())


def reset_peak_memory(device: torch.device = torch.device("cpu")) -> None:
    r"""Starts a new peak-memory window (e.g. per epoch): resets CUDA's peak
    allocation counter, or on Linux the process' resident-set high-water
    mark (``/proc/self/clear_refs``); elsewhere the peak stays the
    process-lifetime one."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory_bytes(device: torch.device = torch.device("cpu")) -> int:
    r"""Peak memory of this process since the last :func:`reset_peak_memory`:
    allocated GPU memory on CUDA, the resident set size (RSS) high-water
    mark on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
