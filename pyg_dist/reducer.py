r"""``GradientReducer``: the gradient all-reduce, overlapped with backward.

Data-parallel training sums every weight gradient over the ranks after each
backward pass. Waiting for the whole backward before the first byte moves
leaves the network idle while the last layers' gradients are ready, and the
cores idle during the all-reduce. As DDP does, the parameters are grouped
into *buckets* in the order backward produces their gradients (the model's
last parameters first); a gradient hook launches a bucket's all-reduce as
soon as all its gradients are accumulated, and :meth:`GradientReducer.wait`
waits for the buckets still in flight once backward returns.

Buckets are launched in one fixed order on every rank (a bucket whose
gradients are ready waits for the buckets before it), so the collectives
match whatever the order the hooks fire in; a parameter that gets no
gradient in a step counts as a zero gradient, its bucket launched at
:meth:`~GradientReducer.wait`. The sum of each element is the one the flat
all-reduce computes.
"""
from contextlib import nullcontext
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

#: The largest bucket: small enough that the first buckets leave while
#: backward still computes the first layers (whose inputs are the widest).
BUCKET_BYTES = 256 * 1024


class GradientReducer:
    r"""Sums the gradients of :obj:`params` over the ranks of :obj:`group`
    while backward runs. Per step: :meth:`start` before ``backward()``,
    :meth:`wait` after it (which also sums the step's loss and tells
    whether everything summed is finite)."""

    def __init__(self, params: List[Tensor], group=None, stats=None,
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        self.params, self.group, self.stats = params, group, stats
        self.bucket_bytes = bucket_bytes
        self._bucket(list(reversed(range(len(params)))))  # backward meets the last ones first
        self.handles = [p.register_post_accumulate_grad_hook(self._accumulated)
                        for p in params]
        self._active = False
        self._fired: Optional[List[int]] = []  # the first step's order; None: rebuilt

    def _bucket(self, order: List[int]) -> None:
        r"""Fills buckets of at most :attr:`bucket_bytes` with the
        parameters in :obj:`order`."""
        self.buckets: List[List[int]] = []
        size = self.bucket_bytes
        for i in order:
            nbytes = self.params[i].numel() * self.params[i].element_size()
            if size + nbytes > self.bucket_bytes and size > 0:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(i)
            size += nbytes
        # id(parameter) -> (its index, its bucket)
        self.bucket_of = {id(self.params[i]): (i, b) for b, bucket in enumerate(self.buckets)
                          for i in bucket}

    def start(self, loss: Tensor) -> None:
        r"""Arms the hooks for this step's backward; :obj:`loss` (this
        rank's share) travels with the first bucket."""
        self._loss = loss.detach().reshape(1)
        self._missing = [len(bucket) for bucket in self.buckets]
        self._flat: List[Optional[Tensor]] = [None] * len(self.buckets)
        self._works: List = [None] * len(self.buckets)
        self._next = 0  # the next bucket to launch (they leave in order)
        self._active = True

    def _accumulated(self, param: Tensor) -> None:
        if self._active:
            index, bucket = self.bucket_of[id(param)]
            if self._fired is not None:
                self._fired.append(index)
            self._missing[bucket] -= 1
            self._launch_ready()

    def _launch_ready(self, everything: bool = False) -> None:
        while self._next < len(self.buckets) and (everything or self._missing[self._next] == 0):
            self._launch(self._next)
            self._next += 1

    def _launch(self, b: int) -> None:
        grads = [self.params[i].grad if self.params[i].grad is not None
                 else torch.zeros_like(self.params[i]) for i in self.buckets[b]]
        extra = [self._loss.to(grads[0].dtype)] if b == 0 else []
        flat = _flatten_dense_tensors(grads + extra)
        self._flat[b] = flat
        self._works[b] = dist.all_reduce(flat, group=self.group, async_op=True)

    def wait(self) -> Tuple[float, bool]:
        r"""Completes this step's all-reduce and sets every parameter's
        gradient to the sum; returns the summed loss and whether it and
        every summed gradient are finite (the same answer on every rank)."""
        if not self._active:
            raise RuntimeError("GradientReducer.wait() without start()")
        self._active = False
        with self.stats.timer("reduce") if self.stats is not None else nullcontext():
            self._launch_ready(everything=True)
            for work in self._works:
                work.wait()
        finite, total = True, 0.0
        for b, (bucket, flat) in enumerate(zip(self.buckets, self._flat)):
            params = [self.params[i] for i in bucket]
            like = params + ([self._loss] if b == 0 else [])
            for p, g in zip(params, _unflatten_dense_tensors(flat, like)):
                p.grad = g
            if b == 0:
                total = float(flat[-1])
            finite &= bool(torch.isfinite(flat).all())
        self._flat, self._works = [], []
        if self._fired is not None:
            self._rebuild()
        return total, finite

    def _rebuild(self) -> None:
        r"""After the first step, as DDP does: the buckets follow the order
        the gradients arrived in (parameters that got none last), rank 0's,
        so that a parameter without a gradient holds back no bucket before
        it and every rank buckets alike."""
        fired = list(dict.fromkeys(self._fired))
        seen = set(fired)
        order = torch.tensor(fired + [i for i in range(len(self.params)) if i not in seen])
        self._fired = None
        if dist.get_backend(self.group) != "gloo":
            order = order.to(self.params[0].device)
        dist.broadcast(order, group=self.group, group_src=0)
        self._bucket(order.tolist())

    def remove(self) -> None:
        r"""Removes the gradient hooks."""
        for handle in self.handles:
            handle.remove()
        self.handles = []


def reduces(group=None) -> bool:
    r"""Whether gradients are summed over more than one rank."""
    return dist.is_initialized() and dist.get_world_size(group) > 1
