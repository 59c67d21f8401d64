r"""Normalisation layers whose statistics span every rank's nodes.

A norm that averages over nodes (BatchNorm, PyG's graph-mode norms) would
compute per-rank statistics on a partition. :func:`distribute` swaps each
for the class here, which takes the same statistics over the rows every rank
gives it: one differentiable all-reduce of per-channel float64 sums
:math:`(n, \sum_i x_i, \sum_i x_i^2)` per call, so that

.. math::
    \mu = \frac{1}{n} \sum_i x_i, \qquad
    \sigma^2 = \frac{1}{n} \sum_i x_i^2 - \mu^2

equal single-process PyG's statistics up to fp32 rounding (float64 sums keep
the subtraction exact), and the gradients reach every rank's rows exactly
(the backward all-reduces the gradients of the sums). Running statistics
follow PyG's update rules, so they too equal PyG's. Parameters, buffers and
``state_dict`` keys stay those of the original class.
"""
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.nn import norm as pyg_norm


class _AllReduceSum(torch.autograd.Function):
    r""":math:`S = \sum_r t_r` on every rank; each rank's loss depends on
    :math:`S`, so :math:`\partial L / \partial t_r = \sum_{r'} \partial
    L_{r'} / \partial S`: the backward all-reduces too."""

    @staticmethod
    def forward(ctx, t: Tensor, group) -> Tensor:
        ctx.group = group
        out = t.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def all_reduce_sum(t: Tensor, group=None) -> Tensor:
    r"""The sum of :obj:`t` over the ranks of :obj:`group`, differentiably."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return t
    return _AllReduceSum.apply(t, group)


class Moments(NamedTuple):
    count: Tensor  # the number of rows over all ranks (float64 scalar)
    mean: Tensor  # per channel
    var: Tensor  # per channel, biased


def node_moments(x: Tensor, group=None) -> Moments:
    r"""Per-channel mean and biased variance of the rows of :obj:`x` over
    every rank, from one all-reduce of float64 sums."""
    x64 = x.double()
    count = x64.new_full((1, x.size(-1)), float(x.size(0)))
    sums = all_reduce_sum(torch.cat([count, x64.sum(0, keepdim=True),
                                     x64.pow(2).sum(0, keepdim=True)]), group)
    n = sums[0, 0]
    mean = sums[1] / n
    var = (sums[2] / n - mean.pow(2)).clamp(min=0)
    return Moments(n, mean, var)


def _group(module) -> Optional[object]:
    # set by distribute(), as SyncBatchNorm's (None: the default group)
    return getattr(module, "process_group", None)


def _no_batch(module, batch: Optional[Tensor]) -> None:
    if batch is not None:
        raise ValueError(
            f"{type(module).__name__} under distribute() normalises over the whole "
            f"graph: a per-graph `batch` vector (several graphs in one partition) "
            f"is not supported")


def _update_running(module, moments: Moments, momentum: float) -> None:
    r"""PyG's and torch's running-statistics rule: the unbiased variance,
    exponential average with :obj:`momentum`."""
    n = moments.count
    with torch.no_grad():
        unbiased = moments.var * n / (n - 1).clamp(min=1)
        module.running_mean.mul_(1 - momentum).add_(momentum * moments.mean.to(
            module.running_mean.dtype))
        module.running_var.mul_(1 - momentum).add_(momentum * unbiased.to(
            module.running_var.dtype))


def _normalise(x: Tensor, moments: Moments, eps: float) -> Tensor:
    mean, var = moments.mean.to(x.dtype), moments.var.to(x.dtype)
    return (x - mean) / (var + eps).sqrt()


class DistBatchNorm1d(torch.nn.BatchNorm1d):
    r""":class:`torch.nn.BatchNorm1d` over the nodes of every rank (node
    features ``[N, C]``). Evaluation with running statistics is row-wise and
    runs as usual."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training and self.track_running_stats:
            return super().forward(x)
        if x.dim() != 2:
            raise ValueError(f"BatchNorm1d under distribute() normalises node features "
                             f"of shape [num_nodes, channels] (got {tuple(x.shape)})")
        moments = node_moments(x, _group(self))
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                        else self.momentum)
            _update_running(self, moments, momentum)
        out = _normalise(x, moments, self.eps)
        return out * self.weight + self.bias if self.affine else out


