r"""The engines a distributed model can run on, by name, and the one
choice of :func:`~pyg_dist.nn.distribute`: which engine a run's exchange
and overlap settings select (``docs/architecture.md`` has the table).

========================  ==========================  ===============================
exchange                  overlap                     engine
========================  ==========================  ===============================
``"halo"``/``"broadcast"``  ``False``                 ``"gather"`` (:class:`~pyg_dist.nn.engine.Engine`)
``"halo"``                ``True`` / ``"layers"``     ``"overlap"`` (:class:`~pyg_dist.nn.engine.OverlapEngine`)
``"halo"``                ``"nodes"``                 ``"nodes"`` (:class:`~pyg_dist.nn.async_layers.NodesEngine`)
``"sequential"``          ``False`` / ``True``        ``"sequential"`` (:class:`~pyg_dist.nn.sequential.SequentialEngine`)
========================  ==========================  ===============================

``precompute_layer0`` is a fact of the first layer that every engine but
``"nodes"`` honours; the exchange says how rows travel, the engine how a
layer aggregates with them.
"""
from typing import Any, Dict, Type

from pyg_dist.comm.exchange import Exchange
from pyg_dist.nn.async_layers import NodesEngine
from pyg_dist.nn.engine import Engine, OverlapEngine
from pyg_dist.nn.sequential import SequentialEngine

#: Every engine, by name (``summary.json``'s ``engine``).
ENGINES: Dict[str, Type[Engine]] = {cls.name: cls for cls in (
    Engine, OverlapEngine, SequentialEngine, NodesEngine)}

#: ``overlap`` values of :func:`~pyg_dist.nn.distribute`: ``True`` and
#: ``"layers"`` overlap within each layer, ``"nodes"`` across layers.
OVERLAP_MODES = (False, True, "layers", "nodes")


def check_overlap(overlap: Any) -> None:
    r"""Raises :class:`ValueError` for an ``overlap`` not in :data:`OVERLAP_MODES`."""
    if not any(overlap is m or (isinstance(m, str) and overlap == m) for m in OVERLAP_MODES):
        raise ValueError(f"overlap must be False, True (= 'layers') or 'nodes' (got {overlap!r})")


def engine_name(exchange: Type[Exchange], overlap: Any) -> str:
    r"""The engine a run on :obj:`exchange` (a class of
    :data:`~pyg_dist.comm.EXCHANGES`) with :obj:`overlap` runs on."""
    check_overlap(overlap)
    if overlap == "nodes":  # it refuses an exchange that cannot serve it
        return NodesEngine.name
    if exchange.piecewise:  # it overlaps, if asked, by fetching the next peer's rows early
        return SequentialEngine.name
    return OverlapEngine.name if overlap else Engine.name


def select_engine(exchange: Exchange, overlap: Any) -> Type[Engine]:
    r"""The engine class :func:`engine_name` names."""
    return ENGINES[engine_name(type(exchange), overlap)]
