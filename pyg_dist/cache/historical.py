"""SANCUS: historical halo embeddings with bounded staleness and
skip-broadcast."""
import math
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.cache.base import HaloCache
from pyg_dist.comm import HaloPlan
from pyg_dist.comm.broadcast import (block_sizes, broadcast_blocks, halo_of_blocks,
                                     halo_ranges, reduce_blocks, require_full_plan)
from pyg_dist.comm.halo import exchange_rows, return_grads
from pyg_dist.comm.transfer import wire_row_bytes
from pyg_dist.options import Option

BOUNDS = ("fixed", "adaptive", "age", "gap", "gap-abs")
# Bounds counted in iterations, and those on the embeddings' variation.
EPOCH_BOUNDS, GAP_BOUNDS = ("fixed", "adaptive", "age"), ("gap", "gap-abs")
# The layout of state_dict(): 2 since 'adaptive' is the paper's Algorithm 5.
STATE_FORMAT = 2


def parse_bound(bound: str) -> Tuple[str, float]:
    r"""``"fixed:E"``, ``"adaptive:A"``, ``"age:A"`` (iterations, integers
    >= 0), ``"gap:H"`` (relative variation > 0) or ``"gap-abs:H"``
    (absolute variation > 0) → ``(kind, value)``."""
    kind, _, value = str(bound).partition(":")
    try:
        number = float(value)
    except ValueError:
        number = None
    if kind not in BOUNDS or number is None:
        raise ValueError(f"bound must be fixed:E, adaptive:A, age:A, gap:H or gap-abs:H "
                         f"(got '{bound}')")
    if kind in GAP_BOUNDS:
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"{kind}:H needs H > 0 and finite (got {value})")
        return kind, number
    if not math.isfinite(number) or number != int(number) or number < 0:
        raise ValueError(f"{kind}:{value}: the staleness bound is a number of epochs >= 0")
    return kind, int(number)


def _checked_bound(text: str) -> str:
    parse_bound(text)
    return text


@dataclass
class _History:
    r"""One layer input's historical rows: what this rank holds of its
    peers' rows (receiver side) and what it last sent (owner side)."""
    rows: Tensor  # [num_halo, F] the cached halo rows
    version: Tensor  # [num_halo] iteration each cached row was computed at; -1: never
    sent_version: Tensor  # [num_send] iteration each send row was last sent at
    # Gap bounds: the values last sent ([num_send, F]; the broadcast exchange: the
    # whole block, [num_inner, F]).
    sent_rows: Optional[Tensor] = None
    last_broadcast: Optional[int] = None  # fixed bound: the shared schedule
    # adaptive bound: the owners this rank found too stale at the last
    # iteration (Algorithm 5's flags F(j)), acted on at the next.
    flags: Optional[Tensor] = None
    # broadcast exchange: the iteration each rank last broadcast its block (-1: never).
    block_version: Optional[Tensor] = None
    log: List[Tuple[int, List[int], List[int]]] = field(default_factory=list)


