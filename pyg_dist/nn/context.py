"""``HaloContext``: what every distributed layer of a model shares — the
partition, the current halo plan, the process group and the counters."""
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from pyg_dist.cache import ExactCache, FeatureCache, HaloCache
from pyg_dist.comm import DEFAULT_EXCHANGE, Exchange, HaloPlan, get_exchange
from pyg_dist.comm.compress import get_codec
from pyg_dist.comm.plan import Plans
from pyg_dist.comm.stats import CommStats
from pyg_dist.data import DistData
from pyg_dist.utils.aggregate import keep_transpose
from pyg_dist.nn.compat import refusals
from pyg_dist.nn.dropout import dropout

Observer = Callable[[str, Tensor, HaloPlan], None]


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
    input features, :attr:`feature_cache`. :attr:`exchange` (an
    :class:`~pyg_dist.comm.exchange.Exchange` of :data:`~pyg_dist.comm.EXCHANGES`)
    says how they travel and are aggregated.
    """

    def __init__(self, data: DistData, group=None, stats: Optional[CommStats] = None,
                 exchange_dtype: str = "fp32", cache: Optional[HaloCache] = None,
                 feature_cache: Optional[FeatureCache] = None,
                 overlap: Union[bool, str] = False,
                 exchange: Union[str, Exchange] = DEFAULT_EXCHANGE) -> None:
        self.exchange = get_exchange(exchange)
        self.cache = cache if cache is not None else ExactCache()
        refused = refusals(exchange=type(self.exchange), cache=type(self.cache),
                           feature_cache=True if feature_cache is not None else None,
                           overlap=overlap, names={"exchange": self.exchange.name})
        if refused:
            raise ValueError(refused[0])
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
        self.num_layers = 0  # distributed layers of the model (set by distribute())
        self.running: Any = None  # the LayerState of the layer running now
        self._layer = 0
        self.stats = stats if stats is not None else CommStats()
        self.observers: List[Observer] = []
        self._input_features: Optional[bool] = None  # declared by use()
        # The tensor the model's forward was called with, and whether it is
        # data.x (decided once per forward; see is_input_features).
        self._model_input: Optional[Tensor] = None
        self._model_input_is_features: Optional[bool] = None
        # What layers compute once per context (e.g. GCN's whole-graph degrees).
        self.memo: Dict[str, Any] = {}
        self._precomputed: Dict[str, Tuple[int, Tensor]] = {}
        # dropout output -> (its input, p): the rows a stale cache exchanges
        self.undropped = WeakIdKeyDictionary()
        # a graph gcn_norm normalised -> the plan it was normalised for
        self.normalised = WeakIdKeyDictionary()
        self.exact_cache = self.cache if type(self.cache) is ExactCache else ExactCache()
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
    def use(self, plan: Plans, upcoming: Sequence[Plans] = (),
            input_features: Optional[bool] = None) -> Iterator[Plans]:
        r"""Runs the layers on :obj:`plan` inside the block: one
        :class:`~pyg_dist.comm.HaloPlan` for every layer, or a sequence of
        them, one per distributed layer in model order (e.g. a mini-batch's
        layer-wise computational graph). :obj:`upcoming` are the plans of the
        next iterations, for caches that exchange ahead.
        :obj:`input_features` says whether the first layer's input is the
        partition's input features ``data.x`` (see
        :meth:`is_input_features`)."""
        if not isinstance(plan, HaloPlan) and self.num_layers \
                and len(plan) != self.num_layers:
            raise ValueError(f"Got {len(plan)} layer plans for a model with "
                             f"{self.num_layers} distributed layers")
        previous = self._plans, self._upcoming, self._input_features
        self._plans, self._upcoming = plan, list(upcoming)
        self._input_features = input_features
        try:
            yield plan
        finally:
            self._plans, self._upcoming, self._input_features = previous

    def enter(self, layer) -> None:
        r"""Called when a distributed layer (its
        :class:`~pyg_dist.nn.state.LayerState`) starts: selects its plan."""
        self._layer = layer.index
        self.running = layer

    def neighbour_weight(self) -> Optional[Tensor]:
        r"""The matrix :math:`W` the running layer applies to the rows it
        aggregates, when one matrix does and the rows it exchanges are not
        yet multiplied by it (GCN's :math:`\Theta` when it exchanges
        :math:`H`, SAGE's :math:`W_2`, GraphConv's :math:`W_2`); ``None``
        otherwise. Samplers that estimate the aggregated terms
        :math:`W h_j` (PSC-GCN's :math:`\mathbf y_{ij}`) read it."""
        layer = self.running
        # GCN exchanges XΘ unless its rows must travel raw (see DistGCNConv)
        if layer is None or layer.spec.neighbour_weight is None or not layer.exchanges_raw:
            return None
        return getattr(getattr(layer.module, layer.spec.neighbour_weight, None), "weight", None)

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

    def begin_pass(self, x: Any) -> None:
        r"""Called when the distributed model's forward starts, with its
        first argument."""
        self._model_input = x if isinstance(x, Tensor) else None
        self._model_input_is_features = self._input_features

    def end_pass(self) -> None:
        self._model_input = self._model_input_is_features = None

    def is_input_features(self, x: Tensor) -> bool:
        r"""Whether :obj:`x`, a layer's input, is the partition's input
        features ``data.x``: the feature cache and the layer-0 precompute
        apply to them only. It must be the tensor the model was called
        with (not a transform of it), and that tensor is the features as
        :meth:`use` declared (a loader's batch says so), or, with nothing
        declared, by value: ``data.x`` or a copy of it such as
        ``data.x.to(device)``, compared once per forward."""
        if x is not self._model_input or x.shape != self.data.x.shape:
            return False
        if self._model_input_is_features is None:
            features = self.data.x
            self._model_input_is_features = x is features or (
                x.dtype == features.dtype and x.device == features.device
                and bool(torch.equal(x, features)))
        return self._model_input_is_features

    def exchanges_raw(self, x: Tensor) -> bool:
        r"""Whether a layer given :obj:`x` should exchange it before any
        transform with its parameters: it is the input features and a
        feature cache holds them, or the cache is stale. A stale cache
        (PipeGCN, PSC-GCN, SANCUS) keeps features and feature gradients
        stale, never weights: rows transformed by a layer's parameters
        would carry the parameters of the iteration they were computed at
        into this one, and give the owner's weight gradient a stale term."""
        return ((self.feature_cache is not None and self.is_input_features(x))
                or self.active_cache.stale)

    def fetch(self, key: str, x: Tensor, exact: bool = False) -> Tensor:
        r"""The halo rows of :obj:`x` (inner rows) the plan receives, with
        autograd, through the :attr:`active_cache`; :obj:`exact`: now and
        in full precision."""
        if exact:
            return self.exchange.fetch(self, key, x, self.plan, None)
        cache = self.active_cache
        if self.feature_cache is not None and self.is_input_features(x):
            return self.feature_cache.serve(key, x, self.plan, self.upcoming, cache)
        undropped = self.undropped.get(x) if cache.stale else None
        if undropped is not None:
            # Dropout after the exchange: the rows travel undropped and are
            # dropped here, so the forward and the backward share one mask
            # even when the gradients reach the owner iterations later.
            rows, p = undropped
            return dropout(cache.fetch(key, rows, self.plan, self.upcoming), p)
        return cache.fetch(key, x, self.plan, self.upcoming)

    def finish(self) -> None:
        r"""Completes the cache's exchanges in flight (end of training)."""
        self.cache.finish()

    def extend(self, key: str, x: Tensor) -> Tensor:
        r"""``[x | received halo rows of x]``: the source rows of the plan's graph."""
        self.check_rows(key, x)
        if self.plan.num_recv == 0 and not self.exchanges_now(self.plan):
            x_src = x  # nothing travels: skip a full copy of x
        elif (type(self.active_cache) is ExactCache and self.codec is None
              and not (self.feature_cache is not None and self.is_input_features(x))):
            x_src = self.exchange.extend(self, key, x, self.plan)  # rows now, as they are
        else:  # a rank receiving nothing may still send (and get gradients back)
            x_src = torch.cat([x, self.fetch(key, x)], dim=0)
        self.observe(key, x_src)
        return x_src

    def exchanges_now(self, plan: HaloPlan) -> bool:
        r"""Whether :obj:`plan` moves rows between ranks at all (not in a
        world of one rank, nor on a plan that isolates the partitions)."""
        return not (plan.skip_exchange or self.world_size == 1 or not dist.is_initialized())

    def check_rows(self, key: str, x: Tensor) -> None:
        if x.size(0) != self.num_inner:
            raise ValueError(
                f"Layer '{key}' received {x.size(0)} node rows, but this rank "
                f"owns {self.num_inner} inner nodes (in the plan's partition): pass "
                f"the rank's inner rows (e.g. DistData.x, or a batch's x), not the "
                f"whole graph")

    def observe(self, key: str, x_src: Tensor) -> None:
        if self.observers:
            with self.stats.timer("sample"):
                for observe in self.observers:
                    observe(key, x_src, self.plan)

    def precompute(self, key: str, compute: Callable[[], Tensor]) -> Tensor:
        r"""``compute()`` on the exact plan without autograd, for a layer
        given the input features (:meth:`is_input_features`), cached while
        ``data.x`` is unmodified: a layer whose aggregation of the fixed
        input features involves no parameter needs it only once."""
        hit = self._precomputed.get(key)
        if hit is None or hit[0] != self.data.x._version:
            with torch.no_grad(), self.use(self.full_plan):
                hit = (self.data.x._version, compute())
            self._precomputed[key] = hit
        return hit[1]

    def is_local_graph(self, edge_index) -> bool:
        # The rank's partition, or the sub-partition the plan is on (a batch's).
        return any(edge_index is data.edge_index or edge_index is data.adj_t
                   for data in (self.data, self.plan.data))

    def adjacency(self, edge_index, fused: bool, aggr: Optional[str] = None):
        r"""The plan's graph as CSR ``adj_t`` (fused sparse aggregation,
        values weighted for an unbiased sampled :obj:`aggr`) or
        ``edge_index`` (per-edge messages) when :obj:`edge_index` is the
        partition's own graph; any other graph is returned as given."""
        made_for = (self.normalised.get(edge_index)  # by pyg_dist.nn.gcn_norm
                    if isinstance(edge_index, Tensor) else None)
        if made_for is not None:
            if made_for is not self.plan and not (made_for.is_exact and self.plan.is_exact):
                raise ValueError("A layer reused the normalised graph of another halo plan "
                                 "(cached=True): use cached=False with a sampler")
            return edge_index
        if not self.is_local_graph(edge_index):
            self.require_exact_plan()
            return edge_index
        if self.plan.is_exact:
            return keep_transpose(self.plan.adjacency(aggr, fused))
        with self.stats.timer("sample"):  # building a sampled graph is plan building
            return keep_transpose(self.plan.adjacency(aggr, fused), blocks=False)

    def propagate_args(self, module, edge_index, kwargs: Dict[str, Any],
                       sources: List[str]) -> Tuple[Any, Optional[Tensor], Dict[str, Any]]:
        r"""A layer's propagate on the plan: ``(graph, message_weight,
        kwargs)``. On the partition's own graph the per-edge arguments
        (``edge_*``) are cut to the plan's edges and the graph takes the
        form the layer aggregates fastest: fused sparse when no argument
        but the :obj:`sources` is given (the fused path carries no per-edge
        argument), per edge otherwise, with the plan's message weights
        (:meth:`~pyg_dist.comm.HaloPlan.edge_weight`)."""
        local = self.is_local_graph(edge_index)
        if local:
            kwargs = {k: self.plan.edges(v) if k.startswith("edge_") and isinstance(v, Tensor)
                      else v for k, v in kwargs.items()}
        fused = module.fuse and all(v is None for k, v in kwargs.items() if k not in sources)
        aggr = module.aggr if isinstance(module.aggr, str) else None
        weight = self.plan.edge_weight(aggr) if local and not fused else None
        return self.adjacency(edge_index, fused, aggr), weight, kwargs

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

    def require_exact_plan(self) -> None:
        if not self.plan.is_exact:
            raise ValueError("A sampled halo plan applies to the partition's own graph "
                             "only: pass data.edge_index or data.adj_t")
