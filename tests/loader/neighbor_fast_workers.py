"""Rank functions for the neighbour loader's fast paths (importable by spawn)."""
import torch
import torch.distributed as dist

import pyg_dist
from pyg_dist.comm.stats import CommStats
from pyg_dist.loader import PartitionFeatureStore, PartitionNeighborLoader
from pyg_dist.loader.neighbor import sampler as sampler_module


def _batches(loader, epochs):
    out = []
    for _ in range(epochs):
        for batch in loader:
            out.append({k: getattr(batch, k).clone()
                        for k in ("n_id", "global_id", "edge_index", "x", "y")}
                       | {"num_sampled_nodes": batch.num_sampled_nodes})
    return out


def dense_and_sorted_batches(root: str):
    r"""Two epochs of batches with the dense first-occurrence table (the
    default on this graph) and with the sort only (``DENSE_SPAN = 0``)."""
    data = pyg_dist.DistData.load(root, dist.get_rank())
    result = {}
    for name, span in (("dense", sampler_module.DENSE_SPAN), ("sorted", 0)):
        old, sampler_module.DENSE_SPAN = sampler_module.DENSE_SPAN, span
        try:
            loader = PartitionNeighborLoader(data, [4, 3], batch_size=20, seed=3)
            result[name] = _batches(loader, 2)
            loader.close()
        finally:
            sampler_module.DENSE_SPAN = old
    return result


def pulled_rows(root: str, label_kind: str):
    r"""Rows of random global ids pulled from a store whose labels are
    ``label_kind``: ``"long"`` (one column), ``"long2"`` (int64, three
    columns, packed with the original ids) or ``"float"`` (a reply of their
    own); and the feature-row bytes received."""
    data = pyg_dist.DistData.load(root, dist.get_rank())
    inner = data.y[:data.num_inner] if data.y.size(0) > data.num_inner else data.y
    if label_kind == "long2":
        data.y = torch.stack([inner, inner * 10, -inner], dim=1)
    elif label_kind == "float":
        data.y = inner.float() / 7
    store = PartitionFeatureStore(data)
    gen = torch.Generator().manual_seed(dist.get_rank())
    num_nodes = int(data.partptr[-1])
    ids = torch.randperm(num_nodes, generator=gen)[:num_nodes // 2]
    stats = CommStats()
    rows = store.pull(ids, PartitionFeatureStore.KEYS, stats=stats)
    empty = store.pull(ids[:0], PartitionFeatureStore.KEYS)
    return {"ids": ids, "rows": rows, "recv": stats.bytes_recv["features.rows"],
            "empty": {k: tuple(v.shape) for k, v in empty.items()}}


def train_run(root: str, config, out_dir: str):
    from pyg_dist.train import train
    return train(root, config, out_dir)
