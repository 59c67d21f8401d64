"""Large buffers asked to be huge pages (pyg_dist.utils.hugepages)."""
import pytest
import torch

from pyg_dist.utils import hugepages


def _vm_flags(address: int) -> str:
    r"""The ``VmFlags`` of the mapping of this process that holds :obj:`address`."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                start, end = (int(a, 16) for a in first.split("-"))
                inside = start <= address < end
            elif inside and first == "VmFlags:":
                return line
    raise AssertionError(f"no mapping holds {address:#x}")


def test_large_buffers_are_advised_small_ones_left_to_the_heap():
    if hugepages._MADVISE is None:
        pytest.skip("no transparent huge pages here")
    big = hugepages.empty((hugepages.MIN_BYTES // 4 + 2**20 // 4, ), torch.float32)
    middle = big.data_ptr() + big.numel() * 2  # 2-MiB-aligned pages lie inside
    assert " hg" in _vm_flags(middle)
    small = hugepages.empty((1024, 1024), torch.float32)  # 4 MiB: glibc's heap
    assert " hg" not in _vm_flags(small.data_ptr())
    # an ordinary tensor of the shape, dtype and rows asked for
    rows = hugepages.empty_like_rows(torch.zeros(3, 5, 7, dtype=torch.int64), 4)
    assert rows.shape == (4, 5, 7) and rows.dtype == torch.int64 and rows.is_contiguous()
