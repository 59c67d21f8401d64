"""The halo exchange's ``[x | halo rows]`` built in one buffer."""
import pytest
import torch

import pyg_dist
from tests.comm.halo_workers import backward_peak, extend_and_cat, peak_after_backward


def test_extend_in_one_buffer_equals_the_concatenated_exchange(graph, tmp_path):
    r"""On real ranks: the rows bit for bit, the gradient of the inner rows
    (its own part plus the halo gradients returned by the peers) equal up to
    the order of the sums, and the same bytes counted."""
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    for (rows, grad, received), (cat_rows, cat_grad, cat_received) in pyg_dist.spawn(
            extend_and_cat, 2, (str(tmp_path), ), timeout=120):
        assert torch.equal(rows, cat_rows)
        torch.testing.assert_close(grad, cat_grad)
        assert received == cat_received > 0  # halo rows came, counted alike


def test_the_backward_peak_is_sampled(graph, tmp_path):
    r"""A halo exchange's backward samples the training's live memory once
    its owners' gradients arrived (:func:`sample_live_peak`): the peak a
    sampler saw holds the extended rows' gradient and the inner copy,
    freed before backward returns, with no other read in the window."""
    from pyg_dist.utils.allocator import malloc_in_use
    if malloc_in_use() is None:
        pytest.skip("needs glibc's mallinfo2")
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    for peak, held in pyg_dist.spawn(backward_peak, 2, (str(tmp_path), 256), timeout=120):
        assert peak >= held > 0


def test_the_peak_after_the_exchange_s_backward_is_sampled(graph, tmp_path):
    r"""The node that made the exchange's input runs next in backward, its
    gradients beside the exchange's output gradient: sampled once it ran
    (:func:`sample_live_peak_after`). Its input gradient (1,024 wide here)
    is in the peak."""
    from pyg_dist.utils.allocator import malloc_in_use
    if malloc_in_use() is None:
        pytest.skip("needs glibc's mallinfo2")
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    for peak, held in pyg_dist.spawn(peak_after_backward, 2, (str(tmp_path), 1024),
                                     timeout=120):
        assert peak >= held > 0
