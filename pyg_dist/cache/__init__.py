r"""Halo caches: how fresh the halo rows a layer aggregates are.

========== ======================================= ==============================
name       class                                   parameters
========== ======================================= ==============================
exact      :class:`ExactCache`                     —
pipeline   :class:`PipelineCache` (PipeGCN, PSC)   staleness, smooth_features,
                                                   smooth_grads
historical :class:`HistoricalCache` (SANCUS)       bound
========== ======================================= ==============================

plus :class:`FeatureCache` (PSC-GCN's inclusion-aware cache of layer-0 input
features), which combines with any of them.
"""
from typing import Any, Dict, Tuple

from pyg_dist.cache.base import ExactCache, HaloCache
from pyg_dist.cache.feature import FeatureCache
from pyg_dist.cache.historical import HistoricalCache, parse_bound
from pyg_dist.cache.pipeline import PipelineCache
from pyg_dist.options import Option

CACHES = {"exact": ExactCache, "pipeline": PipelineCache, "historical": HistoricalCache}


def _cache_class(name: str):
    if name not in CACHES:
        raise ValueError(f"Unknown cache '{name}' (choose from {', '.join(CACHES)})")
    return CACHES[name]


def check_cache(name: str, params: Dict[str, Any]) -> None:
    r"""Validates a cache name and its parameters without building it."""
    cls = _cache_class(name)
    try:
        cls.check(**params)
    except TypeError as e:
        raise ValueError(f"cache '{name}' got an unknown parameter: {e}") from None


def cache_options(name: str) -> Tuple[Option, ...]:
    r"""The hyper-parameters cache :obj:`name` takes."""
    return _cache_class(name).options


def build_cache(name: str, **params) -> HaloCache:
    check_cache(name, params)
    return _cache_class(name)(**params)


__all__ = ["HaloCache", "ExactCache", "PipelineCache", "HistoricalCache", "FeatureCache",
           "CACHES", "build_cache", "check_cache", "cache_options", "parse_bound"]
