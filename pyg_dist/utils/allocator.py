r"""glibc malloc's bytes in use (a rank's live memory on CPU, where torch
keeps no allocator statistics), read cheaply, and their peak over a window.

What the resident set size (RSS) of a CPU rank holds beyond them, measured
on ``pyg-dist train`` defaults, 4 METIS parts of ``reddit-shaped`` (20,000
nodes) and R-MAT (scale 16), exact and BNS, 2 loaded cores (issue 35):

* **glibc's main heap** (``[heap]`` in ``/proc/self/smaps``; the per-thread
  arenas do not grow, so ``M_ARENA_MAX`` changes nothing): a step allocates
  about 180 MiB in chunks of 64 KiB to 8 MiB (halo rows, and edge-level
  index tensors of the CSR aggregation's backward, which sorts the
  adjacency's transpose anew in every step), 3.5 times its live peak. After
  the first large chunk is freed, glibc's dynamic mmap threshold rises to
  32 MiB and every later chunk comes from the heap, where the step's
  allocation order leaves holes: the heap ends 25-40 MiB above the live
  peak, and never shrinks (its top is pinned). ``malloc_trim(0)`` at epoch
  ends does not lower the next epoch's peak (the step re-touches the holes).
* **code pages** of libtorch (about 11 MiB per rank) first executed by the
  first step, after the baseline.
* **the partition's memory-mapped file** (its features, about 11 MiB per
  rank on reddit-shaped) first read by the first step: training pre-reads it
  before the baseline, which is documented to hold the partition.

A fixed mmap threshold (``mallopt(M_MMAP_THRESHOLD, 64 KiB)``, as
``MALLOC_MMAP_THRESHOLD_=65536``) gives every such chunk its own mapping,
returned on free: RSS above baseline falls to 1.1-1.3 times the live peak,
but every step page-faults its 180 MiB anew (55,000-88,000 minor faults per
epoch and rank against about 50, +0.1-0.2 s of system time per epoch and
rank on 0.3 s of user time). Thresholds of 1 or 4 MiB fault nearly as much
and keep most of the holes. No malloc setting gives both, so none is applied.
What is applied instead: the aggregation keeps a reused adjacency's
transpose (:mod:`pyg_dist.utils.aggregate`: the edge-sized buffers are no
longer allocated per step; exact training's live peak above baseline fell
from 50 to 25 MiB on reddit-shaped, 96 to 60 on R-MAT), and training calls
:func:`release_free_memory` at an epoch's start, so the holes of the
first steps and of evaluation leave the resident set. RSS above baseline
then fell from 100 to 65 MiB (reddit-shaped) and 162 to 127 MiB (R-MAT),
still 2.1-2.6 times the live peak: libtorch's code pages and the heap's
holes within one step (``benchmarks/memory.py``,
``benchmarks/results/memory.json``).

No malloc setting alone reaches 1.25 times the live peak: with every chunk
above 64 KiB mapped on its own, RSS above baseline was still 1.44 times it
(41.8 against 29.0 MiB, reddit-shaped, exact, 4 parts; 2026-11-27, by
hand, two alternated rounds), the code pages the first step runs being
most of the difference. ``THP_MEM_ALLOC_ENABLE=1`` (torch maps its buffers
of 2 MiB and more on huge pages) with a 256 KiB threshold gave the same
1.44, and with a 2 MiB threshold 2.0; their epoch times were within that
day's noise of the default's. Alternated over three rounds later that day
(``--malloc compact``, :func:`follow_live_memory`: a 256 KiB threshold with
huge pages), the time cost was clear: 1.16-1.29 times the default's epoch;
after a step's allocations were cut by a quarter, 1.03-1.30 times the
default's epoch over three more runs (``benchmarks/results/memory_compact*.json``).
Of the 42 MiB, 13 MiB are machine code (:func:`code_resident_bytes`,
``code_mem_*``): less that code, RSS above baseline is the live peak.
"""
import ctypes
import ctypes.util
import os
import re
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, List, Optional


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def c_library() -> Optional[ctypes.CDLL]:
    r"""This process' C library on Linux, else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _glibc() -> Optional[ctypes.CDLL]:
    r"""This process' C library if it is glibc with ``mallinfo2`` (2.33+),
    else ``None`` (macOS, Windows, musl)."""
    libc = c_library()
    if libc is None:
        return None
    try:
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.mallinfo2.restype = _Mallinfo2
        libc.malloc_trim.argtypes = (ctypes.c_size_t, )
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    except AttributeError:
        return None
    return libc


_LIBC = _glibc()


def malloc_in_use() -> Optional[int]:
    r"""Bytes glibc's malloc has handed out and not taken back, over all its
    arenas: ``mallinfo2().uordblks`` (chunks in use in the heaps, chunk
    headers included) plus ``hblkhd`` (chunks mmapped on their own).
    Every CPU tensor's storage, numpy array and C++ buffer (gloo's, the
    autograd graph's) is in it; CPython's small objects (its own arenas)
    and memory mapped files are not. ``None`` where the C library is not
    glibc. Costs about a microsecond per arena."""
    if _LIBC is None:
        return None
    info = _LIBC.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def release_free_memory() -> None:
    r"""Returns the free pages of glibc's heaps to the system
    (``malloc_trim(0)``: whole free pages anywhere in the heaps, not only
    at their top); nothing without glibc. Called by training at an epoch's
    start, it takes the holes earlier steps and the evaluation left out of
    the resident set, so an epoch's peak RSS follows its own steps
    (measured: see the module). Training calls it at the first two epochs'
    starts, after an evaluation, and while the steps do not fault most of
    what it released back in: released pages the steps touch again cost a
    page fault each and lower no peak. On 4 METIS parts of
    ``reddit-shaped``, exact, the steps faulted back in all of the 33-47 MB
    released at the second epoch's start. Releasing only then, against at
    every epoch (``benchmarks/memory.py``, exact and BNS on
    ``reddit-shaped`` and R-MAT, two alternated rounds, 2026-11-27): epochs
    0.76-0.90 times as long, peaks above baseline 2-7 MiB higher."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class PeakSampler:
    r"""The peak of :func:`malloc_in_use` over a window: sampled every
    :obj:`interval` seconds by a daemon thread (which holds the GIL only for
    the read: a tensor operation of the training thread releases it), and
    at every :meth:`sample` call (the points where peaks happen, e.g. after
    a forward pass). A peak shorter than :obj:`interval` between two
    :meth:`sample` calls may be missed: the figure is a lower bound.
    Inactive (all ``None``) where :func:`malloc_in_use` is.

    Every read walks each arena's free lists under its lock (36 us median
    on a training rank's fragmented heap, measured), and the training
    thread's ``malloc`` waits for those locks: at 2 ms the thread used 7% of
    a core beside neighbour-loader training (1.44 s of CPU in 20 s), at
    10 ms still 2.6% (its CPU ticks against the training thread's, read from
    ``/proc``) and at 50 ms 0.8% of the rank's CPU (``perf``: reads of up to
    0.4 ms on that heap), so it reads every 100 ms. A step's peak is at the
    end of its forward, which :meth:`sample` is called for."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.peak: Optional[int] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if malloc_in_use() is not None:
            self.reset()
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="pyg_dist-live-memory")
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> Optional[int]:
        r"""Takes a sample now; returns it."""
        now = malloc_in_use()
        if now is not None and (self.peak is None or now > self.peak):
            self.peak = now  # a race with the thread loses a sample, never a peak for long
        return now

    def reset(self) -> Optional[int]:
        r"""Starts a new window at the current value; returns it."""
        self.peak = malloc_in_use()
        return self.peak

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


_EXECUTABLE_RSS = re.compile(rb"^(?:[0-9a-f]+-[0-9a-f]+ ..(.)|Rss: +(\d+))", re.M)


def code_resident_bytes() -> Optional[int]:
    r"""Resident bytes of this process' executable mappings (the machine
    code of the interpreter and the libraries: libtorch's kernels are paged
    in as they first run), from ``/proc/self/smaps``; ``None`` where it
    cannot be read. File-backed and shared by every process that maps the
    same library, so they do not grow with the graph. Reads take about
    10 ms (the kernel walks every mapping)."""
    try:
        with open("/proc/self/smaps", "rb") as f:
            text = f.read()
    except OSError:
        return None
    total, executable = 0, False
    for perms, rss in _EXECUTABLE_RSS.findall(text):
        if perms:
            executable = perms == b"x"
        elif executable:
            total += int(rss)
    return total * 1024


#: The ranks' allocator settings (``TrainConfig.malloc``), the default first.
MALLOC_MODES = ("reuse", "system", "compact")
#: In ``compact`` mode glibc maps every chunk from this size on by itself.
MMAP_THRESHOLD = 256 * 2**10
#: In ``reuse`` mode every chunk under this size comes from the heap: the
#: largest threshold glibc's own adjustment reaches on 64-bit systems.
REUSE_MMAP_THRESHOLD = 32 * 2**20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_NEVER = 2**31 - 1  # mallopt's largest value: the heap's top is never trimmed on free
THP_ENV = "THP_MEM_ALLOC_ENABLE"


@contextmanager
def torch_huge_pages_for_new_processes() -> Iterator[None]:
    r"""Inside, processes this one starts (ranks, and the forkserver they
    fork from) have torch advise transparent huge pages for its CPU buffers
    of 2 MiB and more: torch reads ``THP_MEM_ALLOC_ENABLE`` once, at its
    first such buffer, so a launcher sets it before the ranks start. A value
    the user set is kept; the environment is restored after."""
    if THP_ENV in os.environ:
        yield
        return
    os.environ[THP_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(THP_ENV, None)


def reuse_freed_memory() -> Optional[bool]:
    r"""``reuse`` mode (the default), for this process: glibc keeps what a
    step frees for the next step. By default it returns the free top of its
    heap to the system once that exceeds twice its (adjusting) mmap
    threshold, and training steps free their large buffers at the heap's
    top: the next step grows the heap again and faults every page in anew
    (the kernel zeroes each). Here the top is trimmed only by
    :func:`release_free_memory`, and every chunk under
    :data:`REUSE_MMAP_THRESHOLD` comes from the heap from the start (as
    glibc's own threshold ends up after the first large buffers are freed).
    The resident set between steps stays at the peak it reached, which the
    peak RSS counts anyway.

    Measured: ``reddit_shaped``, 2 METIS parts, neighbour loader, a rank
    faulted in about 35,000 pages a second with glibc's defaults (read from
    ``/proc``); ``pyg-dist train``, 7 epochs, median of epochs 2-7,
    alternated: 2.80 and 2.91 against 3.01 and 3.09 s/epoch, peak RSS above
    baseline 283 and 294 against 307 and 299 MiB. Returns whether glibc
    took both settings; ``None``, doing nothing, without glibc."""
    if _LIBC is None:
        return None
    return bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, REUSE_MMAP_THRESHOLD)
                and _LIBC.mallopt(_M_TRIM_THRESHOLD, _NEVER))


def follow_live_memory() -> Optional[bool]:
    r"""``compact`` mode, for this process: glibc maps every chunk of
    :data:`MMAP_THRESHOLD` or more by itself and unmaps it when freed, so a
    freed buffer leaves no hole in the heap and resident memory follows live
    memory; torch's buffers of 2 MiB and more get huge pages (where
    ``THP_MEM_ALLOC_ENABLE`` came before torch's first large buffer:
    :func:`torch_huge_pages_for_new_processes`), faulting in 2 MiB at a time.

    Measured (``benchmarks/memory.py``, BENCHMARKS.md, 4 ranks on 2 cores,
    exact and BNS on ``reddit-shaped`` and R-MAT): the RSS peak above the
    baseline, less the machine code paged in since, came to 0.98-1.02 times
    the live peak (``system``: 1.45-1.84), but every step faults its
    buffers in anew (the kernel zeroes them): 1.03-1.30 times the
    default's epoch time over three runs, which is why it is not the
    default.

    Returns whether torch's huge pages are on: ``False`` where the kernel
    has none, or where torch allocated its first large buffer before the
    setting (e.g. a rank that imported PyG first), and the threshold then
    costs 4 KiB faults; ``None``, doing nothing, without glibc."""
    if _LIBC is None:
        return None
    os.environ.setdefault(THP_ENV, "1")  # for this process' torch, if not too late
    _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    return _torch_advises_huge_pages()


def _torch_advises_huge_pages() -> bool:
    r"""Whether a new 2 MiB torch buffer lies in a mapping advised for huge
    pages (``hg`` in its ``VmFlags``)."""
    import torch
    probe = torch.empty(2**21, dtype=torch.uint8)
    return "hg" in (vm_flags(probe.data_ptr()) or [])


def vm_flags(address: int) -> Optional[List[str]]:
    r"""The ``VmFlags`` (``/proc/self/smaps``, e.g. ``hg``: advised for huge
    pages) of this process' mapping that holds :obj:`address`; ``None``
    where no mapping holds it or smaps cannot be read."""
    inside = False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and not head.endswith(":"):
                    low, high = (int(v, 16) for v in head.split("-"))
                    inside = low <= address < high
                elif inside and line.startswith("VmFlags:"):
                    return line.split()[1:]
    except OSError:
        pass
    return None
