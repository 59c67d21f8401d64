"""Row codecs: halo rows and gradients in fewer bytes on the wire."""
from typing import Dict, Optional

import torch
from torch import Tensor


class RowCodec:
    r"""Encodes the rows of a 2-D float tensor into bytes (``uint8``, one
    row per row, so ``all_to_all`` splits stay row counts) and back."""

    def encode(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def decode(self, payload: Tensor, dtype: torch.dtype) -> Tensor:
        raise NotImplementedError


class CastCodec(RowCodec):
    r"""Rows cast to a 16-bit float type (``bf16``: fp32's range, 8-bit
    mantissa; ``fp16``: 11-bit mantissa, range :math:`\pm 65504`)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def encode(self, x: Tensor) -> Tensor:
        return x.to(self.dtype).contiguous().view(torch.uint8)

    def decode(self, payload: Tensor, dtype: torch.dtype) -> Tensor:
        return payload.contiguous().view(self.dtype).to(dtype)


class Int8Codec(RowCodec):
    r"""Symmetric per-row int8 quantisation: a row travels as 8-bit
    integers :math:`q = \mathrm{round}(x / s)` and its fp32 scale
    :math:`s = \max_k |x_k| / 127`, so every entry is off by at most
    :math:`s/2` (4 bytes per row on top of one byte per entry)."""

    def encode(self, x: Tensor) -> Tensor:
        scale = x.detach().abs().amax(1, keepdim=True).float() / 127
        q = torch.round(x.float() / scale.clamp(min=torch.finfo(torch.float).tiny))
        q = q.clamp_(-127, 127).to(torch.int8)
        return torch.cat([q.view(torch.uint8), scale.view(torch.uint8)], dim=1)

    def decode(self, payload: Tensor, dtype: torch.dtype) -> Tensor:
        q = payload[:, :-4].contiguous().view(torch.int8)
        scale = payload[:, -4:].contiguous().view(torch.float)
        return (q.float() * scale).to(dtype)


CODECS: Dict[str, Optional[RowCodec]] = {
    "fp32": None,  # rows travel as they are
    "bf16": CastCodec(torch.bfloat16),
    "fp16": CastCodec(torch.float16),
    "int8": Int8Codec(),
}


def get_codec(name: str) -> Optional[RowCodec]:
    if name not in CODECS:
        raise ValueError(f"Unknown exchange dtype '{name}' (choose from {', '.join(CODECS)})")
    return CODECS[name]
