from pyg_dist.deprecation import renamed
from pyg_dist.nn.context import HaloContext
from pyg_dist.nn.conv import DistGATConv, DistGATv2Conv, DistGCNConv
from pyg_dist.nn.distribute import distribute

__all__ = ["distribute", "HaloContext", "DistGCNConv", "DistGATConv", "DistGATv2Conv"]

# Renamed: torch_geometric.distributed has a DistContext of another meaning.
__getattr__ = renamed(__name__, {"DistContext": ("pyg_dist.nn.context", "HaloContext")})