class HistoricalCache(HaloCache):
    r"""SANCUS's historical embeddings (Peng et al., §4.3): every rank keeps
    the last halo rows it received for each layer with their version (the
    iteration they were computed at), and an owner *skips* sending a
    layer's rows while the staleness bound holds (skip-broadcast). With
    ``exchange="halo"`` an owner resends the rows its peers need, with
    ``exchange="broadcast"`` its whole block (SANCUS's one-to-all
    broadcasts, :mod:`pyg_dist.comm.broadcast`). The bounds (an iteration
    of full-graph training is an epoch):

    * ``fixed:E`` (Def. 1, Alg. 4, SCS-E): all ranks resend every layer
      every :math:`E + 1` iterations, so a row in use is never more than
      :math:`E` old (under a sampler, a row the last resend did not carry
      also travels when it would be older). A shared schedule: no message.
    * ``adaptive:A`` (Def. 2, Alg. 5, SCS-A): each receiver :math:`i`
      checks, after using them at iteration :math:`t`, the rows of every
      owner :math:`j` it reads: if :math:`t - \mathrm{Ver}_i(j) > A`
      (:math:`\mathrm{Ver}_i(j)` the oldest version of them), it flags
      :math:`F(j) \leftarrow \mathrm{ACTIVE}`, and :math:`j` resends at the
      next iteration (one all-reduce of one flag per rank carries the
      flags). On the exact plan an owner so resends :math:`A + 2`
      iterations after its last resend and a row in use is at most
      :math:`A + 1` old, as in the paper's Fig. 14(b) (:math:`A = 1`:
      computed at 7, found too stale at 9, resent at 10), where ``fixed:A``
      resends every :math:`A + 1`. Under a sampler a row a plan needs that
      is older than :math:`A + 1` also travels at once, so no row in use is
      older.
    * ``age:A``: a row is resent to a receiver when the receiver's copy
      would be more than :math:`A` iterations old; owner and receiver each
      keep the versions, so both know without a message. Per row and per
      receiver (under a sampler rows age apart); on the exact plan the
      schedule of ``fixed:A``. (This was ``adaptive:A`` before it followed
      Algorithm 5.)
    * ``gap-abs:H`` (Def. 3, Alg. 6, SCS-H): an owner resends a layer's
      rows when they moved, from what it last sent, by more than :math:`H`:
      :math:`\|H_i - \tilde H_i\|_F > H`, the paper's absolute bound (the
      paper does not name the norm; the Frobenius norm of the rows that
      travel, so the same :math:`H` allows less change per row on a larger
      block).
    * ``gap:H``: the same check relative to the rows' size,
      :math:`\|H_i - \tilde H_i\|_F > H \cdot \|\tilde H_i\|_F`, so one
      :math:`H` fits every layer's scale.

    The gap bounds decide on the owner, and one all-reduce of one flag per
    rank tells the receivers which owners resend. A row a plan needs that a
    receiver has never received always travels. Gradients of the halo rows
    travel back to their owners every iteration, as SANCUS broadcasts them
    (they are taken at the cached values).

    Counters: :attr:`max_age` (the oldest row served, in iterations) and
    :attr:`max_gap` (the largest variation an owner skipped, in the bound's
    unit) per layer, and ``bytes_saved`` in the context's stats; with
    :obj:`record`, every exchange's counts per layer (``history[key].log``).
    """
    stale = True
    whole_blocks = True
    options = (Option("bound", "adaptive:1",
                      "fixed:E | adaptive:A | age:A | gap:H (relative) | gap-abs:H",
                      type=_checked_bound), )

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
        ctx = self.ctx
        inputs, x = x, x.detach()
        state = self.history.get(key)
        if state is None or state.rows.shape[1:] != x.shape[1:]:
            state = self.history[key] = self._new_state(x)
        if ctx.exchange.whole_blocks:
            require_full_plan(plan, ctx.data)
            recv = plan.recv_rows()
            self._broadcast(key, state, x, self._active_owners(key, state, x))
        else:
            recv = self._exchange(key, state, x, plan)
        age = self.iteration - state.version[recv]
        self.max_age[key] = max(self.max_age.get(key, 0),
                                int(age.max()) if age.numel() else 0)
        if self.kind == "adaptive":  # Algorithm 5: flag the owners too stale
            state.flags = torch.zeros(ctx.world_size, dtype=torch.int32, device=x.device)
            state.flags[ctx.data.halo_owner[recv][age > self.bound]] = 1
        return _HistoricalHalo.apply(inputs, state.rows[recv], self, key, plan)

    def _new_state(self, x: Tensor) -> _History:
        ctx = self.ctx
        data, device = ctx.data, x.device
        broadcast = ctx.exchange.whole_blocks
        num_send = 0 if broadcast else data.send_index.numel()
        num_sent_rows = data.num_inner if broadcast else num_send
        return _History(
            rows=x.new_zeros((data.num_halo, ) + tuple(x.shape[1:])),
            version=torch.full((data.num_halo, ), -1, dtype=torch.long, device=device),
            sent_version=torch.full((num_send, ), -1, dtype=torch.long, device=device),
            sent_rows=(x.new_zeros((num_sent_rows, ) + tuple(x.shape[1:]))
                       if self.kind in GAP_BOUNDS else None),
            block_version=(torch.full((ctx.world_size, ), -1, dtype=torch.long,
                                      device=device) if broadcast else None))

    # -- the halo exchange: rows -------------------------------------------------------

    def _exchange(self, key: str, state: _History, x: Tensor, plan: HaloPlan) -> Tensor:
        r"""Refreshes the rows of :obj:`plan` the bound says travel (halo
        exchange); returns the partition's halo rows the plan receives."""
        ctx, t, bound = self.ctx, self.iteration, self.bound
        recv, send = plan.recv_rows(), plan.send_rows()
        recv_age, send_age = t - state.version[recv], t - state.sent_version[send]
        recv_fetch, send_fetch = state.version[recv] < 0, state.sent_version[send] < 0
        if self.kind == "fixed":
            if state.last_broadcast is None or t - state.last_broadcast > bound:
                state.last_broadcast = t
                recv_fetch[:], send_fetch[:] = True, True
            # A sampled plan may need a row the last broadcast did not carry.
            recv_fetch |= recv_age > bound
            send_fetch |= send_age > bound
        elif self.kind == "age":
            recv_fetch |= recv_age > bound
            send_fetch |= send_age > bound
        else:  # adaptive and the gap bounds: whole owners resend
            resend = self._owners_resending(key, state, x, send[~send_fetch],
                                            ctx.data.send_index)
            recv_fetch |= resend[ctx.data.halo_owner[recv]]
            send_fetch |= resend[ctx.rank]
            if self.kind == "adaptive":
                # A sampled plan may need a row older than the flags allow.
                recv_fetch |= recv_age > bound + 1
                send_fetch |= send_age > bound + 1
        self._refresh(key, state, x, recv[recv_fetch], send[send_fetch], plan)
        return recv

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

    # -- the broadcast exchange: whole blocks ------------------------------------------

    def _active_owners(self, key: str, state: _History, x: Tensor) -> Tensor:
        r"""Which ranks broadcast their block of this layer now (broadcast
        exchange): a bool per rank, the same on every rank."""
        t, bound = self.iteration, self.bound
        never = state.block_version < 0
        if self.kind == "fixed":
            if state.last_broadcast is None or t - state.last_broadcast > bound:
                state.last_broadcast = t
                return torch.ones_like(never)
            return never
        if self.kind == "age":
            return never | (t - state.block_version > bound)
        rows = None if bool(never[self.ctx.rank]) else torch.arange(x.size(0),
                                                                      device=x.device)
        return never | self._owners_resending(key, state, x, rows, None)

    def _broadcast(self, key: str, state: _History, x: Tensor, active: Tensor) -> None:
        r"""The :obj:`active` ranks broadcast their whole block; every rank
        stamps the halo rows it takes from them with the current iteration."""
        ctx, t = self.ctx, self.iteration
        data, rank = ctx.data, ctx.rank
        sizes, sources = block_sizes(data), active.tolist()
        blocks = broadcast_blocks(x, sources, sizes, ctx.group, ctx.stats, key, ctx.codec)
        if self.record:
            state.log.append((t, [sizes[rank] if sources[rank] and q != rank else 0
                                  for q in range(ctx.world_size)],
                              [sizes[q] if q in blocks else 0
                               for q in range(ctx.world_size)]))
        halo_of_blocks(blocks, data, state.rows)
        ranges = halo_ranges(data)
        for q in blocks:
            state.version[ranges[q]] = t
        state.block_version[active] = t
        if sources[rank]:
            if state.sent_rows is not None:
                state.sent_rows.copy_(x)
        else:
            ctx.stats.count("bytes_saved", (ctx.world_size - 1) * sizes[rank]
                            * wire_row_bytes(x, ctx.codec))

    # -- who resends (adaptive, gap bounds) ------------------------------------------

    def _owners_resending(self, key: str, state: _History, x: Tensor,
                          sent_before: Optional[Tensor], index: Optional[Tensor]) -> Tensor:
        r"""Which ranks resend this layer, one flag per rank all-reduced:
        adaptive, the flags the receivers raised at the last iteration
        (Algorithm 5); the gap bounds, each owner's check of its own rows
        (:obj:`sent_before`: the positions of its rows sent before, in
        ``sent_rows``; :obj:`index`: their inner rows, ``None``: the same)."""
        ctx = self.ctx
        if self.kind == "adaptive":
            flags = (state.flags.clone() if state.flags is not None else
                     torch.zeros(ctx.world_size, dtype=torch.int32, device=x.device))
        else:
            gap = 0.0
            if sent_before is not None and sent_before.numel():
                rows = sent_before if index is None else index[sent_before]
                previous = state.sent_rows[sent_before]
                gap = float((x[rows] - previous).norm())
                if self.kind == "gap":
                    gap /= max(float(previous.norm()), 1e-30)
            flags = torch.zeros(ctx.world_size, dtype=torch.int32, device=x.device)
            flags[ctx.rank] = int(gap > self.bound)
            if not flags[ctx.rank]:
                self.max_gap[key] = max(self.max_gap.get(key, 0.0), gap)
        with ctx.stats.timer("comm"):
            dist.all_reduce(flags, group=ctx.group)
        ctx.stats.add_bytes("flags", flags.numel() * 4, flags.numel() * 4)
        return flags > 0

    def backward(self, key: str, plan: HaloPlan, grad_halo: Tensor) -> Tensor:
        ctx = self.ctx
        if ctx.exchange.whole_blocks:
            return reduce_blocks(grad_halo, ctx.data, ctx.group, ctx.stats, key, ctx.codec)
        return return_grads(grad_halo, plan, plan.num_inner, ctx.group, ctx.stats, key,
                            ctx.codec)

    def finish(self) -> None:
        self.history.clear()

    def state_dict(self) -> Dict[str, Any]:
        history = {key: {f.name: getattr(h, f.name) for f in fields(h) if f.name != "log"}
                   for key, h in self.history.items()}
        return {**super().state_dict(), "history": history, "max_age": dict(self.max_age),
                "max_gap": dict(self.max_gap), "format": STATE_FORMAT}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("format", 1) < 2 and self.kind == "adaptive":
            # Written when 'adaptive:A' was the per-row bound: resume with it.
            warnings.warn(f"pyg_dist: this checkpoint's bound 'adaptive:{self.bound}' was "
                          f"written when it meant the per-row bound now called "
                          f"'age:{self.bound}'; the run resumes with that bound (new runs "
                          f"with 'adaptive:A' follow the paper's Algorithm 5)",
                          FutureWarning, stacklevel=2)
            self.kind = "age"
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
