"""The gradient all-reduce overlapped with backward (pyg_dist.reducer): the
same sums as one flat all-reduce after backward, buckets leaving while
backward still runs, unused parameters and non-finite values handled."""
import torch
import torch.distributed as dist

import pyg_dist
from pyg_dist.reducer import GradientReducer


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 8))


def _loss(model, rank: int, step: int, poison: bool = False):
    g = torch.Generator().manual_seed(100 * rank + step)
    x = torch.randn(30, 40, generator=g)
    loss = model(x).square().mean()
    return loss * float("nan") if poison else loss


def reduced_steps(bucket_bytes: int, steps: int = 3):
    r"""Per step: the flat all-reduce's gradients (reference) and the
    reducer's, how many buckets left before backward returned, and the
    reducer's summed loss; then a step whose loss is NaN on rank 1."""
    rank = dist.get_rank()
    model = _model()
    unused = torch.nn.Parameter(torch.ones(3))  # never receives a gradient
    params = list(model.parameters()) + [unused]
    reducer = GradientReducer(params, bucket_bytes=bucket_bytes)
    out = []
    for step in range(steps):
        views = [p.grad for p in params]  # the reducer's buffers, from its start
        for p in params:
            p.grad = None
        loss = _loss(model, rank, step)
        loss.backward()
        reference = [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                     for p in params]
        for g in reference:
            dist.all_reduce(g)
        total = loss.detach().clone()
        dist.all_reduce(total)
        for p, view in zip(params, views):
            if step % 2:  # set to None, as zero_grad() does by default
                p.grad = None
            else:  # zeroed in place (training's zero_grad): backward adds into the views
                view.zero_()
                p.grad = view
        loss = _loss(model, rank, step)
        reducer.start(loss)
        loss.backward()
        early = reducer._next  # buckets launched by the hooks during backward
        got, finite = reducer.wait()
        # either way the sums are in the reducer's buffers, no new ones
        in_buffers = all(p.grad.untyped_storage().data_ptr()
                         == reducer.flat[reducer.bucket_of[id(p)][1]].untyped_storage().data_ptr()
                         for p in params)
        kept = step == 0 or all(p.grad is v for p, v in zip(params, views))
        out.append((reference, [p.grad.clone() for p in params], early,
                    len(reducer.buckets), got, float(total), finite and in_buffers and kept))
        with torch.no_grad():
            for p in params:
                p -= 0.1 * p.grad  # the weights change between steps
    loss = _loss(model, rank, steps, poison=rank == 1)
    reducer.start(loss)
    loss.backward()
    return out, reducer.wait()[1]


def test_overlapped_allreduce_sums_as_the_flat_one():
    ranks = pyg_dist.spawn(reduced_steps, 2, (8 * 1024, ), timeout=60)
    for result, poisoned_finite in ranks:
        assert not poisoned_finite  # a NaN on one rank is seen by every rank
        for step, (reference, got, early, buckets, total, expected, finite) in \
                enumerate(result):
            assert finite and buckets > 2
            for a, b in zip(reference, got):
                assert torch.equal(a, b)  # two ranks: the same sums, bit for bit
            assert total == expected
            # After the first step the buckets follow the gradients' order:
            # the last layers' buckets leave while backward still computes
            # the first layers', the unused parameter's waits for wait().
            if step > 0:
                assert 1 <= early < buckets
    # Every rank ends with the same gradients.
    for a, b in zip(ranks[0][0][-1][1], ranks[1][0][-1][1]):
        assert torch.equal(a, b)


def test_one_bucket_when_everything_fits():
    params = list(_model().parameters())
    assert len(GradientReducer(params).buckets) == 1
    small = GradientReducer(params, bucket_bytes=4 * 1024)
    order = [i for bucket in small.buckets for i in bucket]
    assert order == list(reversed(range(len(params))))  # backward's order
