r"""``TrainConfig``: one training run's specification: the model and its
optimiser, then a halo sampler, halo caches and a loader, each a registered
name with its parameters and validated by its own registry."""
import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE

from pyg_dist.cache import CACHES, FeatureCache, check_cache
from pyg_dist.comm import DEFAULT_EXCHANGE, exchange_class
from pyg_dist.comm.compress import get_codec
from pyg_dist.loader import LOADERS, check_loader
from pyg_dist.nn.compat import refusals
from pyg_dist.nn.engines import ENGINES, check_overlap, engine_name
from pyg_dist.nn.dropout import fast_dropout
from pyg_dist.nn.spec import LayerSpec, spec_of
from pyg_dist.sampler import SAMPLERS, check_sampler
from pyg_dist.utils.allocator import MALLOC_MODES

MODELS = {"gcn": GCN, "sage": GraphSAGE, "gat": GAT, "gin": GIN}


@functools.lru_cache(maxsize=None)
def model_layer(model: str) -> LayerSpec:
    r"""The spec of the layer PyG's :data:`MODELS` ``[model]`` is built of
    (read off a one-channel instance, built without drawing from the
    generators a run's dropout and weights come from)."""
    with torch.random.fork_rng(devices=[]):
        return spec_of(MODELS[model](1, 1, 1).convs[0])


def nodes_models() -> Tuple[str, ...]:
    r"""The models ``overlap="nodes"`` schedules across layers."""
    return tuple(m for m in MODELS if model_layer(m).node_schedule)

# Fields of the first runs' summary.json (still written, read back into
# loader_args): (loader, its parameter) they are now, or None (unused).
LEGACY_FIELDS = {
    "fanout": ("neighbor", "fanout"),
    "batch_size": ("neighbor", "batch_size"),
    "sampler_workers": ("neighbor", "workers"),
    "adaptive_depth": ("neighbor", "adaptive"),
    "background_sampling": ("full", "background"),
    "extra": None,
}
# The defaults of the release that wrote only the legacy fields, where they
# differ from the loader's option default now: that release wrote every
# field, its defaults included, so a value equal to its default was not
# chosen (the neighbour loader samples in one background worker by default
# since; workers are run control, so results do not depend on them).
LEGACY_DEFAULTS = {"sampler_workers": 0}


