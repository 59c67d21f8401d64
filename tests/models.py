"""The models every exactness test runs, single-process and distributed, and
the loss they are differentiated with."""
import torch
import torch.distributed as dist
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

def _loss_weight(n_id: torch.Tensor, width: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(123)
    largest = int(n_id.max()) if n_id.numel() else 0
    return torch.randn(largest + 10_000, width, generator=gen)[n_id]


def linear_loss(out: torch.Tensor, n_id: torch.Tensor) -> torch.Tensor:
    r"""A loss that is a sum over nodes with fixed per-node weights, so the
    distributed total is the sum of the ranks' parts."""
    return (out * _loss_weight(n_id, out.size(1))).sum() / 100.0


def linear_loss_magnitude(out: torch.Tensor, n_id: torch.Tensor) -> float:
    r"""The sum of the magnitudes of :func:`linear_loss`'s terms: the scale
    of its rounding (the signed sum may cancel to far less)."""
    return float((out * _loss_weight(n_id, out.size(1))).abs().sum() / 100.0)


def summed_grads(model: torch.nn.Module) -> dict:
    r"""Copies of the weight gradients, summed over the ranks (what the
    all-reduce trains with)."""
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    for grad in grads.values():
        dist.all_reduce(grad)
    return grads
