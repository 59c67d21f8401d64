r"""``GradientReducer``: the gradient all-reduce, overlapped with backward.

Data-parallel training sums every weight gradient over the ranks after each
backward pass. Waiting for the whole backward before the first byte moves
leaves the network idle while the last layers' gradients are ready, and the
cores idle during the all-reduce. As DDP does, the parameters are grouped
into *buckets* in the order backward produces their gradients (the model's
last parameters first); a gradient hook launches a bucket's all-reduce as
soon as all its gradients are accumulated, and :meth:`GradientReducer.wait`
waits for the buckets still in flight once backward returns.

Each parameter's gradient is a view of its bucket's buffer, allocated once
(DDP's ``gradient_as_bucket_view``): backward adds into it in place when
training zeroes the gradients in place, and the all-reduce sums the buffer
itself. No step allocates gradients or copies them into and out of a flat
buffer, and no gradient is placed among a step's freed buffers, where it
would cut the heap's free space until the next step. A gradient
set to ``None`` meanwhile (``zero_grad()``'s default) is copied in.

Buckets are launched in one fixed order on every rank (a bucket whose
gradients are ready waits for the buckets before it), so the collectives
match whatever the order the hooks fire in; a parameter that gets no
gradient in a step counts as a zero gradient, its bucket launched at
:meth:`~GradientReducer.wait`. The sum of each element is the one the flat
all-reduce computes.

Which bucket and position a gradient has decides the order in which the
all-reduce adds the ranks' values (gloo's ring sums each chunk of a buffer
starting at another rank), so with more than two ranks the bucket order
changes the sums' last bits. It is part of a run's state
(:meth:`~GradientReducer.state_dict`): a resumed run continues with the
buckets of the run it resumes, not with those of a first step.
"""
from contextlib import nullcontext
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

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
        parameters in :obj:`order` (one dtype and device each), and gives
        each bucket its buffer: the gradients of its parameters are views
        of it (their values kept), bucket 0's last element is the loss."""
        self.buckets: List[List[int]] = []
        size, kind = self.bucket_bytes, None
        for i in order:
            param = self.params[i]
            nbytes = param.numel() * param.element_size()
            if (size + nbytes > self.bucket_bytes and size > 0) or \
                    (param.dtype, param.device) != kind:
                self.buckets.append([])
                size, kind = 0, (param.dtype, param.device)
            self.buckets[-1].append(i)
            size += nbytes
        # id(parameter) -> (its index, its bucket)
        self.bucket_of = {id(self.params[i]): (i, b) for b, bucket in enumerate(self.buckets)
                          for i in bucket}
        self.flat: List[Tensor] = []
        self.views: List[Optional[Tensor]] = [None] * len(self.params)
        for b, bucket in enumerate(self.buckets):
            first = self.params[bucket[0]]
            flat = first.new_zeros(sum(self.params[i].numel() for i in bucket) + (b == 0))
            offset = 0
            with torch.no_grad():
                for i in bucket:
                    param = self.params[i]
                    view = self.views[i] = flat[offset:offset + param.numel()].view_as(param)
                    offset += param.numel()
                    if param.grad is not None:
                        view.copy_(param.grad)
                    param.grad = view
            self.flat.append(flat)

    def start(self, loss: Tensor) -> None:
        r"""Arms the hooks for this step's backward; :obj:`loss` (this
        rank's share) travels with the first bucket."""
        self._loss = loss.detach()
        self._missing = [len(bucket) for bucket in self.buckets]
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
        flat = self.flat[b]
        with torch.no_grad():
            for i in self.buckets[b]:
                grad, view = self.params[i].grad, self.views[i]
                if grad is None:  # no gradient this step, or set to None since
                    view.zero_()
                elif grad.data_ptr() != view.data_ptr():
                    view.copy_(grad)
            if b == 0:
                flat[-1] = self._loss
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
        for param, view in zip(self.params, self.views):
            param.grad = view
        total = float(self.flat[0][-1])
        finite = all(bool(torch.isfinite(flat).all()) for flat in self.flat)
        self._works = []
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

    def state_dict(self) -> Dict[str, Any]:
        r"""The bucket order (every parameter's index, bucket after bucket)
        and whether it is already the one rebuilt after the first step."""
        order = [i for bucket in self.buckets for i in bucket]
        return {"order": torch.tensor(order, dtype=torch.long),
                "rebuilt": self._fired is None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        r"""Buckets the parameters in the order of :meth:`state_dict` (the
        buckets follow from it and :attr:`bucket_bytes`); a rebuilt order
        is not rebuilt again."""
        order = state["order"].tolist()
        if sorted(order) != list(range(len(self.params))):
            raise ValueError(f"The saved gradient bucket order ({len(order)} indices) is "
                             f"not one of this model's {len(self.params)} parameters")
        self._bucket(order)
        self._fired = None if state["rebuilt"] else []

    def remove(self) -> None:
        r"""Removes the gradient hooks."""
        for handle in self.handles:
            handle.remove()
        self.handles = []


def reduces(group=None) -> bool:
    r"""Whether gradients are summed over more than one rank."""
    return dist.is_initialized() and dist.get_world_size(group) > 1
