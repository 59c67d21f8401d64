r"""A new partition is written beside the one it replaces and swapped in
only once complete, so that an interrupted or failed run (a signal, a full
disk, a bad file found half-way) leaves its root as it was.

:func:`staged` yields a staging folder inside the root
(``root/.partition-tmp``); the partition is written there, then moved in by
renames (the same filesystem: no copy), ``meta.json`` last. Until then the
old partition stays whole and loads; on any exception the staging folder
is removed. :func:`signals_interrupt` turns SIGTERM, SIGHUP and SIGINT
into :class:`Interrupted`, so that a signal unwinds through the same
clean-up.
"""
import errno
import os
import os.path as osp
import re
import shutil
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Sequence

from pyg_dist.partition.book import META_FILE

STAGING_DIR = ".partition-tmp"
OLD_DIR = ".partition-old"
# The entries of a root that belong to its partition (and go when a new one
# is swapped in): the index, the book, the part files and what is written
# next to them (the cohesive batches and their balanced parts, whose names
# pyg_dist.loader.cohesive owns, and the inductive train-node partition).
_PARTITION_ENTRY = re.compile(r"meta\.json|book\.pt|batches\.pt|batch_parts|train_graph|"
                              r"part_\d+(\.pt|_x\.npy|_edge_index\.npy)")
# Below this many free bytes (or without a free inode) a failed write is
# taken for a full disk: torch.save reports one as a RuntimeError.
_FULL_BYTES = 1 << 20
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    r"""A signal (:attr:`signum`) interrupted the work;
    :attr:`after_swap` names the root when it came during the swap,
    which then completed first."""

    def __init__(self, signum: int, after_swap: Optional[str] = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.after_swap = signum, after_swap


class NoSpaceError(OSError):
    r"""Too little disk space for a partition, found before any work (the
    estimate of what it writes) or by a write; one line."""

    def __init__(self, message: str, writing: bool = False) -> None:
        super().__init__(errno.ENOSPC, message)
        self.writing = writing  # found by a write (in staged), not by the estimate

    def __str__(self) -> str:
        return self.strerror


_state = {"holding": False, "pending": None}


@contextmanager
def signals_interrupt(signums: Sequence[int] = SIGNALS) -> Iterator[None]:
    r"""Within the block, :obj:`signums` raise :class:`Interrupted` (in
    the main thread, at its next Python instruction; a swap under way
    completes first); elsewhere than in the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame) -> None:
        if _state["holding"]:
            _state["pending"] = signum
        else:
            raise Interrupted(signum)

    previous = {s: signal.signal(s, interrupt) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def staged(root: str) -> Iterator[str]:
    r"""Yields an empty staging folder inside :obj:`root` (created if
    missing) to write a whole partition into. When the block completes,
    the partition already in :obj:`root` (:func:`partition_entries`) is
    replaced by the staged one, by renames, ``meta.json`` last: a run
    killed outright (SIGKILL) leaves either partition whole, or, between
    two renames, none that loads, never a mix. When the block raises, the
    staging folder is removed and :obj:`root` is left as it was; a write
    that found the disk full is raised as :class:`NoSpaceError`."""
    os.makedirs(root, exist_ok=True)
    stage = osp.join(root, STAGING_DIR)
    for leftover in (stage, osp.join(root, OLD_DIR)):  # of a run killed outright
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        # made inside the try: a signal the moment it exists still removes it
        os.makedirs(stage)
        yield stage
    except BaseException as e:
        if isinstance(e, NoSpaceError) and e.writing:  # a staging inside this one: name root
            full, e = True, e.__cause__ or e
        else:
            full = not isinstance(e, (NoSpaceError, KeyboardInterrupt)) and (
                getattr(e, "errno", None) == errno.ENOSPC or _disk_full(stage))
        with _signals_held():  # a second signal does not cut the clean-up short
            shutil.rmtree(stage, ignore_errors=True)
        if isinstance(e, Interrupted):
            e.after_swap = None  # a swap into this staging folder is undone
        if full:
            raise NoSpaceError(f"no space left on the device of '{root}' while writing "
                               f"the partition; the new files were removed and '{root}' "
                               f"is left as it was", writing=True) from e
        raise
    _swap(stage, root)


def partition_entries(root: str) -> List[str]:
    r"""The entries of :obj:`root` that belong to a partition (see
    :data:`_PARTITION_ENTRY`); other files there are never touched."""
    return sorted(n for n in os.listdir(root) if _PARTITION_ENTRY.fullmatch(n))


def _swap(stage: str, root: str) -> None:
    r"""Moves the partition in :obj:`root` aside and the staged one in,
    with the signals of :func:`signals_interrupt` held until it is done."""
    if not osp.exists(osp.join(stage, META_FILE)):
        raise RuntimeError(f"'{stage}' holds no {META_FILE}: nothing complete to swap in")
    old = osp.join(root, OLD_DIR)
    with _signals_held() as pending:
        os.makedirs(old)
        # The old index first: from here until the new one is in, the root
        # holds no partition that loads rather than a mix of two.
        for name in sorted(partition_entries(root), key=lambda n: n != META_FILE):
            os.replace(osp.join(root, name), osp.join(old, name))
        for name in sorted(os.listdir(stage), key=lambda n: n == META_FILE):
            os.replace(osp.join(stage, name), osp.join(root, name))
        os.rmdir(stage)
        shutil.rmtree(old, ignore_errors=True)
    if pending:
        raise Interrupted(pending[0], after_swap=root)


@contextmanager
def signals_deferred() -> Iterator[None]:
    r"""Within the block, the signals of :func:`signals_interrupt` wait: the
    first that came raises :class:`Interrupted` when the block is done (for
    what a signal must not cut short, e.g. a progress bar's constructor,
    whose half-built bar would fail when collected)."""
    with _signals_held() as pending:
        yield
    if pending:
        raise Interrupted(pending[0])


@contextmanager
def progress_bar(**kwargs: Any) -> Iterator[Any]:
    r"""A tqdm bar (:obj:`kwargs`) built whole and closed however the block
    ends, so that an interruption's message is the last line (a bar left
    open, or half-built by a signal, is drawn again when collected)."""
    from tqdm import tqdm
    bar = None
    try:
        with signals_deferred():
            bar = tqdm(**kwargs)
        yield bar
    finally:
        if bar is not None:
            with _signals_held():
                bar.close()


@contextmanager
def _signals_held() -> Iterator[List[int]]:
    r"""Within the block, the signals of :func:`signals_interrupt` are
    recorded (in the list yielded) instead of raised."""
    outer, _state["holding"] = _state["holding"], True
    pending: List[int] = []
    try:
        yield pending
    finally:
        _state["holding"] = outer
        if not outer:
            if _state["pending"] is not None:
                pending.append(_state["pending"])
            _state["pending"] = None


def _disk_full(path: str) -> bool:
    r"""Whether the filesystem of :obj:`path` has (almost) no free bytes
    or no free inodes."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < _FULL_BYTES or (st.f_files > 0 and st.f_favail == 0)


def check_free_space(need: int, root: str, what: str) -> None:
    r"""Refuses (:class:`NoSpaceError`, one line naming both) :obj:`need`
    bytes for :obj:`what` beyond the free space of the filesystem
    :obj:`root` is (or will be created) on."""
    path = osp.abspath(root)
    while not osp.exists(path):
        path = osp.dirname(path)
    free = shutil.disk_usage(path).free
    if need > free:
        raise NoSpaceError(f"{what} needs up to {need:,} bytes ({_readable(need)}) on the "
                           f"device of '{root}', which has {free:,} free ({_readable(free)})")


def _readable(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"
