r"""The record a distributed layer carries: its :class:`LayerState`, kept
by the engine that runs it (:mod:`pyg_dist.nn.engine`), and how a layer
finds its engine (:func:`engine_of`). Imports nothing of pyg_dist, so the
layers of :mod:`pyg_dist.nn.conv` can ask their engine without importing
the engines."""
from dataclasses import dataclass, field
from typing import Any, List, Optional, Set

import torch
from torch import Tensor

#: The attribute of a converted layer that holds its :class:`LayerState`.
STATE = "_dist_layer"


@dataclass(eq=False)
class LayerState:
    r"""What an engine keeps about one distributed layer."""
    engine: Any  # the pyg_dist.nn.engine.Engine running it
    module: torch.nn.Module
    key: str  # the layer's path in the model: its exchanges are counted under it
    index: int  # its position among the model's distributed layers (its plan)
    spec: Any  # its pyg_dist.nn.spec.LayerSpec
    #: Aggregates the input features once and reuses the result
    #: (``precompute_layer0``).
    precompute: bool = False
    #: Propagate calls in the running forward (each exchanges under its own key).
    calls: int = 0
    #: What the running forward was given (the stale-cache check reads it).
    given: Any = None
    #: The running propagate's arguments are the plan's already (the engine's
    #: own call of PyG's propagate).
    prepared: bool = False
    #: The graph it propagates over is the plan's already (an attention
    #: layer's, under the sequential engine).
    plan_graph: bool = False
    #: Under the sequential engine with a memory budget: whether it receives
    #: its whole halo at once (``True``) or one peer's rows at a time
    #: (``False``); ``None`` until its first pass decides.
    materialised: Optional[bool] = None
    #: ``message_and_aggregate`` for the running call, set by the engine
    #: (the per-node schedule's in-place backward); ``None``: the layer's.
    aggregation: Optional[Any] = None
    #: Per-message weights of a sampled plan on the per-edge path.
    message_weight: Optional[Tensor] = None
    #: The rows it aggregates are its input, not yet multiplied by its
    #: neighbour weight (samplers estimating the aggregated terms read it).
    exchanges_raw: bool = True
    #: The arguments checked to be features under a stale cache.
    features_only: Set[str] = field(default_factory=set)
    #: Handles of the hooks the engine registered on it.
    hooks: List[Any] = field(default_factory=list)


def state_of(module: torch.nn.Module) -> Optional[LayerState]:
    r"""The :class:`LayerState` of a distributed layer (``None`` for any
    other module)."""
    return module.__dict__.get(STATE)


def engine_of(module: torch.nn.Module) -> Any:
    r"""The engine a distributed layer runs on (``None`` for a plain one)."""
    state = state_of(module)
    return None if state is None else state.engine
