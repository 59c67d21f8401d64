r"""Which components of a run compose: the one check.

Every component declares what it does as class attributes (capabilities),
and :func:`refusals` reads them all:

* a sampler (:mod:`pyg_dist.sampler`): ``samples`` (its plans drop halo rows
  or edges), ``observes`` (it learns from the rows a layer exchanges);
* a cache (:mod:`pyg_dist.cache`): ``stale`` (it serves rows of earlier
  iterations), ``whole_blocks`` (it refreshes the owners' whole blocks);
* an exchange (:class:`~pyg_dist.comm.exchange.Exchange`): ``sampled_plans``,
  ``minibatch``, ``stale_caches``, ``feature_cache``, ``holds_halo``,
  ``whole_blocks``, ``asynchronous``, ``piecewise``;
* an engine (:class:`~pyg_dist.nn.engine.Engine`): ``stale_caches``,
  ``feature_cache``, ``precompute``, ``asynchronous_exchange``
  (it posts its own transfers), ``budgets_memory`` (it chooses per layer
  by a memory budget);
* a loader (:class:`~pyg_dist.loader.Loader`): ``full_graph``,
  ``sampled_plans``, ``observing_samplers``, ``stale_caches``,
  ``feature_caches``, ``precompute``, ``overlap``, ``exchange_dtypes``.

The run's config calls :func:`refusals` before any work (with every
component), :func:`~pyg_dist.nn.distribute` and
:class:`~pyg_dist.nn.HaloContext` with those they are given; each refusal
is one line naming the settings that do not compose.
"""
from typing import Any, Dict, List, Optional

from pyg_dist.comm import DEFAULT_EXCHANGE


def refusals(*, exchange: type, engine: Optional[type] = None, sampler: Optional[type] = None,
             cache: Optional[type] = None, feature_cache: Any = None,
             loader: Optional[type] = None, precompute: bool = False, overlap: Any = False,
             exchange_dtype: str = "fp32", memory_budget: Optional[int] = None,
             names: Optional[Dict[str, str]] = None) -> List[str]:
    r"""The reasons, one line each, why the components given (classes;
    :obj:`feature_cache`: its policy name or ``True``, ``None``: none) do not compose;
    empty: they do. :obj:`names` are the names the user gave them
    (``{"exchange": "broadcast", "sampler": "bns", ...}``), for the
    messages."""
    names = dict(names or {})
    given = {"sampler": names.get("sampler"), "cache": names.get("cache"),
             "loader": names.get("loader"), "overlap": overlap,
             "feature_cache": feature_cache if isinstance(feature_cache, str) else None}
    out: List[str] = []
    stale = cache is not None and cache.stale
    if memory_budget is not None and (isinstance(memory_budget, bool)
                                      or not isinstance(memory_budget, int)
                                      or memory_budget < 0):
        out.append(f"memory_budget is a number of bytes, 0 or more (got {memory_budget!r})")
    if engine is not None:
        out += _engine(engine, exchange, names, cache, stale, feature_cache, precompute)
        if memory_budget is not None and not engine.budgets_memory:
            out.append(f"memory_budget chooses per layer between receiving the whole halo "
                       f"and the sequential exchange's one peer at a time: it needs "
                       f"exchange='sequential' (got "
                       f"'{names.get('exchange', exchange.name)}')")
    refused = []  # the settings the exchange does not combine with
    if loader is not None and not loader.full_graph and not exchange.minibatch:
        refused.append("loader")
    if sampler is not None and ((sampler.samples and not exchange.sampled_plans)
                                or (sampler.observes and not exchange.holds_halo)):
        refused.append("sampler")
    if cache is not None and ((stale and not exchange.stale_caches)
                              or (exchange.whole_blocks and not cache.whole_blocks)):
        if given["cache"] is None:  # an instance of the Python API's
            out.append(f"{cache.__name__} does not run on "
                       f"exchange='{names.get('exchange', exchange.name)}'")
        else:
            refused.append("cache")
    if feature_cache is not None and not exchange.feature_cache:
        refused.append("feature_cache")
    if overlap and not (exchange.asynchronous or exchange.piecewise):
        refused.append("overlap")
    if refused:
        what = ", ".join(f"{name}={given[name]!r}" if given[name] is not None
                         else _WHAT[name] for name in refused)
        out.append(f"exchange='{names.get('exchange', exchange.name)}' {exchange.summary}: "
                   f"it does not combine with {what} (use exchange='{DEFAULT_EXCHANGE}')")
    if loader is not None and _loader_refuses(loader, sampler, stale, feature_cache,
                                              precompute, overlap, exchange_dtype):
        out.append(loader.refusal)
    return out


#: A component named by what it is where the user gave it no name (the
#: Python API passes instances).
_WHAT = {"sampler": "this sampler", "loader": "this loader",
         "feature_cache": "a feature cache", "overlap": "overlap"}


def _engine(engine: type, exchange: type, names: Dict[str, str], cache: Optional[type],
            stale: bool, feature_cache: Any, precompute: bool) -> List[str]:
    out = []
    if engine.asynchronous_exchange and (not exchange.asynchronous or exchange.piecewise):
        out.append(f"overlap='{engine.name}' runs on exchange='halo' "
                   f"(got '{names.get('exchange', exchange.name)}')")
    if stale and not engine.stale_caches:
        out.append(f"overlap='{engine.name}' needs the exact cache "
                   f"({names.get('cache', cache.__name__)!r} serves stale rows, exchanged on "
                   f"its own schedule)")
    if (feature_cache is not None and not engine.feature_cache) \
            or (precompute and not engine.precompute):
        out.append(f"overlap='{engine.name}' exchanges every layer's rows itself: it does "
                   f"not combine with a feature cache or precompute_layer0")
    return out


def _loader_refuses(loader: type, sampler: Optional[type], stale: bool,
                    feature_cache: Any, precompute: bool, overlap: Any,
                    exchange_dtype: str) -> bool:
    return ((sampler is not None and ((sampler.samples and not loader.sampled_plans)
                                      or (sampler.observes and not loader.observing_samplers)))
            or (stale and not loader.stale_caches)
            or (feature_cache is not None and loader.feature_caches is not None
                and feature_cache not in loader.feature_caches)
            or (precompute and not loader.precompute)
            or (bool(overlap) and not loader.overlap)
            or (exchange_dtype != "fp32" and not loader.exchange_dtypes))
