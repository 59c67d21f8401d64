"""The models every exactness test runs, single-process and distributed."""
import torch
from torch_geometric.nn import (GAT, GCN, GIN, GATConv, GCNConv, GINConv, GraphConv,
                                GraphSAGE, SAGEConv)

OUT = 5


def build_model(name: str, in_channels: int) -> torch.nn.Module:
    hidden = 8
    return {
        "GCNConv": lambda: GCNConv(in_channels, OUT),
        "SAGEConv": lambda: SAGEConv(in_channels, OUT),
        "GATConv": lambda: GATConv(in_channels, OUT, heads=2),
        "GINConv": lambda: GINConv(torch.nn.Sequential(
            torch.nn.Linear(in_channels, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, OUT))),
        "GraphConv": lambda: GraphConv(in_channels, OUT, aggr="mean"),
        "GCN": lambda: GCN(in_channels, hidden, 3, OUT),
        "GraphSAGE": lambda: GraphSAGE(in_channels, hidden, 3, OUT),
        "GAT": lambda: GAT(in_channels, hidden, 2, OUT, heads=2),
        "GIN": lambda: GIN(in_channels, hidden, 2, OUT),
    }[name]()


MODELS = ["GCNConv", "SAGEConv", "GATConv", "GINConv", "GraphConv",
          "GCN", "GraphSAGE", "GAT", "GIN"]
