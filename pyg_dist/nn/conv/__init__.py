from pyg_dist.nn.conv.cheb_conv import DistChebConv
from pyg_dist.nn.conv.gat_conv import DistGATConv, DistGATv2Conv
from pyg_dist.nn.conv.gcn_conv import DistGCNConv
from pyg_dist.nn.conv.sage_conv import DistGraphConv, DistSAGEConv

__all__ = ["DistGCNConv", "DistGATConv", "DistGATv2Conv", "DistChebConv", "DistSAGEConv",
           "DistGraphConv"]
