r"""Neighbour-sampled mini-batches over partitions (DistDGL / ByteGNN)."""
import time
from typing import Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm.stats import CommStats
from pyg_dist.data import DistData
from pyg_dist.distributed import new_gloo_group
from pyg_dist.loader.base import Loader, LoaderInputs
from pyg_dist.loader.batch import TrainBatch
from pyg_dist.loader.neighbor.feature_store import PartitionFeatureStore
from pyg_dist.loader.neighbor.pipeline import SamplerPool
from pyg_dist.loader.neighbor.rows_plan import projects_on_owners
from pyg_dist.loader.neighbor.sampler import PartitionNeighborSampler
from pyg_dist.options import Option
from pyg_dist.utils import csr, mix_seeds


def _fanout(text: str) -> List[int]:
    try:
        return [int(k) for k in text.split(",")]
    except ValueError:
        raise ValueError(f"fan-outs are integers separated by commas, e.g. 15,10,5 "
                         f"(got '{text}')") from None


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


class PartitionNeighborLoader(Loader):
    r"""Mini-batches of seed nodes with their sampled :math:`K`-hop
    neighbourhoods, drawn from the whole partitioned graph (DistDGL's
    distributed sampler and KVStore, ByteGNN's pipelined sampling).

    Every rank builds one (all ranks together: construction and iteration
    are collective). The seeds (:obj:`input_nodes`, a mask over this rank's
    inner nodes; default ``data.train_mask``) of all ranks are split evenly
    over the ranks (:func:`split_seeds`); each epoch every rank shuffles its
    chunk and yields the same number of batches, so training is synchronous
    SGD over the union. A batch is sampled with :class:`PartitionNeighborSampler`
    (fan-out ``num_neighbors[l]`` at hop :math:`l`, -1 for all) and its node
    rows pulled from :class:`PartitionFeatureStore`. It is a
    :class:`~pyg_dist.loader.TrainBatch` laid out as ``NeighborLoader``'s
    batches: ``x``, ``y`` and ``n_id`` (original ids) per node, seeds first
    (``targets``); ``edge_index`` (neighbour → node) and the same graph as a
    ``torch.sparse`` CSR ``adj_t``; ``batch_size``, ``num_sampled_nodes``,
    ``num_sampled_edges``; and ``global_id`` (relabelled ids). Train a plain PyG model on it::

        out = model(batch.x, batch.adj_t)[:batch.batch_size]
        loss = F.cross_entropy(out, batch.y[:batch.batch_size])

    With :obj:`model` (a trimmed PyG model whose first layer
    :func:`~pyg_dist.loader.neighbor.projects_on_owners` accepts, on the
    CPU, without a feature cache), the input rows are not pulled: the
    batch's ``x`` has no columns and ``batch.rows_plan`` (a
    :class:`~pyg_dist.loader.neighbor.RowsPlan`) computes the first layer
    with the rows' owners, every rank at the same step::

        with trimmed(model, batch.adj_t, batch.num_sampled_nodes, batch.rows_plan):
            out = model(batch.x, batch.adj_t)[:batch.batch_size]

    With :obj:`num_workers` > 0, batches are sampled ahead by a
    :class:`~pyg_dist.loader.neighbor.pipeline.SamplerPool` of that many background
    workers, each with its own gloo group, at an adaptive depth (see there);
    with 0 (this class's default) they are sampled when asked for. Training
    (:meth:`from_inputs`, ``pyg-dist train --loader neighbor``) takes one
    worker unless told otherwise. Either way a batch depends only on the
    seed, the epoch and its step, never on the timing.
    :meth:`report` gives the trainer's idle time, queue length, depth, bytes
    and cache hits since the last :meth:`reset_report`. Call :meth:`close`
    on every rank after the same number of batches.
    """

    distributed = False
    options = (
        Option("fanout", [15, 10, 5], "neighbours sampled per hop, one per layer, -1 for "
               "all", _fanout),
        Option("batch_size", 1024, "seed nodes per rank and step", int),
        Option("workers", 1, "background workers sampling batches ahead of the trainer "
               "(ByteGNN pipelining; 0: sample in the training loop)", int,
               flag="--loader-workers", deprecated=("--sampler-workers", ),
               run_control=True),
        Option("adaptive", True, "keep every worker busy instead of adapting how many "
               "batches are sampled ahead", flag="--fixed-depth", switch=False,
               run_control=True),
    )
    sampled_plans = observing_samplers = stale_caches = False
    feature_caches = ("degree", )
    precompute = overlap = exchange_dtypes = False
    refusal = ("loader 'neighbor' samples whole neighbourhoods from the owners: halo "
               "samplers, caches, precompute_layer0, overlap and exchange_dtype do not "
               "apply; its feature cache is 'degree' (hot remote rows)")

    def __init__(self, data: DistData, num_neighbors: List[int], batch_size: int = 1024,
                 input_nodes: Optional[Tensor] = None, shuffle: bool = True, seed: int = 0,
                 num_workers: int = 0, adaptive: bool = True,
                 cache_capacity: Union[int, str] = 0,
                 device: Optional[torch.device] = None,
                 model: Optional[torch.nn.Module] = None) -> None:
        if batch_size < 1 or num_workers < 0:
            raise ValueError(f"batch_size must be >= 1 and num_workers >= 0 "
                             f"(got {batch_size}, {num_workers})")
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.device = device or data.x.device
        self.sampler = PartitionNeighborSampler(data, num_neighbors, seed)
        self.group = new_gloo_group()
        self.store = PartitionFeatureStore(data, cache_capacity, self.group)
        # The first layer projected by the rows' owners (rows_plan), which
        # exchange over self.group in the trainer's step: the workers have
        # groups of their own, and without workers the step follows sampling.
        self.owners_project = (projects_on_owners(model, data.num_features)
                               and self.device.type == "cpu" and not self.store.num_cached)
        mask = data.train_mask if input_nodes is None else input_nodes
        owned = data.global_id[:data.num_inner][mask.to(data.global_id.device)].cpu()
        self.seeds, self.chunk_sizes = split_seeds(owned, self.group)
        start, end = data.partptr[data.rank], data.partptr[data.rank + 1]
        self.local_seed_fraction = float(((self.seeds >= start) & (self.seeds < end))
                                         .double().mean()) if self.seeds.numel() else 1.0
        self.steps = max(-(-size // batch_size) for size in self.chunk_sizes)
        self.num_seeds = sum(self.chunk_sizes)
        self.rank, self.epoch = data.rank, 0
        self.stats = CommStats()
        self.sample_idle = 0.0  # without workers: the time spent sampling
        self.groups = [new_gloo_group() for _ in range(num_workers)]
        self.adaptive = adaptive
        self.pool: Optional[SamplerPool] = None  # started by the first epoch

    @classmethod
    def check(cls, num_layers: Optional[int] = None, fanout: List[int] = (15, 10, 5),
              batch_size: int = 1024, workers: int = 1, adaptive: bool = True) -> None:
        if num_layers is not None and len(fanout) != num_layers:
            raise ValueError(f"fanout has {len(fanout)} hops but the model has "
                             f"{num_layers} layers: give one fan-out per layer")
        PartitionNeighborSampler.check(list(fanout))
        if batch_size < 1 or workers < 0:
            raise ValueError(f"batch_size must be >= 1 and workers >= 0 "
                             f"(got {batch_size}, {workers})")
        if not adaptive and workers == 0:
            raise ValueError("adaptive=False (--fixed-depth) fixes how far the background "
                             "workers sample ahead, and workers=0 (--loader-workers 0) "
                             "starts none: choose one")

    @classmethod
    def from_inputs(cls, inputs: LoaderInputs, fanout: List[int] = (15, 10, 5),
                    batch_size: int = 1024, workers: int = 1,
                    adaptive: bool = True) -> "PartitionNeighborLoader":
        r"""The run's loader: by default one background worker samples the
        next batch while the trainer steps on this one (``workers=1``).
        Measured on ``reddit_shaped`` (30,000 nodes, 2 METIS parts, 2 ranks
        of one thread on 2 cores loaded by another job, 3-layer GraphSAGE
        hidden 128, fan-outs 15,10,5, 1,024 seeds, runs alternated): median
        epochs of 5.1-6.9 s against 7.0-9.7 s sampling in the loop, with
        the same losses bit for bit."""
        return cls(inputs.data, list(fanout), batch_size, seed=inputs.seed,
                   num_workers=workers, adaptive=adaptive, device=inputs.device,
                   cache_capacity=inputs.feature_cache_capacity or 0, model=inputs.model)

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
            g = torch.Generator().manual_seed(mix_seeds(self.seed, epoch, self.rank))
            order = torch.randperm(self.seeds.numel(), generator=g)
        else:
            order = torch.arange(self.seeds.numel())
        return self.seeds[order[step * self.batch_size:(step + 1) * self.batch_size]]

    def _produce(self, job: int, worker: int) -> Tuple[TrainBatch, CommStats]:
        group = self.groups[worker] if worker >= 0 else self.group
        stats = CommStats()
        seeds = self._seeds_of(job)
        sub = self.sampler.sample(seeds, job, group, stats)
        n = sub.node.numel()
        extra = {}
        if self.owners_project:
            rows, plan = self.store.pull_plan(sub.node, ("y", "n_id"), group, stats)
            rows["x"] = self.store.tensors["x"].new_empty((n, 0))
            extra["rows_plan"] = plan.attach(self.store.tensors["x"], self.group, self.stats)
        else:
            rows = self.store.pull(sub.node, PartitionFeatureStore.KEYS, group, stats)
        stats.count("seeds", seeds.numel())
        seeds_of_step = self.global_batch_size(job % self.steps)
        batch = TrainBatch(x=rows["x"], adj_t=csr(sub.edge_index, None, n, n, rows["x"].dtype),
                           y=rows["y"], targets=torch.arange(n) < seeds.numel(),
                           loss_count=max(seeds_of_step, 1),
                           loss_weight=seeds_of_step / max(self.num_seeds, 1),
                           halo_rows=int(stats.counts["cache_lookups"]
                                         - stats.counts["cache_hits"]),
                           edge_index=sub.edge_index, n_id=rows["n_id"],
                           extra={"global_id": sub.node,
                                  "num_sampled_nodes": sub.num_sampled_nodes,
                                  "num_sampled_edges": sub.num_sampled_edges, **extra})
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

    def __iter__(self) -> Iterator[TrainBatch]:
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

    def reset_metrics(self) -> None:
        self.reset_report()

    def metrics(self) -> Tuple[Dict[str, float], Dict[str, float]]:
        r"""Sums (bytes, cache counters when it caches, seeds, queue and
        depth) and the trainer's idle time (as ``time_sample``)."""
        report = self.report()
        sums = {k: report[k] for k in ("bytes_sent", "bytes_recv", "feature_bytes",
                                       "queue_len", "in_flight")}
        if self.store.num_cached:
            row_bytes = sum(t[0].numel() * t.element_size()
                            for t in self.store.tensors.values())
            sums.update(cache_hits=report["cache_hits"],
                        cache_lookups=report["cache_lookups"],
                        bytes_saved=report["cache_hits"] * row_bytes)
        sums.update(seeds=self.stats.counts["seeds"],
                    local_seed_fraction=self.local_seed_fraction)
        return sums, {"time_sample": report["idle"]}

    def row_fields(self, sums: Dict[str, float], row: Dict[str, float],
                   world: int) -> Dict[str, float]:
        r"""The epoch row's sampling metrics from the summed :meth:`metrics`."""
        step_time, idle = row["time"], row["time_sample"]
        return {"seeds_per_s": sums["seeds"] / step_time, "trainer_idle": idle,
                "trainer_idle_frac": idle / step_time, "queue_len": sums["queue_len"] / world,
                "in_flight": sums["in_flight"] / world,
                "feature_bytes": int(sums["feature_bytes"]),
                "local_seed_fraction": sums["local_seed_fraction"] / world}

    summary_keys = ("seeds_per_s", "trainer_idle", "trainer_idle_frac", "queue_len",
                    "in_flight", "feature_bytes", "local_seed_fraction")

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
