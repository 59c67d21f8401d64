r"""Float comparisons that hold on any x86 CPU, thread count and arrival order.

A distributed computation adds the same terms as single-process PyG in
another order (per rank, then across ranks), and another CPU's SIMD kernels
round differently again. The rounding error of a reordered sum scales with
the magnitude of its *terms*, which the result can hide (a sum that cancels
to ~0 still carries its terms' rounding). So every entry is compared within
:data:`RTOL` of the largest magnitude of the tensor it belongs to, never
with an absolute bound: a gradient entry of 1,500 may differ by one ulp
(2⁻¹³), a probability by 10⁻⁷.

:data:`RTOL` (1e-4, ~840 fp32 ulps of the largest entry) was set from the
errors the suite measured against single-process PyG on a 2-core AMD EPYC
(largest entry-wise difference over the tensor's largest magnitude): outputs
at most 2.2e-7, weight gradients 9e-7, GAT's attention gradients (softmax
gradients cancel per target) 6.7e-6, parameters after five Adam steps
7.5e-7. A wrong result is far outside it: a pipelined cache that serves the
rows or gradients of the neighbouring iteration moves the outputs or
gradients of ``test_pipelined_training_equals_its_definition`` by 1.8e-2 to
1.5.

Where bit identity is the contract (resume from a checkpoint, p = 1 against
the exact plan, pipelined against in-loop batches) tests use
:func:`torch.equal`: both sides run the same operations in the same order on
the same machine and thread count, deterministic by construction.
"""
from typing import Optional

import torch
from torch import Tensor

RTOL = 1e-4
CANCELLED = 1e-2


def scale_of(expected) -> float:
    r"""The magnitude errors are measured against: the largest entry."""
    expected = torch.as_tensor(expected)
    return float(expected.detach().abs().max()) if expected.numel() else 0.0


def assert_fp32_close(actual, expected, rtol: float = RTOL, msg: Optional[str] = None) -> None:
    r"""Asserts that :obj:`actual` equals :obj:`expected` up to fp32
    rounding: same shape and dtype, every entry within :obj:`rtol` times
    the largest magnitude of :obj:`expected` (a lossy exchange passes its
    codec's precision as :obj:`rtol`)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    torch.testing.assert_close(
        actual.detach(), expected.detach(), rtol=rtol, atol=rtol * scale_of(expected),
        msg=None if msg is None else lambda default: f"{msg}\n{default}")


def assert_params_close(actual: dict, expected: dict, rtol: float = RTOL,
                        msg: str = "") -> None:
    r""":func:`assert_fp32_close` per named tensor, each against its own
    magnitude (one layer's small gradient is not hidden by another's large
    one), but never below :data:`CANCELLED` of the largest: a gradient that
    is zero in exact arithmetic (an attention key's bias, which the softmax
    cancels) is the rounding of the terms of the others."""
    assert actual.keys() == expected.keys(), (msg, sorted(actual), sorted(expected))
    floor = CANCELLED * max((scale_of(v) for v in expected.values()), default=0.0)
    for name, value in expected.items():
        scale = max(scale_of(value), floor)
        torch.testing.assert_close(
            torch.as_tensor(actual[name]).detach(), value.detach(), rtol=rtol,
            atol=rtol * scale, msg=lambda default, n=name: f"{msg} {n}\n{default}")


def assert_scalar_close(actual: float, expected: float, rtol: float = RTOL,
                        msg: str = "", scale: Optional[float] = None) -> None:
    r"""Two scalars (a loss, a metric) equal up to fp32 rounding of
    :obj:`scale`: the magnitude of the terms summed into them (default:
    their own magnitude)."""
    if scale is None:
        scale = max(abs(expected), abs(actual))
    assert abs(actual - expected) <= rtol * scale, (msg, actual, expected, scale)


def near_ties(logits: Tensor, rtol: float = RTOL) -> Tensor:
    r"""Rows whose two largest entries are within fp32 rounding of each
    other: their argmax (a prediction) may flip on another CPU."""
    top = logits.detach().topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]) <= rtol * scale_of(logits)
