"""Compressed halo exchange: codec error bounds, bytes, and training signal."""
import pytest
import torch

import pyg_dist
from pyg_dist.comm.compress import CODECS, get_codec
from tests.comm.compress_workers import compressed_exchange
from tests.numeric import assert_fp32_close


@pytest.mark.parametrize("name,rel", [("bf16", 2**-8), ("fp16", 2**-11)])
def test_cast_codecs_round_to_their_precision(name, rel):
    x = torch.randn(50, 7) * 10
    y = CODECS[name].decode(CODECS[name].encode(x), x.dtype)
    assert y.shape == x.shape
    assert bool(((y - x).abs() <= rel * x.abs() + 1e-30).all())


def test_int8_codec_error_is_half_a_step_per_row():
    x = torch.randn(50, 7) * torch.logspace(-3, 3, 50).unsqueeze(1)
    x[3] = 0.0  # an all-zero row stays zero
    payload = CODECS["int8"].encode(x)
    assert payload.dtype == torch.uint8 and payload.shape == (50, 7 + 4)
    y = CODECS["int8"].decode(payload, x.dtype)
    step = x.abs().amax(1, keepdim=True) / 127
    assert bool(((y - x).abs() <= step / 2 * (1 + 1e-5) + 1e-30).all())
    assert torch.equal(y[3], torch.zeros(7))


def test_unknown_exchange_dtype():
    with pytest.raises(ValueError, match="Unknown exchange dtype"):
        get_codec("fp8")


def test_compressed_exchange_bytes_and_error(graph, tmp_path):
    r"""Against the fp32 exchange on real ranks: outputs within the codec's
    precision, gradients pointing the same way, and per layer and direction
    exactly half the bytes (16-bit) or at most (F + 4) / 4F of them (int8,
    F >= 12 here, so <= 1/3)."""
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    results = pyg_dist.spawn(compressed_exchange, 2, (str(tmp_path), ), timeout=120)
    for r in results:
        exact_out, exact_grad, exact_bytes = r["fp32"]
        assert sum(exact_bytes.values()) > 0
        for dtype, max_rel in (("bf16", 2e-2), ("fp16", 2e-3), ("int8", 5e-2)):
            out, grad, nbytes = r[dtype]
            assert_fp32_close(out, exact_out, rtol=max_rel, msg=dtype)
            cos = torch.nn.functional.cosine_similarity(grad, exact_grad, dim=0)
            assert float(cos) > 0.99, (dtype, float(cos))
            assert nbytes.keys() == exact_bytes.keys()
            for key, fp32_bytes in exact_bytes.items():
                if dtype == "int8":
                    assert nbytes[key] <= fp32_bytes / 3, (key, nbytes[key], fp32_bytes)
                else:
                    assert 2 * nbytes[key] == fp32_bytes, (dtype, key)
