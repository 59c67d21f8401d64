r"""Large CPU buffers backed by transparent huge pages where the kernel
gives them on request.

A buffer of :math:`B` bytes that glibc maps on its own (every allocation of
32 MiB or more: glibc's largest mmap threshold) is new memory each time:
its first write takes one page fault per 4 KiB page, :math:`B / 4096`
faults, each zeroing its page. The neighbour loader allocates such buffers
for every batch (the batch's feature rows, the rows owners serve and the
rows they send back): on ``reddit_shaped`` (602 features), a gather of
29,000 rows (70 MB) into a new tensor took 33 ms with one thread, 15 ms
into a buffer given ``madvise(MADV_HUGEPAGE)`` first (one fault per 2 MiB;
measured on the 2-core VM of BENCHMARKS.md, THP mode ``madvise``).

Nothing is kept between batches: the buffer is freed, and unmapped, like
any other tensor. Smaller buffers come from glibc's heap, which is left
alone (huge pages there would hold freed memory in the resident set).
Where the kernel has no transparent huge pages (mode ``never``, not
Linux) or ``madvise`` fails, the buffer is an ordinary :func:`torch.empty`.
"""
import ctypes
from typing import Callable, Optional, Sequence

import torch

from pyg_dist.utils.allocator import c_library

#: Buffers from this size on get huge pages: glibc maps them on their own.
MIN_BYTES = 32 * 2**20
_HUGE = 2 * 2**20
_MADV_HUGEPAGE = 14


def _madvise() -> Optional[Callable[[int, int, int], int]]:
    libc = c_library()
    if libc is None:
        return None
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return None
    except OSError:
        return None
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc.madvise


_MADVISE = _madvise()


def empty(shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    r"""An uninitialised CPU tensor of :obj:`shape`; from :data:`MIN_BYTES`
    on, the 2 MiB-aligned pages inside it are asked to be huge pages
    before anything touches them (see the module)."""
    out = torch.empty(tuple(shape), dtype=dtype)
    nbytes = out.numel() * out.element_size()
    if _MADVISE is not None and nbytes >= MIN_BYTES:
        begin = -(-out.data_ptr() // _HUGE) * _HUGE
        end = (out.data_ptr() + nbytes) // _HUGE * _HUGE
        _MADVISE(begin, end - begin, _MADV_HUGEPAGE)  # advice: a failure changes nothing
    return out


def empty_like_rows(like: torch.Tensor, num_rows: int) -> torch.Tensor:
    r""":func:`empty` with :obj:`num_rows` rows shaped and typed as those of
    :obj:`like` (on :obj:`like`'s device; huge pages on the CPU only)."""
    shape = (num_rows, ) + tuple(like.shape[1:])
    if like.device.type != "cpu":
        return like.new_empty(shape)
    return empty(shape, like.dtype)
