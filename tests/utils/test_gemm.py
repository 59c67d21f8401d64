"""pyg_dist.utils.gemm.linear: X Wᵀ through oneDNN, outputs and gradients
equal F.linear's up to fp32 rounding."""
import pytest
import torch
import torch.nn.functional as F

from pyg_dist.utils import gemm
from tests.numeric import assert_fp32_close


@pytest.mark.parametrize("x_grad", [False, True])
def test_linear_equals_f_linear(x_grad):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 70, generator=g).requires_grad_(x_grad)
    weight = torch.randn(24, 70, generator=g, requires_grad=True)
    probe = torch.randn(300, 24, generator=g)
    out = gemm.linear(x, weight)
    if gemm._ONEDNN_LINEAR is not None:  # torch's x86 builds: the oneDNN path ran
        assert type(out.grad_fn).__name__ == "_OneDNNLinearBackward"
    (out * probe).sum().backward()
    grads = (x.grad, weight.grad)
    x.grad, weight.grad = None, None
    expected = F.linear(x, weight)
    (expected * probe).sum().backward()
    assert_fp32_close(out, expected)
    assert_fp32_close(grads[1], weight.grad)
    if x_grad:
        assert_fp32_close(grads[0], x.grad)
    else:
        assert grads[0] is None


def test_other_operands_take_f_linear():
    for x in (torch.randn(5, 6, dtype=torch.float64), torch.randn(6, 5).t(),
              torch.randn(2, 5, 6)):
        weight = torch.randn(4, 6, dtype=x.dtype, requires_grad=True)
        out = gemm.linear(x, weight)
        assert type(out.grad_fn).__name__ != "_OneDNNLinearBackward"
        torch.testing.assert_close(out, F.linear(x, weight))
