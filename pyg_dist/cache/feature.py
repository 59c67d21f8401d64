"""PSC-GCN's inclusion-aware cache of the input features of halo nodes."""
import re
from typing import NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from pyg_dist.comm import HaloPlan
from pyg_dist.comm.bitmask import tell_owners
from pyg_dist.comm.halo import exchange_rows

POLICIES = ("inclusion", "degree", "random")
_UNITS = {"KB": 2 ** 10, "MB": 2 ** 20, "GB": 2 ** 30}


def parse_capacity(capacity: Union[int, str]) -> Tuple[float, str]:
    r"""``1000`` (rows), ``"25%"`` (of the halo rows) or ``"8MB"``
    (``KB``/``MB``/``GB``) → a validated ``(number, unit)``, unit ``""``
    for rows."""
    text = str(capacity).strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(%|KB|MB|GB)?", text, re.IGNORECASE)
    if match is None:
        raise ValueError(f"feature cache capacity must be rows (e.g. 1000), a share of "
                         f"the halo rows (e.g. 25%) or a size (e.g. 8MB) (got '{capacity}')")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    if unit == "%" and number > 100:
        raise ValueError(f"feature cache capacity {text} is more than 100%")
    if unit == "" and number != int(number):
        raise ValueError(f"feature cache capacity in rows must be an integer (got {text})")
    return number, unit


def capacity_rows(capacity: Union[int, str], num_halo: int, row_bytes: int) -> int:
    r"""How many of :obj:`num_halo` rows of :obj:`row_bytes` bytes a cache
    of :obj:`capacity` (see :func:`parse_capacity`) holds."""
    number, unit = parse_capacity(capacity)
    if unit == "%":
        rows = number / 100 * num_halo
    elif unit:
        rows = number * _UNITS[unit] / row_bytes
    else:
        rows = number
    return min(int(rows), num_halo)


class _Generation(NamedTuple):
    r"""One choice of cached rows: the halo rows this rank caches, the send
    rows its peers cache, and the cached values."""
    cached: Tensor  # [num_halo] bool
    peer_cached: Tensor  # [num_send] bool
    slot: Tensor  # [num_halo] row of `rows` holding a cached halo row (-1: none)
    rows: Tensor  # [num_cached, F]


