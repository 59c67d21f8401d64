"""Rank functions for the neighbour loader tests (importable by spawn)."""
import os

import torch
import torch.distributed as dist
from torch_geometric.nn import GraphSAGE

import pyg_dist
from pyg_dist.loader import PartitionNeighborLoader


def _batches(loader, epochs):
    out = []
    for _ in range(epochs):
        for batch in loader:
            out.append({k: getattr(batch, k).clone() for k in ("n_id", "edge_index", "x", "y")}
                       | {"batch_size": batch.batch_size,
                          "num_sampled_nodes": batch.num_sampled_nodes,
                          "num_sampled_edges": batch.num_sampled_edges})
    return out


def sample_epochs(root: str):
    r"""Two epochs of batches, sampled in the loop and by a pool of
    workers with a hot-row cache; and one batch with every neighbour through
    a seeded GraphSAGE (output rows and weight gradients)."""
    data = pyg_dist.DistData.load(root, dist.get_rank())
    result = {}
    for name, kwargs in (("loop", {}), ("pool", {"num_workers": 3,
                                                  "cache_capacity": "50%"})):
        loader = PartitionNeighborLoader(data, [4, 3], batch_size=20, seed=1, **kwargs)
        result[name] = _batches(loader, 2)
        result[name + "_report"] = loader.report()
        loader.close()
    result["chunk_sizes"] = loader.chunk_sizes
    loader = PartitionNeighborLoader(data, [-1, -1], batch_size=25, shuffle=False)
    batch = next(iter(loader))
    torch.manual_seed(0)
    model = GraphSAGE(data.num_features, 8, 2, 5)
    out = model(batch.x, batch.adj_t)[:batch.batch_size]
    out.pow(2).sum().backward()
    loader.close()
    result["exact"] = {"n_id": batch.n_id[:batch.batch_size], "out": out.detach(),
                       "grads": [p.grad for p in model.parameters()]}
    return result


def die_while_sampling(root: str, victim: int):
    r"""The victim rank exits abruptly after its second batch."""
    data = pyg_dist.DistData.load(root, dist.get_rank())
    loader = PartitionNeighborLoader(data, [4, 3], batch_size=8, num_workers=2)
    for step, _ in enumerate(loader):
        if step == 1 and dist.get_rank() == victim:
            os._exit(3)
    for _ in loader:
        pass
