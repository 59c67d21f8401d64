from pyg_dist.nn.context import HaloContext
from pyg_dist.nn.conv import DistGATConv, DistGATv2Conv, DistGCNConv
from pyg_dist.nn.distribute import distribute
from pyg_dist.nn.dropout import Dropout, fast_dropout

__all__ = ["distribute", "HaloContext", "DistGCNConv", "DistGATConv", "DistGATv2Conv", "Dropout",
           "fast_dropout"]
