r"""Naming the rank that was lost: every rank of a group bumps a counter in
the rendezvous store from a daemon thread, so that when a collective fails
the survivors can say which peer stopped beating (:func:`name_lost_ranks`)
instead of only which socket closed."""
import threading
import time
from datetime import timedelta
from typing import List, Optional

import torch.distributed as dist

class RankLostError(RuntimeError):
    r"""A collective failed because one or more peers are gone."""


class Heartbeat:
    r"""Every rank bumps a counter in the rendezvous store each
    :obj:`interval` seconds from a daemon thread, so that when a collective
    fails the survivors can say *which* rank was lost (:func:`lost_ranks`)
    instead of only which socket closed."""
    current: Optional["Heartbeat"] = None
    interval = 0.5
    timeout = 10.0  # seconds a store request may take
    silence = 4 * interval  # seconds without a beat before a rank counts as lost

    def __init__(self, host: str, port: int, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.store = dist.PrefixStore("pyg_dist/heartbeat", dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=self.timeout),
            wait_for_workers=False))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True,
                                       name="pyg_dist-heartbeat")
        self.thread.start()

    @classmethod
    def start(cls, host: str, port: int, rank: int, world_size: int) -> None:
        if cls.current is not None:
            cls.current.close()
        try:
            cls.current = cls(host, port, rank, world_size)
        except (RuntimeError, OSError):  # no store to talk to: fail as before, unnamed
            cls.current = None

    def _beat(self) -> None:
        while not self.stop.is_set():
            try:
                self.store.add(str(self.rank), 1)
            except Exception:  # the store's host is gone: lost_ranks reports it
                return
            self.stop.wait(self.interval)

    def close(self) -> None:
        r"""Stops the beats and waits for the thread (at most the store's
        timeout). A daemon thread still inside ``store.add`` (C++, without
        the GIL) when the interpreter exits is ended by CPython as it takes
        the GIL back, by an unwind through C++ frames that may abort the
        process ("terminate called without an active exception")."""
        self.stop.set()
        self.thread.join(self.timeout)

    def counts(self) -> List[int]:
        return [self.store.add(str(r), 0) for r in range(self.world_size)]


def lost_ranks(wait: float = Heartbeat.silence) -> Optional[List[int]]:
    r"""The ranks whose heartbeat stopped, watched for :obj:`wait` seconds
    (``[0]`` when the store itself is unreachable: rank 0 or its agent hosts
    it); ``None`` without a heartbeat."""
    beat = Heartbeat.current
    if beat is None:
        return None
    try:
        before = beat.counts()
        time.sleep(wait)
        after = beat.counts()
    except Exception:  # the store lives in rank 0's process (or its agent)
        return [0]
    return [r for r in range(beat.world_size) if r != beat.rank and after[r] == before[r]]


def name_lost_ranks(error: BaseException) -> BaseException:
    r""":obj:`error` of a failed collective, re-raised as a
    :class:`RankLostError` that names the ranks that are gone (if any)."""
    if not isinstance(error, RuntimeError) or isinstance(error, RankLostError):
        return error
    lost = lost_ranks()
    if not lost:
        return error
    which = ", ".join(map(str, lost))
    return RankLostError(f"lost rank{'s' if len(lost) > 1 else ''} {which} (no heartbeat "
                         f"for {Heartbeat.silence:.0f} s): {type(error).__name__}: "
                         f"{error}".rstrip())


def stop_heartbeat() -> None:
    beat, Heartbeat.current = Heartbeat.current, None
    if beat is not None:
        beat.close()
