"""Large buffers asked to be huge pages (pyg_dist.utils.hugepages)."""
import os
import subprocess
import sys

import pytest
import torch

from pyg_dist.utils import hugepages

_ADVISED = """
import torch
from pyg_dist.utils import hugepages
from pyg_dist.utils.allocator import vm_flags
big = hugepages.empty((hugepages.MIN_BYTES // 4 + 2**20 // 4, ), torch.float32)
small = hugepages.empty((1024, 1024), torch.float32)  # 4 MiB: glibc's heap
middle = big.data_ptr() + big.numel() * 2  # 2-MiB-aligned pages lie inside
print("hg" in vm_flags(middle), "hg" in vm_flags(small.data_ptr()))
"""


def test_large_buffers_are_advised_small_ones_left_to_the_heap():
    if hugepages._MADVISE is None:
        pytest.skip("no transparent huge pages here")
    # in a fresh process: torch advises huge pages for every buffer of 2 MiB
    # and more in a process where THP_MEM_ALLOC_ENABLE was set at its first one
    # (as another test may have set it here)
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    advised = subprocess.run([sys.executable, "-c", _ADVISED], env=env, check=True,
                             capture_output=True, text=True).stdout.split()
    assert advised == ["True", "False"]
    # an ordinary tensor of the shape, dtype and rows asked for
    rows = hugepages.empty_like_rows(torch.zeros(3, 5, 7, dtype=torch.int64), 4)
    assert rows.shape == (4, 5, 7) and rows.dtype == torch.int64 and rows.is_contiguous()
