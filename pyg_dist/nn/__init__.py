from pyg_dist.nn.context import HaloContext
from pyg_dist.nn.conv import DistGATConv, DistGATv2Conv, DistGCNConv
from pyg_dist.nn.distribute import distribute

__all__ = ["distribute", "HaloContext", "DistGCNConv", "DistGATConv", "DistGATv2Conv"]