@dataclass
class TrainConfig:
    r"""Hyper-parameters of a training run.

    The model is one of PyG's BasicGNNs (:data:`MODELS`). Three components
    are each a registered name with a parameter dict, checked by their
    registry: :obj:`sampler` (:data:`pyg_dist.sampler.SAMPLERS`: which halo
    rows an iteration fetches), :obj:`cache`
    (:data:`pyg_dist.cache.CACHES`: how fresh they are) with the optional
    :obj:`feature_cache` of input features, and :obj:`loader`
    (:data:`pyg_dist.loader.LOADERS`: which batches an epoch trains on;
    each loader says which samplers and caches it runs with).
    :obj:`precompute_layer0`, :obj:`exchange_dtype`, :obj:`overlap`,
    :obj:`exchange` and :obj:`memory_budget` are
    :func:`~pyg_dist.nn.distribute`'s options.

    :meth:`to_dict` (``summary.json``'s ``config``) also writes the keys the
    first runs had (:data:`LEGACY_FIELDS`: ``fanout`` ... now ``loader_args``),
    and :meth:`from_dict` reads files that have only those.
    """
    model: str = "sage"
    num_layers: int = 3
    hidden: int = 64
    heads: int = 4  # GAT only
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 0.0
    epochs: int = 50
    seed: int = 0
    sampler: str = "full"
    sampler_args: Dict[str, Any] = field(default_factory=dict)
    cache: str = "exact"
    cache_args: Dict[str, Any] = field(default_factory=dict)
    feature_cache: Optional[str] = None  # a policy of pyg_dist.cache.FeatureCache
    feature_cache_capacity: str = "25%"
    loader: str = "full"
    loader_args: Dict[str, Any] = field(default_factory=dict)
    precompute_layer0: bool = False
    exchange_dtype: str = "fp32"  # a key of pyg_dist.comm.compress.CODECS
    # True / "layers": interior targets aggregate while the halo rows travel;
    # "nodes": every row as soon as its inputs arrived, across layers
    overlap: Union[bool, str] = False
    # How halo rows travel: a key of pyg_dist.comm.EXCHANGES.
    exchange: str = DEFAULT_EXCHANGE
    # With exchange="sequential": bytes of halo rows layers may receive at once
    # (distribute()'s memory_budget; None: every layer sequential).
    memory_budget: Optional[int] = None
    # SANCUS §4.3.2: each rank clips its local gradient to norm sqrt(P) * clip_grad
    # before the all-reduce (None: no clipping).
    clip_grad: Optional[float] = None
    # Train on the subgraph of the train nodes, evaluate on the whole graph
    # (partitions written with partition_graph(..., inductive=True)).
    inductive: bool = False
    # Evaluate every N epochs and after the last; 0: never (whole-graph
    # inference of a graph far larger than the machine's memory).
    eval_every: int = 1
    progress: bool = True
    # Save a checkpoint every N epochs (0: never) into checkpoint_dir
    # (default out_dir/checkpoint); resume: continue from its latest one.
    checkpoint_every: int = 0
    checkpoint_dir: Optional[str] = None
    resume: bool = False
    # Train into an out_dir that already holds a run, replacing it.
    overwrite: bool = False
    # The ranks' allocator: "reuse" (pyg_dist.utils.allocator.reuse_freed_memory:
    # what a step frees stays for the next), "system" (glibc and torch as they
    # are) or "compact" (follow_live_memory: resident memory follows live
    # memory, for page faults every step).
    malloc: str = "reuse"
    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TrainConfig":
        r"""The config of :obj:`values` (e.g. ``summary.json``'s), also as
        an older release wrote it (legacy fields converted silently)."""
        return cls(**upgrade(values))

    def to_dict(self) -> Dict[str, Any]:
        r"""The fields, plus the legacy ones with the values in effect (what
        ``summary.json`` and ``model.json`` always had: readers keep working)."""
        values = asdict(self)
        for old, target in LEGACY_FIELDS.items():
            if target is None:
                values[old] = {}
                continue
            loader, param = target
            default = _option_default(loader, param)
            values[old] = (self.loader_args.get(param, default) if self.loader == loader
                           else default)
        return values

    def evaluates(self, epoch: int) -> bool:
        r"""Whether :obj:`epoch` (1-based) ends with an evaluation."""
        return self.eval_every > 0 and (epoch % self.eval_every == 0
                                        or epoch == self.epochs)

    def validate(self) -> None:
        r"""Raises :class:`ValueError` for any invalid setting, before any work."""
        if self.model not in MODELS:
            raise ValueError(f"Unknown model '{self.model}' (choose from {', '.join(MODELS)})")
        for name in ("num_layers", "hidden", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0: never; got {self.eval_every})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1) (got {self.dropout})")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be > 0 and finite (got {self.lr})")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be >= 0 and finite "
                             f"(got {self.weight_decay})")
        if self.heads < 1:
            raise ValueError(f"heads must be >= 1 (got {self.heads})")
        if self.resume and self.overwrite:
            raise ValueError("resume continues the run in out_dir, overwrite replaces it: "
                             "choose one")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (got {self.checkpoint_every})")
        if self.clip_grad is not None and not (math.isfinite(self.clip_grad)
                                               and self.clip_grad > 0):
            raise ValueError(f"clip_grad must be > 0 and finite (got {self.clip_grad})")
        if self.malloc not in MALLOC_MODES:
            raise ValueError(f"malloc must be one of {', '.join(MALLOC_MODES)} "
                             f"(got {self.malloc!r})")
        check_sampler(self.sampler, self.sampler_args)
        get_codec(self.exchange_dtype)
        check_overlap(self.overlap)
        if self.overlap == "nodes":
            self._check_nodes()
        check_cache(self.cache, self.cache_args)
        if self.feature_cache is not None:
            FeatureCache.check(self.feature_cache, self.feature_cache_capacity)
        check_loader(self.loader, self.loader_args, self)
        self._check_components()

    def _check_nodes(self) -> None:
        if not model_layer(self.model).node_schedule:
            raise ValueError(f"overlap='nodes' runs models {', '.join(nodes_models())} (model "
                             f"'{self.model}' aggregates per edge: use overlap=True)")

    def _check_components(self) -> None:
        r"""Refuses, naming them, the components that do not compose
        (:func:`~pyg_dist.nn.compat.refusals` reads what each declares)."""
        exchange = exchange_class(self.exchange)
        refused = refusals(
            exchange=exchange, engine=ENGINES[engine_name(exchange, self.overlap)],
            sampler=SAMPLERS[self.sampler], cache=CACHES[self.cache],
            feature_cache=self.feature_cache, loader=LOADERS[self.loader],
            precompute=self.precompute_layer0, overlap=self.overlap,
            exchange_dtype=self.exchange_dtype, memory_budget=self.memory_budget,
            names={"exchange": self.exchange, "sampler": self.sampler, "cache": self.cache,
                   "loader": self.loader})
        if refused:
            raise ValueError(refused[0])


