"""Large buffers asked to be huge pages (pyg_dist.utils.hugepages)."""
import pytest
import torch

from pyg_dist.utils import hugepages
from pyg_dist.utils.allocator import vm_flags


def _vm_flags(address: int) -> list:
    r"""The ``VmFlags`` of the mapping of this process that holds :obj:`address`."""
    flags = vm_flags(address)
    assert flags is not None, f"no mapping holds {address:#x}"
    return flags


def test_large_buffers_are_advised_small_ones_left_to_the_heap():
    if hugepages._MADVISE is None:
        pytest.skip("no transparent huge pages here")
    big = hugepages.empty((hugepages.MIN_BYTES // 4 + 2**20 // 4, ), torch.float32)
    middle = big.data_ptr() + big.numel() * 2  # 2-MiB-aligned pages lie inside
    assert "hg" in _vm_flags(middle)
    small = hugepages.empty((1024, 1024), torch.float32)  # 4 MiB: glibc's heap
    assert "hg" not in _vm_flags(small.data_ptr())
    # an ordinary tensor of the shape, dtype and rows asked for
    rows = hugepages.empty_like_rows(torch.zeros(3, 5, 7, dtype=torch.int64), 4)
    assert rows.shape == (4, 5, 7) and rows.dtype == torch.int64 and rows.is_contiguous()
