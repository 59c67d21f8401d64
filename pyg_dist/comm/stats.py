r"""Per-rank counters and timers of what a rank exchanges: bytes per key,
time waiting on communication, event counts."""
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Dict, Iterator


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
