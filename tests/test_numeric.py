"""The float comparison every test uses: rounding passes, a real difference fails."""
import pytest
import torch

from tests.numeric import RTOL, assert_fp32_close, assert_scalar_close, near_ties


def test_one_ulp_of_a_large_entry_passes():
    # the failure this helper replaced: a gradient entry in [1024, 2048)
    # rounded one ulp (2^-13) apart on another CPU
    expected = torch.tensor([1500.0, -3.0, 1e-3])
    actual = expected.clone()
    actual[0] += 2**-13
    actual[2] += 4.8e-7  # a small entry carries the rounding of large terms
    assert_fp32_close(actual, expected)


def test_a_relative_difference_above_rtol_fails():
    expected = torch.tensor([1500.0, -3.0, 1e-3])
    with pytest.raises(AssertionError, match="stale"):
        assert_fp32_close(expected * (1 + 10 * RTOL), expected, msg="stale")
    with pytest.raises(AssertionError):  # shapes must agree
        assert_fp32_close(expected[:2], expected)


def test_scalars_against_the_magnitude_of_their_terms():
    assert_scalar_close(1.6e-3 + 5e-7, 1.6e-3, scale=2.0)  # a sum that cancelled
    with pytest.raises(AssertionError):
        assert_scalar_close(1.6e-3 + 5e-7, 1.6e-3)


def test_near_ties():
    logits = torch.tensor([[1.0, 1.0 + 1e-7, 0.0], [2.0, 0.0, 1.0]])
    assert near_ties(logits).tolist() == [True, False]
