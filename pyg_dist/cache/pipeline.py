"""PipeGCN / PSC-GCN: halo rows τ iterations stale, exchanged while the
layers compute."""
from collections import deque
from typing import Any, Deque, Dict, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from pyg_dist.cache.base import HaloCache
from pyg_dist.comm import HaloPlan
from pyg_dist.comm.halo import start_grads
from pyg_dist.comm.transfer import Transfer, start_all_to_all
from pyg_dist.options import Option

Rows = Union[Tensor, Transfer]  # received rows, or rows still in flight
# ...and the plan they were exchanged for (None: restored from a checkpoint)
InFlight = Tuple[Rows, Optional[HaloPlan]]


class _Sent(NamedTuple):
    r"""Where the gradients of a plan's sent rows go: their inner rows and,
    for gradient smoothing only, their positions in ``data.send_index``
    (what a checkpoint keeps of a plan)."""
    index: Tensor
    rows: Optional[Tensor]

    @classmethod
    def of(cls, plan: HaloPlan, smoothed: bool) -> "_Sent":
        return cls(plan.send_index, plan.send_rows() if smoothed else None)


class _Smoother:
    r""":math:`\hat h \leftarrow \gamma \hat h + (1 - \gamma) h` per row,
    with :math:`\hat h` starting at a row's first value, or at zero
    (:obj:`from_zero`, the reference PipeGCN's)."""

    def __init__(self, gamma: float, num_rows: int, from_zero: bool = False) -> None:
        self.gamma, self.num_rows, self.from_zero = gamma, num_rows, from_zero
        self.value: Optional[Tensor] = None
        self.seen: Optional[Tensor] = None

    def __call__(self, rows: Tensor, index: Tensor) -> Tensor:
        if self.value is None:
            self.value = rows.new_zeros((self.num_rows, ) + tuple(rows.shape[1:]))
            self.seen = torch.full((self.num_rows, ), self.from_zero, dtype=torch.bool,
                                   device=rows.device)
        seen = self.seen[index].view((-1, ) + (1, ) * (rows.dim() - 1))
        smoothed = torch.where(seen, self.gamma * self.value[index] + (1 - self.gamma) * rows,
                               rows)
        self.value[index] = smoothed
        self.seen[index] = True
        return smoothed

    def state_dict(self) -> Optional[Dict[str, Tensor]]:
        return None if self.value is None else {"value": self.value, "seen": self.seen}

    def load_state_dict(self, state: Optional[Dict[str, Tensor]]) -> None:
        if state is not None:
            self.value, self.seen = state["value"], state["seen"]


class _Pipe:
    r"""One layer input's pipeline: rows in flight for the coming
    iterations (forward) and gradients in flight back to their owners."""

    def __init__(self) -> None:
        self.rows: Deque[InFlight] = deque()
        self.grads: Deque[Tuple[Rows, _Sent]] = deque()
        self.fetched_at = -1
        self.backward_started = False
        self.features: Optional[_Smoother] = None
        self.gradients: Optional[_Smoother] = None


