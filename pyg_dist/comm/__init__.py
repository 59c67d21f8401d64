from pyg_dist.comm.exchange import HaloExchange, all_to_all, halo_exchange
from pyg_dist.comm.plan import HaloPlan

__all__ = ["HaloPlan", "HaloExchange", "halo_exchange", "all_to_all"]