class FeatureCache:
    r"""Keeps the layer-0 input features of chosen halo nodes on this rank so
    that they are never fetched again (input features do not change).

    Policies (PSC-GCN §V and the baselines it is compared with):

    * ``inclusion``: the halo nodes most likely to be needed, by their
      inclusion probability :math:`1 - \prod_i (1 - p_{ij})` over the inner
      nodes :math:`i` they feed, from the sampler's edge probabilities;
      refreshed when the sampler refreshes them (ties: local fan-out);
    * ``degree`` (PaGraph): the halo nodes with most local out-edges;
    * ``random``: a seeded random choice.

    The capacity is a number of rows, a share of the halo rows (``"25%"``)
    or a size (``"8MB"``). When the choice changes, receivers tell the
    owners which rows they cache (one bit per halo row) and fetch the new
    rows once. Every plan's exchange then leaves out the cached rows, on
    both sides. Counts ``cache_hits``, ``cache_lookups`` and
    ``bytes_saved`` in the context's stats.
    """

    def __init__(self, policy: str = "inclusion", capacity: Union[int, str] = "25%",
                 seed: int = 0) -> None:
        self.check(policy, capacity)
        self.policy, self.capacity, self.seed = policy, str(capacity).strip(), seed
        self.ctx = self.sampler = None
        self.generation: Optional[_Generation] = None
        self.version = None  # the sampler probabilities the choice was made from

    @classmethod
    def check(cls, policy: str = "inclusion", capacity: Union[int, str] = "25%") -> None:
        if policy not in POLICIES:
            raise ValueError(f"Unknown feature cache policy '{policy}' "
                             f"(choose from {', '.join(POLICIES)})")
        parse_capacity(capacity)

    def attach(self, ctx, sampler=None) -> None:
        r"""Binds the cache to a model's context and (for ``inclusion``)
        the sampler whose probabilities it follows."""
        self.ctx, self.sampler = ctx, sampler

    def num_rows(self, x: Tensor) -> int:
        return capacity_rows(self.capacity, self.ctx.data.num_halo,
                             x[0].numel() * x.element_size())

    def scores(self) -> Tensor:
        r"""Per halo row: higher is cached first."""
        data, device = self.ctx.data, self.ctx.data.send_index.device
        src = data.edge_index[0]
        fanout = torch.bincount(src[src >= data.num_inner] - data.num_inner,
                                minlength=data.num_halo).double()
        if self.policy == "degree":
            return fanout
        if self.policy == "random":
            g = torch.Generator().manual_seed(self.seed * 1000003 + data.rank)
            return torch.rand(data.num_halo, generator=g, dtype=torch.double).to(device)
        inclusion = (self.sampler.inclusion_probability() if self.sampler is not None
                     else torch.ones(data.num_halo, device=device)).double()
        return inclusion + fanout / (fanout.max().clamp(min=1) * 1e6)  # ties: fan-out

    def _choose(self, x: Tensor) -> None:
        ctx = self.ctx
        data = ctx.data
        order = torch.argsort(self.scores(), descending=True, stable=True)
        cached = torch.zeros(data.num_halo, dtype=torch.bool, device=x.device)
        cached[order[:self.num_rows(x)]] = True
        peer_cached = tell_owners(data, cached, ctx.group, ctx.stats, key="feature_cache")
        rows = self._fetch(x, cached, peer_cached, key="feature_cache")
        slot = torch.full((data.num_halo, ), -1, dtype=torch.long, device=x.device)
        slot[cached] = torch.arange(int(cached.sum()), device=x.device)
        self.generation = _Generation(cached, peer_cached, slot, rows)

    def _fetch(self, x: Tensor, halo_keep: Tensor, send_keep: Tensor, key: str) -> Tensor:
        ctx = self.ctx
        if ctx.world_size == 1:
            return x.new_empty((0, ) + tuple(x.shape[1:]))
        sub = HaloPlan.sampled(ctx.data, send_keep, halo_keep)
        return exchange_rows(x, sub, ctx.group, ctx.stats, key, ctx.codec)[0]

    def uncached(self, plan: HaloPlan):
        r"""The exchange of :obj:`plan` less the cached rows, and the choice
        of cached rows it was made under. Memoised on the plan for good: an
        exchange of it may be in flight, and input rows never go stale."""
        key = ("feature_cache", id(self))
        if key not in plan.cache:
            gen = self.generation
            halo_keep = torch.zeros_like(gen.cached)
            recv = plan.recv_rows()
            halo_keep[recv[~gen.cached[recv]]] = True
            send_keep = torch.zeros_like(gen.peer_cached)
            send = plan.send_rows()
            send_keep[send[~gen.peer_cached[send]]] = True
            plan.cache[key] = (gen, HaloPlan.sampled(self.ctx.data, send_keep, halo_keep))
        return plan.cache[key]

    def serve(self, key: str, x: Tensor, plan: HaloPlan, upcoming: Sequence[HaloPlan],
              cache) -> Tensor:
        r"""The halo rows of :obj:`x` (this rank's input features) that
        :obj:`plan` receives: cached ones from memory, the others through
        :obj:`cache`."""
        version = getattr(self.sampler, "probability_version", 0)
        if self.generation is None or (self.policy == "inclusion" and version != self.version):
            self._choose(x)
            self.version = version
        gen, sub = self.uncached(plan)
        fetched = cache.fetch(key, x, sub, [self.uncached(p)[1] for p in upcoming])
        recv = plan.recv_rows()
        hit = gen.cached[recv]
        out = fetched.new_empty((recv.numel(), ) + tuple(x.shape[1:]))
        out[hit] = gen.rows[gen.slot[recv[hit]]]
        out[~hit] = fetched
        stats = self.ctx.stats
        num_hits = int(hit.sum())
        stats.count("cache_hits", num_hits)
        stats.count("cache_lookups", recv.numel())
        stats.count("bytes_saved", num_hits * self._row_bytes(x))
        return out

    def _row_bytes(self, x: Tensor) -> int:
        r"""The bytes one row of :obj:`x` takes on the wire."""
        codec = self.ctx.codec
        if codec is None:
            return x[0].numel() * x.element_size()
        return codec.encode(x[:1].flatten(1)).size(1)

    def __repr__(self) -> str:
        return f"FeatureCache(policy='{self.policy}', capacity='{self.capacity}')"
