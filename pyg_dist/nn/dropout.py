r"""Dropout on the CPU at a fraction of its cost.

:class:`torch.nn.Dropout` draws its mask on the CPU with ``bernoulli_``,
one double-precision draw per entry: on 25,000 x 128 rows (a GraphSAGE
layer's output in a sampled batch) 56 ms forward with one thread (58 ms
with its backward), more than the layer's own projection. :class:`Dropout`
draws random 64-bit words (``random_`` over the whole ``int64`` range: all
64 bits uniform) and reads them as :math:`b`-bit integers :math:`r_i`,
uniform on :math:`[0, 2^b)`, :math:`64 / b` entries a word. Entry :math:`i`
is kept when :math:`r_i < t` with :math:`t = \mathrm{round}((1 - p) \cdot
2^b)` (at least 1, at most :math:`2^b - 1`), so

.. math::
    \mathbf{y} = \frac{2^b}{t} \, \mathbf{m} \odot \mathbf{x}, \qquad
    \Pr(m_i = 1) = \frac{t}{2^b},

unbiased (:math:`\mathbb{E}[\mathbf{y}] = \mathbf{x}`). :math:`b` is the
fewest of 8, 16 and 32 bits that make :math:`(1 - p) \cdot 2^b` a whole
number, so the keep probability is exactly :math:`1 - p` for the usual
:math:`p` (0.5: one byte an entry), and within :math:`2^{-33}` of it with
32 bits otherwise. On 23,600 x 128 rows with one thread the mask costs
3.1 ms at :math:`p = 0.5` (``random_`` of 31-bit integers, one an entry,
took 10.5 ms; measured). The mask is kept for the backward as one byte
per entry (``bernoulli_``'s is as wide as the input). Draws come from
torch's default generator, so seeding and checkpointed generator states
reproduce them; on other devices it is :func:`torch.nn.functional.dropout`.
"""
from typing import Tuple

import torch
from torch import Tensor

from pyg_dist.nn.convert import convert, exactly

#: The signed integer type read out of the random words for b bits.
_SIGNED = {8: torch.int8, 16: torch.int16, 32: torch.int32}


def _keep_mask(shape: torch.Size, p: float) -> Tuple[Tensor, float]:
    r"""The mask (bool) and the scale :math:`2^b / t` (see the module)."""
    keep_share = 1.0 - p
    bits = next((b for b in (8, 16) if (keep_share * 2**b).is_integer()), 32)
    threshold = min(max(round(keep_share * 2**bits), 1), 2**bits - 1)
    numel = shape.numel()
    words = torch.empty(-(-numel * bits // 64), dtype=torch.int64).random_(-2**63, None)
    # signed b-bit reads r - 2^(b-1): r < t is the same comparison shifted
    draws = words.view(_SIGNED[bits])[:numel].view(shape)
    return draws < threshold - 2**(bits - 1), 2**bits / threshold


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        keep, ctx.scale = _keep_mask(x.shape, p)
        ctx.save_for_backward(keep)
        return _masked(x, keep, ctx.scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        keep, = ctx.saved_tensors
        return _masked(grad, keep, ctx.scale), None


def _masked(x: Tensor, keep: Tensor, scale: float) -> Tensor:
    r""":math:`s \, \mathbf{m} \odot \mathbf{x}` in one pass into one new
    buffer: ``addcmul`` of a zero scalar, :math:`0 + (s x_i) m_i`, with the
    mask's bool storage read as ``uint8`` (the same 0 and 1). Kept entries
    are :math:`s x_i`, the same float as :math:`x_i \cdot (m_i s)`; dropped
    ones are zero. Half the time of a product and a scaling (measured,
    23,600 x 128 rows, one thread: 2.2 against 4.3 ms)."""
    return torch.addcmul(x.new_zeros(()), x, keep.view(torch.uint8), value=scale)


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    r"""Dropout of :obj:`x` with probability :obj:`p` (see the module)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p == 1.0 or not x.is_floating_point() or x.numel() == 0:
        return torch.nn.functional.dropout(x, p, training)
    return _Dropout.apply(x, p)


class Dropout(torch.nn.Dropout):
    r""":class:`torch.nn.Dropout` with the CPU mask of :func:`dropout`
    (``inplace`` is not taken: the output is always new)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


def fast_dropout(model: torch.nn.Module) -> torch.nn.Module:
    r"""Makes every :class:`torch.nn.Dropout` of :obj:`model` (that class
    exactly, not a subclass) a :class:`Dropout` of the same probability, in
    place (:func:`~pyg_dist.nn.convert.convert`; its hooks stay); returns
    :obj:`model`."""
    return convert(model, exactly({torch.nn.Dropout: Dropout}))
