r"""glibc malloc's bytes in use (a rank's live memory on CPU, where torch
keeps no allocator statistics), read cheaply, and their peak over a window;
the ranks' allocator settings (``TrainConfig.malloc``).

What a CPU rank's resident set (RSS) holds beyond its live memory:

* **libtorch's machine code** first run after the baseline (about 11-13
  MiB a rank, shared by the machine's processes, independent of the graph):
  reported as ``code_mem_*`` (:func:`code_resident_bytes`).
* **free memory in glibc's heap.** A step allocates several times its live
  peak in buffers of 64 KiB to tens of MiB and frees them; glibc places
  each in a free piece of the heap that fits. Three things keep that free
  space from following live memory:

  - glibc returns the heap's free top to the system once it exceeds its
    trim threshold, and the next step faults it in again (the kernel
    zeroes every page): ``reuse`` mode keeps it (:func:`reuse_freed_memory`);
  - glibc's per-thread cache holds up to 7 freed chunks of each size under
    1 KiB, counted as in use: small chunks a step frees stay cached between
    its freed buffers, which then do not merge, so the next step's buffers
    do not fit and the heap grows (measured on 2 random parts of R-MAT,
    scale 15, hidden 256: 384 to 574 MiB over 5 epochs with 144 MiB in
    use). The ranks of ``reuse`` and ``compact`` start with it off
    (:func:`rank_environment`): there the heap stopped growing at the third
    epoch (344-360 MiB), peak RSS above baseline 222-251 MiB against 435-458
    with the cache, epochs as long;
  - the step's own buffers (on 4 METIS parts of ``reddit-shaped``: 1.2 to
    4.7 MB, with overlapping lifetimes) do not pack: a live peak of 14 MB
    above what lives between steps spread over 28 MB of heap (one step,
    traced by hand). Allocations that outlive a step are not the cause:
    with a plan's transposes mapped on their own (by hand) the heap kept as
    much free space between steps (16-22 against 22-24 MiB). Training
    allocates the gradients' buffers before the first step
    (:class:`~pyg_dist.reducer.GradientReducer`) and releases free pages at
    the first epochs' starts (:func:`release_free_memory`); where the
    buffers land varies from run to run (the sequential exchange, 2 METIS
    parts of ``reddit-shaped``, hidden 256: 137-184 MiB on a rank, with a
    live peak of 97-101).

* ``compact`` mode maps every chunk of 256 KiB or more on its own and
  returns it when freed: RSS above baseline less code is then the live peak,
  but every step faults its buffers in anew: a 16 MiB buffer allocated and
  filled took 1.6 ms mapped on huge pages and 7.3 ms on 4 KiB pages,
  against 0.42 ms reused from the heap (one thread; measured by hand).
"""
import ctypes
import ctypes.util
import os
import re
import sys
import threading
from contextlib import contextmanager
from typing import Dict, Iterator, List, Mapping, Optional


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
    at every :meth:`sample` call (the points where peaks happen: after a
    forward pass, and :func:`sample_live_peak` in backward). A peak shorter
    than :obj:`interval` between two :meth:`sample` calls may be missed: the
    figure is a lower bound.
    Inactive (all ``None``) where :func:`malloc_in_use` is.

    Every read walks each arena's free lists under its lock (36 us median
    on a training rank's fragmented heap, measured), and the training
    thread's ``malloc`` waits for those locks: at 2 ms the thread used 7% of
    a core beside neighbour-loader training (1.44 s of CPU in 20 s), at
    10 ms still 2.6% (its CPU ticks against the training thread's, read from
    ``/proc``) and at 50 ms 0.8% of the rank's CPU (``perf``: reads of up to
    0.4 ms on that heap), so it reads every 100 ms. A step's peak is in its
    backward, where :func:`sample_live_peak` samples."""

    def __init__(self, interval: float = 0.1) -> None:
        global _ACTIVE
        self.interval = interval
        self.peak: Optional[int] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if malloc_in_use() is not None:
            self.reset()
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="pyg_dist-live-memory")
            self._thread.start()
            _ACTIVE = self

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
        global _ACTIVE
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if _ACTIVE is self:
            _ACTIVE = None


_ACTIVE: Optional[PeakSampler] = None  # the latest open sampler of this process


def sample_live_peak() -> None:
    r"""Marks a point where a training step's live memory peaks: the
    process' open :class:`PeakSampler` (the latest, if any) samples now.
    The backward of a halo exchange calls it once its owners' gradients
    arrived (every activation saved for backward is still live beside the
    layer's full gradient, its inner copy and the received rows), and
    :func:`sample_live_peak_after` once the node before the exchange ran.

    Measured against a ``malloc`` counter preloaded by hand (every byte
    allocated and freed, its exact peak), GraphSAGE: sampled at forward's
    end and every 100 ms only, the peak of an epoch came out up to a third
    low (4 METIS parts of R-MAT, exact: 29-32 against 38 MiB); with these points
    it equalled the counter's after the first epoch on 4 METIS parts of
    R-MAT (exact and BNS) and of ``reddit-shaped`` (BNS), and on 2 random
    parts of R-MAT at hidden 256 (both exchanges)."""
    if _ACTIVE is not None:
        _ACTIVE.sample()


def sample_live_peak_after(x) -> None:
    r""":func:`sample_live_peak` once backward has run the node that made
    the tensor :obj:`x` (a halo exchange's input: its gradients come right
    after the exchange's, while the exchange's output gradient is live).
    Nothing without an open sampler or where :obj:`x` has no node."""
    if _ACTIVE is not None and x.requires_grad and x.grad_fn is not None:
        x.grad_fn.register_hook(_sample_hook)


def _sample_hook(grad_inputs, grad_outputs) -> None:
    sample_live_peak()


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


TUNABLES_ENV = "GLIBC_TUNABLES"
#: glibc's per-thread cache of small free chunks, off (see :func:`rank_environment`).
NO_THREAD_CACHE = "glibc.malloc.tcache_count=0"


def rank_environment(malloc: str,
                     environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    r"""The environment variables a rank of allocator mode :obj:`malloc`
    (``TrainConfig.malloc``) needs from the start of its process, with the
    values :obj:`environ` (default: this process') already holds: glibc and
    torch read them once, at start-up or at the first large buffer.

    * ``reuse`` and ``compact``: :data:`NO_THREAD_CACHE` added to
      ``GLIBC_TUNABLES``, unless it sets ``tcache_count`` already: freed
      neighbours then merge (see the module);
    * ``compact``: also ``THP_MEM_ALLOC_ENABLE=1`` (torch's buffers of 2 MiB
      and more on huge pages), unless set.
    * ``system``: nothing."""
    environ = os.environ if environ is None else environ
    needed: Dict[str, str] = {}
    if malloc == "system":
        return needed
    tunables = environ.get(TUNABLES_ENV, "")
    if "glibc.malloc.tcache_count=" not in tunables:
        needed[TUNABLES_ENV] = ":".join(filter(None, (tunables, NO_THREAD_CACHE)))
    if malloc == "compact" and THP_ENV not in environ:
        needed[THP_ENV] = "1"
    return needed


def thread_cache_on() -> Optional[bool]:
    r"""Whether glibc's per-thread cache of small chunks is on in this
    process: off where ``GLIBC_TUNABLES`` held :data:`NO_THREAD_CACHE` when
    the process started (``/proc/self/environ``: what glibc read; a later
    change of ``os.environ`` changes nothing). ``None`` without glibc."""
    if _LIBC is None:
        return None
    try:
        with open("/proc/self/environ", "rb") as f:
            start = f.read().split(b"\0")
    except OSError:
        return None
    tunables = next((e[len(TUNABLES_ENV) + 1:] for e in start
                     if e.startswith(TUNABLES_ENV.encode() + b"=")), b"")
    return NO_THREAD_CACHE.encode() not in tunables.split(b":")


@contextmanager
def environment_for_ranks(malloc: str) -> Iterator[None]:
    r"""Inside, processes this one starts (ranks, and the forkserver they
    fork from) get :func:`rank_environment` of :obj:`malloc`; this
    process' environment is restored after."""
    needed = rank_environment(malloc)
    previous = {name: os.environ.get(name) for name in needed}
    os.environ.update(needed)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
    baseline, less the machine code paged in since, came to 1.00-1.03 times
    the live peak (the default: 1.20-1.34), but every step faults its
    buffers in anew (the kernel zeroes them): 1.30-1.51 times the
    default's epoch time over three rounds
    (``benchmarks/results/memory_default_vs_compact.json``), which is why it
    is not the default.

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
