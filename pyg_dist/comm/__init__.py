from pyg_dist.comm.exchange import HaloExchange, halo_exchange
from pyg_dist.comm.plan import HaloPlan

__all__ = ["HaloPlan", "HaloExchange", "halo_exchange"]
