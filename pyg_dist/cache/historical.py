"""SANCUS: historical halo embeddings with bounded staleness and
skip-broadcast."""
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.cache.base import HaloCache
from pyg_dist.comm import HaloPlan
from pyg_dist.comm.exchange import exchange_rows, return_grads
from pyg_dist.options import Option

BOUNDS = ("fixed", "adaptive", "gap")


def parse_bound(bound: str) -> Tuple[str, float]:
    r"""``"fixed:E"``, ``"adaptive:A"`` (epochs, integers >= 0) or
    ``"gap:H"`` (relative variation > 0) → ``(kind, value)``."""
    kind, _, value = str(bound).partition(":")
    try:
        number = float(value)
    except ValueError:
        number = None
    if kind not in BOUNDS or number is None:
        raise ValueError(f"bound must be fixed:E, adaptive:A or gap:H (got '{bound}')")
    if kind == "gap":
        if not number > 0:
            raise ValueError(f"gap:H needs H > 0 (got {value})")
        return kind, number
    if number != int(number) or number < 0:
        raise ValueError(f"{kind}:{value}: the staleness bound is a number of epochs >= 0")
    return kind, int(number)


@dataclass
class _History:
    r"""One layer input's historical rows: what this rank holds of its
    peers' rows (receiver side) and what it last sent (owner side)."""
    rows: Tensor  # [num_halo, F] the cached halo rows
    version: Tensor  # [num_halo] iteration each cached row was computed at; -1: never
    sent_version: Tensor  # [num_send] iteration each send row was last sent at
    sent_rows: Optional[Tensor] = None  # [num_send, F] their values (gap bound)
    last_broadcast: Optional[int] = None  # fixed bound: the shared schedule
    log: List[Tuple[int, List[int], List[int]]] = field(default_factory=list)


