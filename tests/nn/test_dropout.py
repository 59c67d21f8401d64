"""pyg_dist.nn.dropout: the CPU dropout's defining properties (keep
probability, unbiased output, the backward uses the forward's mask,
reproducible from the generator's state) and where the package applies it."""
import math

import pytest
import torch
from torch_geometric.nn import GraphSAGE

from pyg_dist.config import TrainConfig, build_model
from pyg_dist.nn.dropout import Dropout, _keep_mask, dropout, fast_dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_probability_and_expected_value(p):
    torch.manual_seed(0)
    n = 1_000_000
    y = dropout(torch.ones(n), p)
    kept = y != 0
    # 6 standard deviations of a binomial proportion: fails only if it is biased
    assert abs(float(kept.float().mean()) - (1 - p)) < 6 * math.sqrt(p * (1 - p) / n)
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    assert abs(float(y.mean()) - 1.0) < 6 * math.sqrt(p / (1 - p) / n)


@pytest.mark.parametrize("p, exact", [(0.5, True), (0.25, True), (1 / 1024, True),
                                      (0.2, False), (0.1, False)])
def test_keep_probability_is_exact_where_a_byte_or_two_can_hold_it(p, exact):
    # the scale is 2^b / t: exactly 1 / (1 - p) where (1 - p) 2^b is whole for
    # b = 8 (0.5, 0.25) or 16 (1/1024); within 2^-32 of it with 32 bits
    keep, scale = _keep_mask(torch.Size([64, 3]), p)
    assert keep.shape == (64, 3) and keep.dtype == torch.bool
    if exact:
        assert scale == 1 / (1 - p)
    else:
        assert scale != 1 / (1 - p) and abs(scale * (1 - p) - 1) < 2**-31


def test_backward_uses_the_forward_mask():
    torch.manual_seed(1)
    x = torch.randn(300, 40, requires_grad=True)
    y = dropout(x, 0.3)
    grad = torch.randn_like(y)
    y.backward(grad)
    scale = y.detach()[y != 0] / x.detach()[y != 0]
    torch.testing.assert_close(x.grad, grad * (y != 0) * scale[0])
    torch.testing.assert_close(scale, torch.full_like(scale, scale[0].item()))


def test_draws_follow_the_generator_state():
    x = torch.randn(200, 30)
    torch.manual_seed(3)
    state = torch.get_rng_state()
    first = dropout(x, 0.5)
    torch.set_rng_state(state)
    assert torch.equal(first, dropout(x, 0.5))
    assert not torch.equal(first, dropout(x, 0.5))  # the generator moved on


def test_identity_in_eval_and_at_p_zero_and_torch_s_edge_cases():
    x = torch.randn(50, 8)
    assert dropout(x, 0.5, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    assert dropout(torch.empty(0, 8), 0.5).shape == (0, 8)
    with pytest.raises(ValueError, match="between 0 and 1"):
        dropout(x, 1.5)


def test_models_of_the_training_stack_and_distribute_use_it():
    model = build_model(TrainConfig(model="sage", dropout=0.5), 12, 4)
    assert type(model.dropout) is Dropout and model.dropout.p == 0.5
    plain = GraphSAGE(12, 16, 2, 4, dropout=0.2)
    hook = plain.dropout.register_forward_hook(lambda *args: None)
    assert fast_dropout(plain) is plain and type(plain.dropout) is Dropout
    assert plain.dropout.p == 0.2 and hook.id in plain.dropout._forward_hooks

    class Custom(torch.nn.Dropout):  # a subclass keeps its own forward
        pass
    custom = torch.nn.Sequential(Custom(0.5))
    assert type(fast_dropout(custom)[0]) is Custom
