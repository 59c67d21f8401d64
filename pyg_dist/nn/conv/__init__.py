from pyg_dist.nn.conv.gat_conv import DistGATConv
from pyg_dist.nn.conv.gcn_conv import DistGCNConv

__all__ = ["DistGCNConv", "DistGATConv"]
