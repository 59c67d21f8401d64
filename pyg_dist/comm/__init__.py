r"""How halo rows travel: plans, transfers and the exchanges (registered in
:data:`EXCHANGES`, one class per file; see :class:`~pyg_dist.comm.exchange.Exchange`)."""
from typing import Dict, Type

from pyg_dist.comm.broadcast import Broadcast
from pyg_dist.comm.exchange import Exchange
from pyg_dist.comm.halo import PointToPoint
from pyg_dist.comm.plan import HaloPlan
from pyg_dist.comm.sequential import Sequential
from pyg_dist.comm.transfer import Transfer, all_to_all

#: ``exchange=NAME`` of :func:`~pyg_dist.nn.distribute`, ``--exchange NAME``
#: of the CLI.
EXCHANGES: Dict[str, Type[Exchange]] = {
    "halo": PointToPoint,
    "broadcast": Broadcast,
    "sequential": Sequential,
}
#: The exchange of a run that names none.
DEFAULT_EXCHANGE = "halo"


def exchange_class(name: str) -> Type[Exchange]:
    if name not in EXCHANGES:
        raise ValueError(f"Unknown exchange '{name}' (choose from {', '.join(EXCHANGES)})")
    return EXCHANGES[name]


def get_exchange(exchange) -> Exchange:
    r"""The :class:`Exchange` named :obj:`exchange` (an instance is returned
    as is)."""
    if isinstance(exchange, Exchange):
        return exchange
    instance = exchange_class(exchange)()
    instance.name = exchange
    return instance


__all__ = ["HaloPlan", "Exchange", "EXCHANGES", "DEFAULT_EXCHANGE", "exchange_class",
           "get_exchange", "Transfer", "all_to_all"]