class DistBatchNorm(pyg_norm.BatchNorm):
    r"""PyG's :class:`~torch_geometric.nn.norm.BatchNorm`: its module is a
    :class:`DistBatchNorm1d`; a rank holding at most one row still takes
    the statistics of all ranks (PyG's single-element shortcut is local)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.module(x)


class DistInstanceNorm(pyg_norm.InstanceNorm):
    r"""PyG's :class:`~torch_geometric.nn.norm.InstanceNorm` over the whole
    graph (one instance: every rank's nodes)."""

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        _no_batch(self, batch)
        if not self.training and self.track_running_stats:
            return super().forward(x)
        moments = node_moments(x, _group(self))
        if self.training and self.track_running_stats:
            _update_running(self, moments, self.momentum)
        out = _normalise(x, moments, self.eps)
        return out * self.weight + self.bias if self.affine else out


class DistLayerNorm(pyg_norm.LayerNorm):
    r"""PyG's :class:`~torch_geometric.nn.norm.LayerNorm`: ``mode="graph"``
    over every entry of every rank's nodes; ``mode="node"`` is row-wise."""

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        if self.mode != "graph":
            return super().forward(x, batch, batch_size)
        _no_batch(self, batch)
        moments = node_moments(x, _group(self))
        channels = x.size(-1)
        mean = moments.mean.sum() / channels
        var = (moments.var + (moments.mean - mean).pow(2)).sum() / channels
        out = (x - mean.to(x.dtype)) / (var.sqrt().to(x.dtype) + self.eps)
        if self.weight is not None and self.bias is not None:
            out = out * self.weight + self.bias
        return out


class DistGraphNorm(pyg_norm.GraphNorm):
    r"""PyG's :class:`~torch_geometric.nn.norm.GraphNorm` over the whole
    graph: :math:`\mathbb{E}[(x - a\mu)^2] = \sigma^2 + (1 - a)^2 \mu^2`."""

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        _no_batch(self, batch)
        moments = node_moments(x, _group(self))
        scale = self.mean_scale.double()
        var = moments.var + (1 - scale).pow(2) * moments.mean.pow(2)
        out = x - (moments.mean * scale).to(x.dtype)
        return self.weight * out / (var + self.eps).sqrt().to(x.dtype) + self.bias


class DistGraphSizeNorm(pyg_norm.GraphSizeNorm):
    r"""PyG's :class:`~torch_geometric.nn.norm.GraphSizeNorm` with the node
    count of the whole graph."""

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        _no_batch(self, batch)
        count = all_reduce_sum(x.new_tensor([float(x.size(0))]), _group(self))
        return x * count.pow(-0.5)


class DistPairNorm(pyg_norm.PairNorm):
    r"""PyG's :class:`~torch_geometric.nn.norm.PairNorm` centred on the
    whole graph's mean (and, unless ``scale_individually``, scaled by its
    mean squared row norm :math:`\sum_c \sigma_c^2`)."""

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        _no_batch(self, batch)
        moments = node_moments(x, _group(self))
        x = x - moments.mean.to(x.dtype)
        if self.scale_individually:
            return self.scale * x / (self.eps + x.norm(2, -1, keepdim=True))
        return self.scale * x / (self.eps + moments.var.sum().to(x.dtype)).sqrt()


class DistMeanSubtractionNorm(pyg_norm.MeanSubtractionNorm):
    r"""PyG's :class:`~torch_geometric.nn.norm.MeanSubtractionNorm` with the
    whole graph's mean."""

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                dim_size: Optional[int] = None) -> Tensor:
        _no_batch(self, batch)
        return x - node_moments(x, _group(self)).mean.to(x.dtype)


#: Norm classes and their distributed versions (exact types only: a user's
#: subclass may compute anything).
NORMS = {
    torch.nn.BatchNorm1d: DistBatchNorm1d,
    pyg_norm.BatchNorm: DistBatchNorm,
    pyg_norm.InstanceNorm: DistInstanceNorm,
    pyg_norm.LayerNorm: DistLayerNorm,
    pyg_norm.GraphNorm: DistGraphNorm,
    pyg_norm.GraphSizeNorm: DistGraphSizeNorm,
    pyg_norm.PairNorm: DistPairNorm,
    pyg_norm.MeanSubtractionNorm: DistMeanSubtractionNorm,
}