class HistoricalCache(HaloCache):
    r"""SANCUS's historical embeddings: every rank keeps the last halo rows
    it received for each layer with their version (the iteration they were
    computed at), and an owner *skips* sending a layer's rows while the
    staleness bound holds (skip-broadcast):

    * ``fixed:E`` (Def. 1): all ranks resend every layer every :math:`E + 1`
      iterations, so a row in use is never more than :math:`E` old
      (under a sampler, a row the last resend did not carry also travels
      when it would be older). A shared schedule: no message says what comes.
    * ``adaptive:A`` (Def. 2): a row is resent to a receiver when the
      receiver's copy would be more than :math:`A` iterations old; owner
      and receiver each keep the versions, so both know without a message.
      Per row and per receiver: under a sampler, rows age apart.
    * ``gap:H`` (Def. 3): an owner resends a layer's rows when they moved,
      relative to what it last sent, by more than :math:`H`:
      :math:`\|H - \tilde H\|_F > H \cdot \|\tilde H\|_F` (relative, so one
      :math:`H` fits every layer's scale). A one-flag-per-rank all-reduce
      tells the receivers which owners resend.

    A row a plan needs that a receiver has never received always travels.
    Gradients of the halo rows travel back to their owners every iteration,
    as SANCUS broadcasts them (they are taken at the cached values).

    Counters: :attr:`max_age` (the oldest row served, in iterations) and
    :attr:`max_gap` (the largest relative variation an owner skipped) per
    layer, and ``bytes_saved`` in the context's stats; with :obj:`record`,
    every exchange's counts per layer (``history[key].log``).
    """
    stale = True
    options = (Option("bound", "adaptive:1", "fixed:E | adaptive:A | gap:H"), )

    def __init__(self, bound: str = "adaptive:1", record: bool = False) -> None:
        super().__init__()
        self.kind, self.bound = parse_bound(bound)
        self.record = record  # keep a log of every exchange (tests)
        self.history: Dict[str, _History] = {}
        self.max_age: Dict[str, int] = {}
        self.max_gap: Dict[str, float] = {}

    @classmethod
    def check(cls, bound: str = "adaptive:1") -> None:
        parse_bound(bound)

    def fetch(self, key: str, x: Tensor, plan: HaloPlan,
              upcoming: Sequence[HaloPlan] = ()) -> Tensor:
        ctx, t = self.ctx, self.iteration
        inputs, x = x, x.detach()
        state = self.history.get(key)
        if state is None or state.rows.shape[1:] != x.shape[1:]:
            state = self.history[key] = self._new_state(x)
        recv, send = plan.recv_rows(), plan.send_rows()
        recv_fetch, send_fetch = state.version[recv] < 0, state.sent_version[send] < 0
        if self.kind == "fixed":
            if state.last_broadcast is None or t - state.last_broadcast > self.bound:
                state.last_broadcast = t
                recv_fetch[:], send_fetch[:] = True, True
            # A sampled plan may need a row the last broadcast did not carry.
            recv_fetch |= t - state.version[recv] > self.bound
            send_fetch |= t - state.sent_version[send] > self.bound
        elif self.kind == "adaptive":
            recv_fetch |= t - state.version[recv] > self.bound
            send_fetch |= t - state.sent_version[send] > self.bound
        else:
            resend = self._owners_resending(key, state, x, plan, send, send_fetch)
            recv_fetch |= resend[ctx.data.halo_owner[recv]]
            send_fetch |= resend[ctx.rank]
        self._refresh(key, state, x, recv[recv_fetch], send[send_fetch], plan)
        age = t - state.version[recv]
        self.max_age[key] = max(self.max_age.get(key, 0),
                                int(age.max()) if age.numel() else 0)
        return _HistoricalHalo.apply(inputs, state.rows[recv], self, key, plan)

    def _new_state(self, x: Tensor) -> _History:
        data = self.ctx.data
        num_send = data.send_index.numel()
        return _History(
            rows=x.new_zeros((data.num_halo, ) + tuple(x.shape[1:])),
            version=torch.full((data.num_halo, ), -1, dtype=torch.long, device=x.device),
            sent_version=torch.full((num_send, ), -1, dtype=torch.long, device=x.device),
            sent_rows=(x.new_zeros((num_send, ) + tuple(x.shape[1:]))
                       if self.kind == "gap" else None))

    def _owners_resending(self, key: str, state: _History, x: Tensor, plan: HaloPlan,
                          send: Tensor, never_sent: Tensor) -> Tensor:
        r"""Which ranks resend this layer (gap bound): each owner checks its
        own rows, one flag per rank travels."""
        ctx = self.ctx
        sent_before = send[~never_sent]
        current = x[ctx.data.send_index[sent_before]]
        previous = state.sent_rows[sent_before]
        gap = float((current - previous).norm() / previous.norm().clamp(min=1e-30)) \
            if sent_before.numel() else 0.0
        flags = torch.zeros(ctx.world_size, dtype=torch.int32, device=x.device)
        flags[ctx.rank] = int(gap > self.bound)
        with ctx.stats.timer("comm"):
            dist.all_reduce(flags, group=ctx.group)
        ctx.stats.add_bytes("flags", flags.numel() * 4, flags.numel() * 4)
        if not flags[ctx.rank]:
            self.max_gap[key] = max(self.max_gap.get(key, 0.0), gap)
        return flags.bool()

    def _refresh(self, key: str, state: _History, x: Tensor, recv: Tensor, send: Tensor,
                 plan: HaloPlan) -> None:
        r"""Exchanges the chosen rows (halo rows :obj:`recv`, send rows
        :obj:`send`) and stamps them with the current iteration."""
        ctx, t = self.ctx, self.iteration
        data = ctx.data
        halo_keep = torch.zeros(data.num_halo, dtype=torch.bool, device=x.device)
        halo_keep[recv] = True
        send_keep = torch.zeros(data.send_index.numel(), dtype=torch.bool, device=x.device)
        send_keep[send] = True
        sub = HaloPlan.sampled(data, send_keep, halo_keep)
        if self.record:
            state.log.append((t, sub.send_counts, sub.recv_counts))
        rows, row_bytes = exchange_rows(x, sub, ctx.group, ctx.stats, key, ctx.codec)
        ctx.stats.count("bytes_saved", (plan.num_send - sub.num_send) * row_bytes)
        state.rows[recv] = rows
        state.version[recv] = t
        state.sent_version[send] = t
        if state.sent_rows is not None:
            state.sent_rows[send] = x[data.send_index[send]]

    def backward(self, key: str, plan: HaloPlan, grad_halo: Tensor) -> Tensor:
        ctx = self.ctx
        return return_grads(grad_halo, plan, plan.num_inner, ctx.group, ctx.stats, key,
                            ctx.codec)

    def finish(self) -> None:
        self.history.clear()

    def state_dict(self) -> Dict[str, Any]:
        history = {key: {f.name: getattr(h, f.name) for f in fields(h) if f.name != "log"}
                   for key, h in self.history.items()}
        return {**super().state_dict(), "history": history, "max_age": dict(self.max_age),
                "max_gap": dict(self.max_gap)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.history = {key: _History(**h) for key, h in state["history"].items()}
        self.max_age, self.max_gap = dict(state["max_age"]), dict(state["max_gap"])

    def extra_repr(self) -> str:
        return f"bound='{self.kind}:{self.bound}'"


class _HistoricalHalo(torch.autograd.Function):
    r"""The cached halo rows as a function of :obj:`x`: their gradients go
    to the owners' current rows."""

    @staticmethod
    def forward(ctx, x: Tensor, rows: Tensor, cache: HistoricalCache, key: str,
                plan: HaloPlan) -> Tensor:
        ctx.cache, ctx.key, ctx.plan = cache, key, plan
        return rows

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        return ctx.cache.backward(ctx.key, ctx.plan, grad_halo.contiguous()), \
            None, None, None, None
