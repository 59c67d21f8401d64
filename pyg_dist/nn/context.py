"""``HaloContext``: what every distributed layer of a model shares — the
partition, the current halo plan, the process group and the counters."""
from contextlib import contextmanager
from typing import (Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple,
                    Union)

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from pyg_dist.cache import ExactCache, FeatureCache, HaloCache
from pyg_dist.comm import HaloPlan, halo_exchange
from pyg_dist.comm.compress import get_codec
from pyg_dist.comm.exchange import start_halo_exchange
from pyg_dist.utils import csr
from pyg_dist.data import DistData
from pyg_dist.comm.stats import CommStats

Observer = Callable[[str, Tensor, HaloPlan], None]
Plans = Union[HaloPlan, Sequence[HaloPlan]]  # one plan, or one per layer


class GCNNorm(NamedTuple):
    r"""GCN-normalised edges of the partition's graph plus self-loops, sorted
    by (target, source); ``edge_id`` is ``-1`` for the added self-loops and
    ``position[e]`` is where partition edge ``e`` went."""
    src: Tensor
    dst: Tensor
    weight: Tensor
    edge_id: Tensor
    adj_t: Optional[Tensor]
    position: Optional[Tensor]
    deg: Tensor  # of the partition's inner and halo nodes


class HaloContext:
    r"""Binds distributed layers to one rank's :class:`~pyg_dist.DistData`.

    Layers call :meth:`extend` to turn a node-level tensor of inner rows into
    the source rows of the current :attr:`plan` (``[inner | received
    halo]``) and :meth:`adjacency` to get the plan's local graph in the form
    their propagate runs fastest on. The plan is the exact one unless a
    sampler installs another with :meth:`use`; :attr:`observers` are called
    with every layer's source rows (samplers that learn from embeddings
    register here). The halo rows come through :attr:`cache` (a
    :class:`~pyg_dist.cache.HaloCache`; exact by default) and, for the
    input features, :attr:`feature_cache`.
    """

    def __init__(self, data: DistData, group=None, stats: Optional[CommStats] = None,
                 exchange_dtype: str = "fp32", cache: Optional[HaloCache] = None,
                 feature_cache: Optional[FeatureCache] = None, overlap: bool = False) -> None:
        world = dist.get_world_size(group) if dist.is_initialized() else 1
        if world != data.num_parts:
            raise RuntimeError(
                f"The partition has {data.num_parts} parts but the process group "
                f"has {world} rank(s)" + ("" if dist.is_initialized() else
                " (call pyg_dist.init() or torch.distributed.init_process_group() first)"))
        self.data = data
        self.group = group
        self.world_size = world
        self.codec = get_codec(exchange_dtype)
        self.rank = data.rank
        self.full_plan = HaloPlan.full(data)
        self._plans: Plans = self.full_plan
        self._upcoming: List[Plans] = []  # the plans of the coming iterations
        self.layer_index: Dict[str, int] = {}  # layer key -> position in the model
        self._layer = 0
        self.stats = stats if stats is not None else CommStats()
        self.observers: List[Observer] = []
        self._gcn_cache: Dict[tuple, GCNNorm] = {}
        self._precomputed: Dict[str, Tuple[Tensor, int, Tensor]] = {}
        self.exact_cache = ExactCache()
        self.cache = cache if cache is not None else self.exact_cache
        self.feature_cache = feature_cache
        self.overlap = overlap
        for c in (self.exact_cache, self.cache):
            c.attach(self)
        if feature_cache is not None and feature_cache.ctx is None:
            feature_cache.attach(self)

    @property
    def num_src(self) -> int:
        return self.plan.num_src

    @property
    def num_inner(self) -> int:
        # The plan's partition: the rank's, or a mini-batch's sub-partition.
        return self.plan.num_inner

    @contextmanager
    def use(self, plan: Plans, upcoming: Sequence[Plans] = ()) -> Iterator[Plans]:
        r"""Runs the layers on :obj:`plan` inside the block: one
        :class:`~pyg_dist.comm.HaloPlan` for every layer, or a sequence of
        them, one per distributed layer in model order (e.g. a mini-batch's
        layer-wise computational graph). :obj:`upcoming` are the plans of the
        next iterations, for caches that exchange ahead."""
        if not isinstance(plan, HaloPlan) and self.layer_index \
                and len(plan) != len(self.layer_index):
            raise ValueError(f"Got {len(plan)} layer plans for a model with "
                             f"{len(self.layer_index)} distributed layers")
        previous = self._plans, self._upcoming
        self._plans, self._upcoming = plan, list(upcoming)
        try:
            yield plan
        finally:
            self._plans, self._upcoming = previous

    def enter(self, key: str) -> None:
        r"""Called by a distributed layer when it starts: selects its plan."""
        self._layer = self.layer_index.get(key, 0)

    def _at_layer(self, plans: Plans) -> HaloPlan:
        return plans if isinstance(plans, HaloPlan) else plans[self._layer]

    @property
    def plan(self) -> HaloPlan:
        r"""The plan of the layer running now."""
        return self._at_layer(self._plans)

    @property
    def upcoming(self) -> List[HaloPlan]:
        return [self._at_layer(p) for p in self._upcoming]

    @property
    def active_cache(self) -> HaloCache:
        r"""The cache serving this pass: training passes use :attr:`cache`,
        a pass without autograd (evaluation, inference) is exact."""
        return self.cache if torch.is_grad_enabled() else self.exact_cache

    def exchanges_raw(self, x: Tensor) -> bool:
        r"""Whether a layer given :obj:`x` should exchange it before any
        transform: it is the input features and a feature cache holds them,
        or it comes out of a dropout that a stale cache moves after the
        exchange."""
        return ((self.feature_cache is not None and x is self.data.x)
                or (self.active_cache.stale and hasattr(x, "_dist_dropout")))

    def fetch(self, key: str, x: Tensor, exact: bool = False) -> Tensor:
        r"""The halo rows of :obj:`x` (inner rows) the plan receives, with
        autograd, through the :attr:`active_cache`; :obj:`exact`: now and
        in full precision."""
        if exact:
            return halo_exchange(x, self.plan, self.group, self.stats, key)
        cache = self.active_cache
        if self.feature_cache is not None and x is self.data.x:
            return self.feature_cache.serve(key, x, self.plan, self.upcoming, cache)
        if cache.stale and hasattr(x, "_dist_dropout"):
            # Dropout after the exchange: the rows travel undropped and are
            # dropped here, so the forward and the backward share one mask
            # even when the gradients reach the owner iterations later.
            undropped, p = x._dist_dropout
            return F.dropout(cache.fetch(key, undropped, self.plan, self.upcoming), p)
        return cache.fetch(key, x, self.plan, self.upcoming)

    def finish(self) -> None:
        r"""Completes the cache's exchanges in flight (end of training)."""
        self.cache.finish()

    def extend(self, key: str, x: Tensor) -> Tensor:
        r"""``[x | received halo rows of x]``: the source rows of the plan's graph."""
        self._check_rows(key, x)
        if self.plan.num_recv == 0 and (self.plan.skip_exchange or self.world_size == 1):
            x_src = x  # nothing travels: skip a full copy of x
        else:  # a rank receiving nothing may still send (and get gradients back)
            x_src = torch.cat([x, self.fetch(key, x)], dim=0)
        self._observe(key, x_src)
        return x_src

    def aggregate(self, key: str, x: Tensor, adj,
                  run: Callable[[Any, Tensor, Tuple[int, int]], Tensor]) -> Tensor:
        r"""``run(adj, x_src, size)``: a layer's aggregation of :obj:`x`'s
        plan sources over :obj:`adj` (the plan's graph).

        With :attr:`overlap` (CM-GCN's asynchronous computation between
        layers, §III-C), an exact exchange and a CSR :obj:`adj`, the halo
        rows leave first, the *interior* targets (no halo in-edge) aggregate
        while they travel, and the *border* targets after they arrive
        (:meth:`~pyg_dist.comm.HaloPlan.split_rows`): the same result,
        with the exchange hidden behind the interior work."""
        if not self._overlaps(x, adj):
            return run(adj, self.extend(key, x), (self.num_src, self.num_inner))
        self._check_rows(key, x)
        self.stats.count("overlapped_layers", 1)
        wait = start_halo_exchange(x, self.plan, self.group, self.stats, key, self.codec)
        interior, border = self.plan.split_rows(adj)
        out = run(interior, x, (self.num_inner, self.num_inner))
        x_src = torch.cat([x, wait()], dim=0)
        self._observe(key, x_src)
        return out + run(border, x_src, (self.num_src, self.num_inner))

    def _overlaps(self, x: Tensor, adj) -> bool:
        return (self.overlap and isinstance(adj, Tensor) and adj.layout == torch.sparse_csr
                and not self.plan.skip_exchange and self.world_size > 1
                and not self.active_cache.stale
                and not (self.feature_cache is not None and x is self.data.x))

    def _check_rows(self, key: str, x: Tensor) -> None:
        if x.size(0) != self.num_inner:
            raise ValueError(
                f"Layer '{key}' received {x.size(0)} node rows, but this rank "
                f"owns {self.num_inner} inner nodes (in the plan's partition): pass "
                f"the rank's inner rows (e.g. DistData.x, or a batch's x), not the "
                f"whole graph")

    def _observe(self, key: str, x_src: Tensor) -> None:
        if self.observers:
            with self.stats.timer("sample"):
                for observe in self.observers:
                    observe(key, x_src, self.plan)

    def precompute(self, key: str, x: Tensor, compute: Callable[[], Tensor]) -> Tensor:
        r"""``compute()`` on the exact plan without autograd, cached while
        :obj:`x` is the same unmodified tensor: a layer whose aggregation of
        the fixed input features involves no parameter needs it only once."""
        hit = self._precomputed.get(key)
        if hit is None or hit[0] is not x or hit[1] != x._version:
            with torch.no_grad(), self.use(self.full_plan):
                hit = (x, x._version, compute())
            self._precomputed[key] = hit
        return hit[2]

    def is_local_graph(self, edge_index) -> bool:
        # The rank's partition, or the sub-partition the plan is on (a batch's).
        return any(edge_index is data.edge_index or edge_index is data.adj_t
                   for data in (self.data, self.plan.data))

    def adjacency(self, edge_index, fused: bool, aggr: Optional[str] = None):
        r"""The plan's graph as CSR ``adj_t`` (fused sparse aggregation,
        values weighted for an unbiased sampled :obj:`aggr`) or
        ``edge_index`` (per-edge messages) when :obj:`edge_index` is the
        partition's own graph; any other graph is returned as given."""
        made_for = getattr(edge_index, "_dist_plan", None)  # by pyg_dist.nn.gcn_norm
        if made_for is not None:
            if made_for is not self.plan and not (made_for.is_exact and self.plan.is_exact):
                raise ValueError("A layer reused the normalised graph of another halo plan "
                                 "(cached=True): use cached=False with a sampler")
            return edge_index
        if not self.is_local_graph(edge_index):
            self._require_exact_plan()
            return edge_index
        return self.plan.adjacency(aggr, fused)

    def weighted_adjacency(self, edge_index, edge_weight: Optional[Tensor],
                           aggr: Optional[str]):
        r""":meth:`adjacency` for a layer that takes per-edge weights of the
        partition's edges: ``(adj, edge_weight)`` restricted to the plan's
        edges and multiplied by its sampling weights."""
        if edge_weight is None:
            return self.adjacency(edge_index, True, aggr), None
        adj = self.adjacency(edge_index, False)
        if self.plan.is_exact or not self.is_local_graph(edge_index):
            return adj, edge_weight
        scale = self.plan.edge_weight(aggr)
        edge_weight = self.plan.edges(edge_weight)
        return adj, edge_weight if scale is None else edge_weight * scale

    def _require_exact_plan(self) -> None:
        if not self.plan.is_exact:
            raise ValueError("A sampled halo plan applies to the partition's own graph "
                             "only: pass data.edge_index or data.adj_t")

    def gcn_norm(self, edge_index, edge_weight: Optional[Tensor], improved: bool,
                 add_self_loops: bool, dtype: torch.dtype):
        r"""GCN's symmetric normalisation with degrees of the *whole* graph:
        :math:`w_{ji} / \sqrt{\hat d_j \hat d_i}` with
        :math:`\hat d_i = \sum_{j \in \mathcal N(i) \cup \{i\}} w_{ji}`,
        restricted to the plan's edges and multiplied by their sampling
        scale (the normalisation stays the exact graph's).

        An inner node's in-edges all live on its owner, so each rank computes
        its inner degrees and one tiny halo exchange brings the halo degrees.
        For the partition's own graph the result is a weighted CSR ``adj_t``
        (fused path), cached per plan; it returns ``(adj, edge_weight)``.
        """
        if not self.is_local_graph(edge_index):
            self._require_exact_plan()
            if not isinstance(edge_index, Tensor) or edge_index.layout != torch.strided:
                raise NotImplementedError("Distributed GCNConv takes the partition's "
                                          "adjacency or a local bipartite edge_index")
            norm = self._normalise(self.data, edge_index, edge_weight, improved,
                                   add_self_loops, dtype, sort=False)
            return torch.stack([norm.src, norm.dst]), norm.weight
        key = (improved, add_self_loops, dtype)
        plan = self.plan
        if plan.data is not self.data:  # a sub-partition: normalised once per plan
            if edge_weight is not None:
                raise NotImplementedError("GCNConv with edge weights on a mini-batch's "
                                          "sub-partition")
            if ("gcn_norm", key) not in plan.cache:
                norm = self._normalise(plan.data, plan.data.edge_index, None, improved,
                                       add_self_loops, dtype, sort=True)
                plan.cache[("gcn_norm", key)] = _scaled_norm(norm, plan, dtype)
            return plan.cache[("gcn_norm", key)], None
        norm = (self._partition_norm(*key) if edge_weight is None else
                self._normalise(self.data, self.data.edge_index, edge_weight, improved,
                                add_self_loops, dtype, sort=True))
        if plan.is_exact:
            return norm.adj_t, None
        if edge_weight is None and ("gcn_norm", key) in plan.cache:
            return plan.cache[("gcn_norm", key)], None
        adj_t = _scaled_norm(norm, plan, dtype)
        if edge_weight is None:
            plan.cache[("gcn_norm", key)] = adj_t
        return adj_t, None

    def _partition_norm(self, improved: bool, add_self_loops: bool,
                        dtype: torch.dtype) -> GCNNorm:
        r"""The GCN norm of the partition's own graph (unweighted), cached."""
        key = (improved, add_self_loops, dtype)
        if key not in self._gcn_cache:
            self._gcn_cache[key] = self._normalise(self.data, self.data.edge_index, None,
                                                   improved, add_self_loops, dtype, sort=True)
        return self._gcn_cache[key]

    def _normalise(self, data: DistData, edge_index: Tensor, edge_weight: Optional[Tensor],
                   improved: bool, add_self_loops: bool, dtype: torch.dtype,
                   sort: bool) -> GCNNorm:
        r"""GCN weights of :obj:`edge_index` on :obj:`data`: the rank's
        partition, a sub-partition of it (``inner_id`` / ``halo_id``
        locate its rows), which takes the partition's degrees since its
        edges are a subset, or a balanced batch's part, which carries the
        whole graph's degrees (``deg_in``, ``has_loop``)."""
        src, dst = edge_index
        num_inner = data.num_inner
        edge_id = torch.arange(src.numel(), device=src.device)
        weight = (torch.ones(src.numel(), dtype=dtype, device=src.device)
                  if edge_weight is None else edge_weight.to(dtype))
        if add_self_loops:  # as PyG's add_remaining_self_loops
            has_loop = torch.zeros(num_inner, dtype=torch.bool, device=src.device)
            has_loop[dst[src == dst]] = True
            loop = torch.arange(num_inner, device=src.device)[~has_loop]
            src, dst = torch.cat([src, loop]), torch.cat([dst, loop])
            edge_id = torch.cat([edge_id, torch.full_like(loop, -1)])
            weight = torch.cat([weight, weight.new_full((loop.numel(), ),
                                                        2.0 if improved else 1.0)])
        if "has_loop" in data:  # a balanced batch's part: the whole graph's degrees
            deg = data.deg_in.to(dtype)
            if add_self_loops:
                deg = deg + (~data.has_loop).to(dtype) * (2.0 if improved else 1.0)
        elif data is not self.data:
            deg = self._partition_norm(improved, add_self_loops, dtype).deg[
                torch.cat([data.inner_id, self.data.num_inner + data.halo_id])]
        else:
            deg = weight.new_zeros(num_inner).scatter_add_(0, dst, weight)
            with self.use(self.full_plan):
                deg = torch.cat([deg, self.fetch("gcn_norm", deg.unsqueeze(-1), exact=True
                                                 ).view(-1)])
        deg_inv_sqrt = deg.pow(-0.5).masked_fill_(deg == 0, 0.0)
        weight = deg_inv_sqrt[src] * weight * deg_inv_sqrt[dst]
        if not sort:
            return GCNNorm(src, dst, weight, edge_id, None, None, deg)
        order = torch.argsort(dst * (num_inner + data.num_halo) + src)
        src, dst, weight, edge_id = src[order], dst[order], weight[order], edge_id[order]
        adj_t = data.csr_adj_t(torch.stack([src, dst]), weight)
        is_edge = (edge_id >= 0).nonzero().view(-1)
        position = torch.empty_like(is_edge)
        position[edge_id[is_edge]] = is_edge
        return GCNNorm(src, dst, weight, edge_id, adj_t, position, deg)


def _scaled_norm(norm: GCNNorm, plan: HaloPlan, dtype: torch.dtype) -> Tensor:
    r"""The normalised CSR restricted to :obj:`plan`'s edges, each scaled by
    its factor (self-loops always stay)."""
    if plan.patch is not None:  # few edges change: patch the cached CSR
        return plan.patch.apply(norm.adj_t, plan.num_src, norm.position)
    factor = torch.cat([plan.edge_factor().to(dtype), norm.weight.new_ones(1)])
    num_edges = factor.numel() - 1
    factor = factor[torch.where(norm.edge_id < 0, num_edges, norm.edge_id)]
    keep = factor.nonzero().view(-1)
    src = plan.source_map()[norm.src[keep]]
    return csr(torch.stack([src, norm.dst[keep]]), norm.weight[keep] * factor[keep],
               plan.num_inner, plan.num_src)
