from pyg_dist.nn.context import DistContext
from pyg_dist.nn.conv import DistGATConv, DistGATv2Conv, DistGCNConv
from pyg_dist.nn.distribute import distribute

__all__ = ["distribute", "DistContext", "DistGCNConv", "DistGATConv", "DistGATv2Conv"]
