r"""The dense product :math:`\mathbf{X}\mathbf{W}^{\top}` through oneDNN where
torch has it.

torch's CPU ``mm`` calls MKL, which runs AVX2 kernels on AMD processors;
oneDNN (bundled with torch's x86 builds) runs AVX-512 where the processor
has it. For a neighbour batch's first layer, 15,386 x 602 rows times a
602 x 256 weight, one thread of an AMD EPYC (Zen 4): 45.1 against 58.4 ms,
two processes at once (measured). The weight's gradient
:math:`\nabla\mathbf{Y}^{\top}\mathbf{X}` stays with MKL: oneDNN wants both
operands transposed, and the copy of :math:`\nabla\mathbf{Y}^{\top}` costs
what its kernel saves (52.8 against 52.5 ms, the copy included). The two
products sum in different orders: the results agree to fp32 rounding
(8.9e-7 of the largest entry on that shape).
"""
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def _onednn_linear() -> Optional[Callable]:
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


_ONEDNN_LINEAR = _onednn_linear()


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight)
        return _ONEDNN_LINEAR(x, weight, None, "none", [], "")

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad.mm(weight) if ctx.needs_input_grad[0] else None
        grad_weight = grad.t().mm(x) if ctx.needs_input_grad[1] else None
        return grad_x, grad_weight


def linear(x: Tensor, weight: Tensor) -> Tensor:
    r""":math:`\mathbf{X}\mathbf{W}^{\top}` (``F.linear`` without a bias),
    forward through oneDNN for contiguous 2-D float32 CPU operands where
    torch has oneDNN, else through ``F.linear``."""
    if (_ONEDNN_LINEAR is None or x.device.type != "cpu" or x.dtype != torch.float32
            or weight.dtype != torch.float32 or x.dim() != 2 or weight.dim() != 2
            or not x.is_contiguous() or not weight.is_contiguous()):
        return F.linear(x, weight)
    return _OneDNNLinear.apply(x, weight)