class PipelineCache(HaloCache):
    r"""Pipelined halo exchange with staleness :math:`\tau` (PipeGCN for
    :math:`\tau = 1`, PSC-GCN's :math:`\tau`-step pipeline otherwise).

    At iteration :math:`t` a layer aggregates its fresh inner rows with the
    halo rows its peers sent at iteration :math:`t - \tau`, and starts the
    exchange of its iteration-:math:`t` rows, which travels while the rest
    of the iteration computes. The backward mirrors it: owners add the halo
    gradients of iteration :math:`t - \tau` and send the current ones:

    .. math::
        H^{(\ell)}_t = f\big(H^{(\ell-1)}_{t,\mathrm{inner}},\,
        H^{(\ell-1)}_{t-\tau,\mathrm{halo}}\big), \qquad
        \nabla H^{(\ell-1)}_{t,\mathrm{inner}} \mathrel{+}=
        \nabla H^{(\ell-1)}_{t-\tau,\mathrm{halo}}.

    With smoothing (PipeGCN-F / -G / -GF) the stale values are replaced by
    their moving averages :math:`\hat h_t = \gamma \hat h_{t-1} + (1 -
    \gamma) h_{t-\tau}`, per halo row (features) and per sent row
    (gradients).

    Iteration 0 has no stale value. By default (``start="sync"``, improving
    on the reference) it exchanges synchronously, so it is exact, and
    :math:`\hat h` starts at the first value received; until iteration
    :math:`\tau` the stale value is that first one. ``start="zero"`` is
    the reference PipeGCN's start, for curves comparable with the paper's:
    until iteration :math:`\tau` the halo rows and the gradients owners
    add are zero (:math:`h_{t-\tau} = 0` for :math:`t < \tau`), and the
    moving averages start at :math:`\hat h_{-1} = 0`.

    Under a sampler the exchange started at iteration :math:`t` already
    carries the rows of plan :math:`t + \tau` (plans are drawn
    :math:`\tau` iterations ahead, as PSC-GCN does).

    Dropout goes after the exchange: layers send their input before
    dropout and drop the received rows locally, so a forward and its
    backward use the same mask.

    Args:
        staleness: :math:`\tau \geq 1`, the number of exchanges in flight.
        smooth_features: :math:`\gamma` for the halo rows (``None``: off).
        smooth_grads: :math:`\gamma` for the halo gradients (``None``: off).
        start: ``"sync"`` (an exact first iteration) or ``"zero"`` (zero
            halo rows and gradients until iteration :math:`\tau`,
            smoothing from zero).
    """
    stale = True
    options = (
        Option("staleness", 1, "exchanges in flight, tau", int),
        Option("smooth_features", None, "smooth stale features (PipeGCN-F) with decay GAMMA",
               float, const=0.95),
        Option("smooth_grads", None, "smooth stale gradients (PipeGCN-G) with decay GAMMA",
               float, const=0.95),
        Option("start", "sync", "iteration 0: sync (exchange synchronously: exact) or zero "
               "(the reference PipeGCN: zero halo rows and gradients, smoothing from zero)",
               str, flag="--pipeline-start"),
    )
    STARTS = ("sync", "zero")

    def __init__(self, staleness: int = 1, smooth_features: Optional[float] = None,
                 smooth_grads: Optional[float] = None, start: str = "sync") -> None:
        super().__init__()
        self.check(staleness=staleness, smooth_features=smooth_features,
                   smooth_grads=smooth_grads, start=start)
        self.lookahead = self.staleness = int(staleness)
        self.smooth_features, self.smooth_grads = smooth_features, smooth_grads
        self.start = start
        self.pipes = {}

    @classmethod
    def check(cls, staleness: int = 1, smooth_features: Optional[float] = None,
              smooth_grads: Optional[float] = None, start: str = "sync") -> None:
        if int(staleness) != staleness or staleness < 1:
            raise ValueError(f"staleness must be an integer >= 1 (got {staleness})")
        if start not in cls.STARTS:
            raise ValueError(f"start must be one of {', '.join(cls.STARTS)} (got '{start}')")
        for name, gamma in (("smooth_features", smooth_features),
                            ("smooth_grads", smooth_grads)):
            if gamma is not None and not 0 <= gamma < 1:
                raise ValueError(f"{name} (the decay gamma) must be in [0, 1) (got {gamma})")

    def fetch(self, key: str, x: Tensor, plan: HaloPlan,
              upcoming: Sequence[HaloPlan] = ()) -> Tensor:
        ctx, tau = self.ctx, self.staleness
        # Without plans drawn ahead, the plan is taken to stay (e.g. exact).
        ahead = list(upcoming) + [plan] * (tau - len(upcoming))
        inputs, x = x, x.detach()
        pipe = self.pipes.get(key)
        if pipe is None:
            pipe = self.pipes[key] = _Pipe()
            if self.start == "zero":  # nothing received before iteration τ
                rows = x.new_zeros((plan.num_recv, ) + tuple(x.shape[1:]))
                pipe.rows.extend((x.new_zeros((p.num_recv, ) + tuple(x.shape[1:])), p)
                                 for p in ahead[:-1])
                pipe.rows.append((self._start(key, x, ahead[-1]), ahead[-1]))
            else:  # exchange synchronously: the first iteration is exact
                rows = self._start(key, x, plan).wait()
                pipe.rows.extend((rows if p is plan else self._start(key, x, p), p)
                                 for p in ahead)
            zero = self.start == "zero"
            if self.smooth_features is not None:
                pipe.features = _Smoother(self.smooth_features, ctx.data.num_halo, zero)
            if self.smooth_grads is not None:
                pipe.gradients = _Smoother(self.smooth_grads, ctx.data.send_index.numel(),
                                           zero)
        else:
            if pipe.fetched_at == self.iteration:
                raise RuntimeError(f"Layer '{key}' fetched its halo rows twice in one "
                                   f"iteration: call cache.step() after each iteration")
            pipe.rows.append((self._start(key, x, ahead[tau - 1]), ahead[tau - 1]))
            rows, started_for = pipe.rows.popleft()
            if started_for is not plan and started_for is not None:  # all ranks raise
                raise RuntimeError(
                    f"Layer '{key}': the rows exchanged {tau} iteration(s) ago were for "
                    f"another plan than this iteration's: pass the plans of the coming "
                    f"iterations as `upcoming` (ctx.use(plan, upcoming=...))")
            rows = self._wait(rows)
        pipe.fetched_at = self.iteration
        if pipe.features is not None:
            rows = pipe.features(rows, plan.recv_rows())
        return _StaleHalo.apply(inputs, rows, self, key, plan)

    def _start(self, key: str, x: Tensor, plan: HaloPlan) -> Transfer:
        ctx = self.ctx
        return start_all_to_all(x.index_select(0, plan.send_index), plan.send_counts,
                                plan.recv_counts, ctx.group, ctx.codec, ctx.stats, key)

    @staticmethod
    def _wait(rows: Rows) -> Tensor:
        return rows if isinstance(rows, Tensor) else rows.wait()

    def backward(self, key: str, plan: HaloPlan, grad_halo: Tensor) -> Tensor:
        r"""The gradient of this rank's inner rows from its peers' halo
        gradients of iteration :math:`t - \tau`; sends the current ones."""
        ctx, pipe = self.ctx, self.pipes[key]
        pending = start_grads(grad_halo, plan, ctx.group, ctx.stats, key, ctx.codec)
        if not pipe.backward_started:  # first iteration: synchronous, then τ-stale
            pipe.backward_started = True
            sent = _Sent.of(plan, pipe.gradients is not None)
            if self.start == "zero":  # owners add nothing before iteration τ
                zero = grad_halo.new_zeros((plan.num_send, ) + tuple(grad_halo.shape[1:]))
                pipe.grads.extend([(zero, sent)] * self.staleness + [(pending, sent)])
            else:
                pipe.grads.extend([(self._wait(pending), sent)] * (self.staleness + 1))
        else:
            pipe.grads.append((pending, _Sent.of(plan, pipe.gradients is not None)))
        received, sent = pipe.grads.popleft()
        received = self._wait(received)
        if pipe.gradients is not None:
            received = pipe.gradients(received, sent.rows)
        grad = received.new_zeros((ctx.num_inner, ) + tuple(received.shape[1:]))
        return grad.index_add_(0, sent.index, received)

    def state_dict(self) -> Dict[str, Any]:
        r"""The rows and gradients in flight (waited for: a checkpoint holds
        values), the smoothers' averages and the iteration. The plans the
        rows were exchanged for are not kept: on resume the sampler draws
        them again (functions of the seed and the iteration)."""
        pipes = {}
        for key, pipe in self.pipes.items():
            pipe.rows = deque((self._wait(rows), plan) for rows, plan in pipe.rows)
            pipe.grads = deque((self._wait(grads), sent) for grads, sent in pipe.grads)
            pipes[key] = {
                "rows": [rows for rows, _ in pipe.rows],
                "grads": [(grads, sent.index, sent.rows) for grads, sent in pipe.grads],
                "fetched_at": pipe.fetched_at, "backward_started": pipe.backward_started,
                "features": pipe.features.state_dict() if pipe.features else None,
                "gradients": pipe.gradients.state_dict() if pipe.gradients else None}
        return {**super().state_dict(), "pipes": pipes}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        num_halo, num_send = self.ctx.data.num_halo, self.ctx.data.send_index.numel()
        self.pipes = {}
        for key, saved in state["pipes"].items():
            pipe = self.pipes[key] = _Pipe()
            pipe.rows.extend((rows, None) for rows in saved["rows"])
            pipe.grads.extend((grads, _Sent(index, rows))
                              for grads, index, rows in saved["grads"])
            pipe.fetched_at, pipe.backward_started = (saved["fetched_at"],
                                                      saved["backward_started"])
            zero = self.start == "zero"
            if self.smooth_features is not None:
                pipe.features = _Smoother(self.smooth_features, num_halo, zero)
                pipe.features.load_state_dict(saved["features"])
            if self.smooth_grads is not None:
                pipe.gradients = _Smoother(self.smooth_grads, num_send, zero)
                pipe.gradients.load_state_dict(saved["gradients"])

    def finish(self) -> None:
        errors = []
        try:
            for pipe in self.pipes.values():
                for rows, _ in list(pipe.rows) + list(pipe.grads):
                    if isinstance(rows, Transfer):
                        try:
                            rows.wait()
                        except Exception as e:  # wait for the others all the same
                            errors.append(e)
        finally:
            self.pipes.clear()
        if errors:
            raise errors[0]

    def extra_repr(self) -> str:
        return (f"staleness={self.staleness}, smooth_features={self.smooth_features}, "
                f"smooth_grads={self.smooth_grads}, start={self.start!r}")


class _StaleHalo(torch.autograd.Function):
    r"""Returns the stale halo rows as a function of :obj:`x` whose
    backward is the cache's pipelined gradient exchange."""

    @staticmethod
    def forward(ctx, x: Tensor, rows: Tensor, cache: PipelineCache, key: str,
                plan: HaloPlan) -> Tensor:
        ctx.cache, ctx.key, ctx.plan = cache, key, plan
        return rows.clone()  # a queue entry may be served more than once

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        return ctx.cache.backward(ctx.key, ctx.plan, grad_halo.contiguous()), \
            None, None, None, None