# Fields added since the first runs were written, with the value those runs had.
ADDED_FIELDS = {"exchange": "halo", "clip_grad": None, "memory_budget": None}


def upgrade(values: Dict[str, Any]) -> Dict[str, Any]:
    r""":obj:`values` of a config (or a checkpoint's identity) as this
    release names them: the legacy fields folded into ``loader_args``, and
    the fields added since (:data:`ADDED_FIELDS`) with the value they had."""
    out = {k: v for k, v in values.items() if k not in LEGACY_FIELDS}
    for name, value in ADDED_FIELDS.items():
        out.setdefault(name, value)
    loader = out.get("loader", "full")
    if "loader_args" not in values:
        args: Dict[str, Any] = {}
        for old in LEGACY_FIELDS:
            if values.get(old) is not None:
                args = _with_legacy(args, loader, old, values[old])
        out["loader_args"] = args
    return out


def _with_legacy(loader_args: Dict[str, Any], loader: str, old: str,
                 value: Any) -> Dict[str, Any]:
    r""":obj:`loader_args` plus legacy field :obj:`old`, where it applies
    (it was ignored by the other loaders, so it stays ignored)."""
    target = LEGACY_FIELDS[old]
    if target is None or target[0] != loader or target[1] in loader_args \
            or loader not in LOADERS:
        return loader_args
    if value == LEGACY_DEFAULTS.get(old, _option_default(loader, target[1])):
        return loader_args
    return {**loader_args, target[1]: value}


def _option_default(loader: str, param: str) -> Any:
    return next(o.default for o in LOADERS[loader].options if o.name == param)


def build_model(config: TrainConfig, in_channels: int, out_channels: int) -> torch.nn.Module:
    r"""A PyG BasicGNN whose dropout draws its masks faster on the CPU
    (:func:`~pyg_dist.nn.dropout.fast_dropout`); seeded, so every rank
    builds the same weights."""
    torch.manual_seed(config.seed)
    kwargs = {"heads": config.heads} if config.model == "gat" else {}
    return fast_dropout(MODELS[config.model](in_channels, config.hidden, config.num_layers,
                                             out_channels, dropout=config.dropout, **kwargs))


def num_classes_of(y: Tensor) -> int:
    r"""Classes of labels :obj:`y`: columns of a multi-hot ``[N, C]`` matrix
    (multi-label), else the largest class id + 1."""
    return int(y.size(1)) if y.dim() > 1 else int(y.max()) + 1 if y.numel() else 0
