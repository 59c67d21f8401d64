r"""Neighbour-sampled mini-batches over partitions (DistDGL / ByteGNN)."""
import time
from typing import Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data

from pyg_dist.comm.plan import csr
from pyg_dist.data import DistData
from pyg_dist.distributed import new_gloo_group
from pyg_dist.loader.feature_store import DistFeatureStore
from pyg_dist.loader.neighbor_sampler import DistNeighborSampler
from pyg_dist.loader.pipeline import SamplerPool
from pyg_dist.metrics import CommStats
from pyg_dist.sampler.base import _mix


def split_seeds(owned: Tensor, group=None) -> Tuple[Tensor, List[int]]:
    r"""DistDGL's two-level split of the training set (§4.1.5): the seeds
    of all ranks (:obj:`owned`: this rank's, relabelled global ids, sorted)
    ordered by id are cut into as many contiguous, equal chunks (sizes
    differ by at most one) as there are ranks, and rank :math:`r` takes
    chunk :math:`r`. Parts own contiguous id ranges in rank order, so chunk
    :math:`r` is mostly rank :math:`r`'s own seeds when the partitioner
    balanced them; the rest come from the neighbouring parts.

    Returns this rank's seeds and every rank's chunk size."""
    world = dist.get_world_size(group)
    count = torch.tensor([owned.numel()])
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    counts = [int(c) for c in counts]
    padded = torch.full((max(counts), ), -1, dtype=torch.long)
    padded[:owned.numel()] = owned
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    every = torch.cat([g[:c] for g, c in zip(gathered, counts)])
    bounds = [r * every.numel() // world for r in range(world + 1)]
    rank = dist.get_rank(group)
    return every[bounds[rank]:bounds[rank + 1]], [b - a for a, b in zip(bounds, bounds[1:])]


class DistNeighborLoader:
    r"""Mini-batches of seed nodes with their sampled :math:`K`-hop
    neighbourhoods, drawn from the whole partitioned graph (DistDGL's
    distributed sampler and KVStore, ByteGNN's pipelined sampling).

    Every rank builds one (all ranks together: construction and iteration
    are collective). The seeds (:obj:`input_nodes`, a mask over this rank's
    inner nodes; default ``data.train_mask``) of all ranks are split evenly
    over the ranks (:func:`split_seeds`); each epoch every rank shuffles its
    chunk and yields the same number of batches, so training is synchronous
    SGD over the union. A batch is sampled with :class:`DistNeighborSampler`
    (fan-out ``num_neighbors[l]`` at hop :math:`l`, -1 for all) and its node
    rows pulled from :class:`DistFeatureStore`. It is a PyG ``Data`` laid
    out as ``NeighborLoader``'s: ``x``, ``y`` and ``n_id`` (original ids)
    per node, seeds first; ``edge_index`` (neighbour → node) and the same
    graph as a ``torch.sparse`` CSR ``adj_t``; ``batch_size``,
    ``num_sampled_nodes``, ``num_sampled_edges``; and ``global_id``
    (relabelled ids). Train a plain PyG model on it::

        out = model(batch.x, batch.adj_t)[:batch.batch_size]
        loss = F.cross_entropy(out, batch.y[:batch.batch_size])

    With :obj:`num_workers` > 0, batches are sampled ahead by a
    :class:`~pyg_dist.loader.pipeline.SamplerPool` of that many background
    workers, each with its own gloo group, at an adaptive depth (see there);
    with 0 they are sampled when asked for. Either way a batch depends only
    on the seed, the epoch and its step, never on the timing.
    :meth:`report` gives the trainer's idle time, queue length, depth, bytes
    and cache hits since the last :meth:`reset_report`. Call :meth:`close`
    on every rank after the same number of batches.
    """

    def __init__(self, data: DistData, num_neighbors: List[int], batch_size: int = 1024,
                 input_nodes: Optional[Tensor] = None, shuffle: bool = True, seed: int = 0,
                 num_workers: int = 0, adaptive: bool = True,
                 cache_capacity: Union[int, str] = 0,
                 device: Optional[torch.device] = None) -> None:
        if batch_size < 1 or num_workers < 0:
            raise ValueError(f"batch_size must be >= 1 and num_workers >= 0 "
                             f"(got {batch_size}, {num_workers})")
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.device = device or data.x.device
        self.sampler = DistNeighborSampler(data, num_neighbors, seed)
        self.group = new_gloo_group()
        self.store = DistFeatureStore(data, cache_capacity, self.group)
        mask = data.train_mask if input_nodes is None else input_nodes
        owned = data.global_id[:data.num_inner][mask.to(data.global_id.device)].cpu()
        self.seeds, self.chunk_sizes = split_seeds(owned, self.group)
        start, end = data.partptr[data.rank], data.partptr[data.rank + 1]
        self.local_seed_fraction = float(((self.seeds >= start) & (self.seeds < end))
                                         .double().mean()) if self.seeds.numel() else 1.0
        self.steps = max(-(-size // batch_size) for size in self.chunk_sizes)
        self.rank, self.epoch = data.rank, 0
        self.stats = CommStats()
        self.sample_idle = 0.0  # without workers: the time spent sampling
        self.groups = [new_gloo_group() for _ in range(num_workers)]
        self.adaptive = adaptive
        self.pool: Optional[SamplerPool] = None  # started by the first epoch

    def __len__(self) -> int:
        return self.steps

    def global_batch_size(self, step: int) -> int:
        r"""The number of seeds step :obj:`step` of an epoch has over all
        ranks (the last step's batches may be smaller, or empty)."""
        return sum(min(max(size - step * self.batch_size, 0), self.batch_size)
                   for size in self.chunk_sizes)

    def _seeds_of(self, job: int) -> Tensor:
        epoch, step = divmod(job, self.steps)
        if self.shuffle:
            g = torch.Generator().manual_seed(_mix(self.seed, epoch, self.rank))
            order = torch.randperm(self.seeds.numel(), generator=g)
        else:
            order = torch.arange(self.seeds.numel())
        return self.seeds[order[step * self.batch_size:(step + 1) * self.batch_size]]

    def _produce(self, job: int, worker: int) -> Tuple[Data, CommStats]:
        group = self.groups[worker] if worker >= 0 else self.group
        stats = CommStats()
        seeds = self._seeds_of(job)
        sub = self.sampler.sample(seeds, job, group, stats)
        rows = self.store.pull(sub.node, DistFeatureStore.KEYS, group, stats)
        n = sub.node.numel()
        batch = Data(x=rows["x"], y=rows["y"], n_id=rows["n_id"], global_id=sub.node,
                     edge_index=sub.edge_index,
                     adj_t=csr(sub.edge_index, None, n, n, rows["x"].dtype),
                     batch_size=seeds.numel(), num_sampled_nodes=sub.num_sampled_nodes,
                     num_sampled_edges=sub.num_sampled_edges)
        batch.num_nodes = n
        if self.device.type == "cuda":  # page-locked: the trainer's copy runs async
            batch = batch.pin_memory()
        return batch, stats

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        r"""Continues with epoch ``state["epoch"]`` (before the first epoch)."""
        if self.pool is not None:
            raise RuntimeError("load_state_dict before the first epoch")
        self.epoch = state["epoch"]

    def __iter__(self) -> Iterator[Data]:
        first = self.epoch * self.steps
        self.epoch += 1
        if self.pool is None and self.groups:
            self.pool = SamplerPool(self._produce, len(self.groups), self.adaptive,
                                    first_job=first)
        if self.pool is not None:
            while self.pool.next_job < first:  # the rest of an epoch left early
                self.pool.get(self.pool.next_job)
        for job in range(first, first + self.steps):
            if self.pool is not None:
                batch, stats = self.pool.get(job)
            else:
                start = time.perf_counter()
                batch, stats = self._produce(job, -1)
                self.sample_idle += time.perf_counter() - start
            self.stats.merge(stats)
            yield batch.to(self.device, non_blocking=True)

    def reset_report(self) -> None:
        self.stats.reset()
        self.sample_idle = 0.0
        if self.pool is not None:
            self.pool.reset_report()

    def report(self) -> Dict[str, float]:
        r"""Since :meth:`reset_report`: ``idle`` (s the trainer waited for
        batches), ``queue_len`` (mean ready batches it found), ``in_flight``
        (mean depth), ``bytes_sent`` / ``bytes_recv`` (requests and rows
        that crossed the network), ``feature_bytes`` (node rows received
        from other ranks), ``cache_hits`` / ``cache_lookups``."""
        out = (self.pool.report() if self.pool is not None else
               {"idle": self.sample_idle, "queue_len": 0.0, "in_flight": 0.0})
        out.update(bytes_sent=self.stats.total_bytes_sent,
                   bytes_recv=self.stats.total_bytes_recv,
                   feature_bytes=self.stats.bytes_recv["features.rows"],
                   cache_hits=self.stats.counts["cache_hits"],
                   cache_lookups=self.stats.counts["cache_lookups"])
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
