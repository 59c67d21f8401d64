"""Per-rank counters and timers: bytes exchanged, time waiting on
communication, peak memory."""
import resource
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Dict, Iterator

import torch


class CommStats:
    r"""Counts the bytes a rank sends per layer and the wall time it spends
    inside collectives (halo exchange and gradient all-reduce)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.bytes_sent: Dict[str, int] = defaultdict(int)
        self.bytes_recv: Dict[str, int] = defaultdict(int)
        self.time: Dict[str, float] = defaultdict(float)

    def add_bytes(self, key: str, sent: int, recv: int) -> None:
        self.bytes_sent[key] += sent
        self.bytes_recv[key] += recv

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


def peak_memory_bytes(device: torch.device = torch.device("cpu")) -> int:
    r"""Peak memory of this process: allocated GPU memory on CUDA, the peak
    resident set size (RSS) of the process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
