"""The ready-made full-graph training loop used by the CLI, notebooks and
benchmarks, and its single-process PyG twin for comparisons."""
import copy
import json
import math
import os
import os.path as osp
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch_geometric.data import Data
from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE
from torch_geometric.utils import to_torch_csr_tensor

import pyg_dist
from pyg_dist.cache import FeatureCache, build_cache, check_cache
from pyg_dist.checkpoint import Checkpointer, check_same_model, rng_state, set_rng_state
from pyg_dist.comm.compress import get_codec
from pyg_dist.datasets.real import f1_counts
from pyg_dist.distributed import (gather_over_ranks, max_over_ranks, stop_requested,
                                  sum_over_ranks)
from pyg_dist.loader import CohesiveBatchLoader, PartitionNeighborSampler, load_batches
from pyg_dist.loader.cohesive.balance import has_batch_parts
from pyg_dist.metrics import peak_memory_bytes, reset_peak_memory
from pyg_dist.partition.book import read_meta
from pyg_dist.sampler import PlanPrefetcher, build_sampler, check_sampler

MODELS = {"gcn": GCN, "sage": GraphSAGE, "gat": GAT, "gin": GIN}
MASKS = ("train", "val", "test")


@dataclass
class TrainConfig:
    r"""Hyper-parameters of a full-graph training run."""
    model: str = "sage"
    num_layers: int = 3
    hidden: int = 64
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 0.0
    epochs: int = 50
    seed: int = 0
    eval_every: int = 1
    heads: int = 4  # GAT only
    progress: bool = True
    extra: Dict[str, Any] = field(default_factory=dict)
    sampler: str = "full"  # a key of pyg_dist.sampler.SAMPLERS
    sampler_args: Dict[str, Any] = field(default_factory=dict)
    precompute_layer0: bool = False
    exchange_dtype: str = "fp32"  # a key of pyg_dist.comm.compress.CODECS
    cache: str = "exact"  # a key of pyg_dist.cache.CACHES
    cache_args: Dict[str, Any] = field(default_factory=dict)
    feature_cache: Optional[str] = None  # a policy of pyg_dist.cache.FeatureCache
    feature_cache_capacity: str = "25%"
    # Draw plans in a background thread when the cache exchanges ahead (CPU).
    background_sampling: bool = True
    loader: str = "full"  # full-graph epochs, "cohesive" (CM-GCN) or "neighbor" (DistDGL)
    overlap: bool = False  # interior targets aggregate while the halo rows travel
    # loader "neighbor": fan-out per hop (-1: all), seeds per rank and step,
    # background sampling workers (0: in the loop) and their adaptive depth.
    fanout: List[int] = field(default_factory=lambda: [15, 10, 5])
    batch_size: int = 1024
    sampler_workers: int = 0
    adaptive_depth: bool = True
    # Train on the subgraph of the train nodes, evaluate on the whole graph
    # (partitions written with partition_graph(..., inductive=True)).
    inductive: bool = False
    # Save a checkpoint every N epochs (0: never) into checkpoint_dir
    # (default out_dir/checkpoint); resume: continue from its latest one.
    checkpoint_every: int = 0
    checkpoint_dir: Optional[str] = None
    resume: bool = False
    # Train into an out_dir that already holds a run, replacing it.
    overwrite: bool = False

    def validate(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"Unknown model '{self.model}' (choose from {', '.join(MODELS)})")
        for name in ("num_layers", "hidden", "epochs", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1) (got {self.dropout})")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be > 0 and finite (got {self.lr})")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be >= 0 and finite "
                             f"(got {self.weight_decay})")
        if self.heads < 1:
            raise ValueError(f"heads must be >= 1 (got {self.heads})")
        if self.resume and self.overwrite:
            raise ValueError("resume continues the run in out_dir, overwrite replaces it: "
                             "choose one")
        check_sampler(self.sampler, self.sampler_args)
        get_codec(self.exchange_dtype)
        check_cache(self.cache, self.cache_args)
        if self.feature_cache is not None:
            FeatureCache.check(self.feature_cache, self.feature_cache_capacity)
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (got {self.checkpoint_every})")
        if self.inductive and self.loader == "cohesive":
            raise ValueError("inductive training runs with the full-graph or the neighbour "
                             "loader (cohesive batches are made on the whole graph)")
        if self.loader not in ("full", "cohesive", "neighbor"):
            raise ValueError(f"Unknown loader '{self.loader}' (full, cohesive, neighbor)")
        if self.loader == "neighbor":
            self._validate_neighbor()
        if self.loader == "cohesive" and (self.sampler == "vr" or self.cache != "exact"
                                          or self.feature_cache or self.precompute_layer0):
            raise ValueError("loader 'cohesive' runs mini-batches with fresh halo rows: "
                             "caches, the vr sampler (it learns per layer over the whole "
                             "partition) and precompute_layer0 do not combine with it")

    def _validate_neighbor(self) -> None:
        if len(self.fanout) != self.num_layers:
            raise ValueError(f"fanout has {len(self.fanout)} hops but the model has "
                             f"{self.num_layers} layers: give one fan-out per layer")
        PartitionNeighborSampler.check(self.fanout)
        if self.batch_size < 1 or self.sampler_workers < 0:
            raise ValueError(f"batch_size must be >= 1 and sampler_workers >= 0 "
                             f"(got {self.batch_size}, {self.sampler_workers})")
        if (self.sampler != "full" or self.cache != "exact" or self.precompute_layer0
                or self.overlap or self.exchange_dtype != "fp32"
                or self.feature_cache not in (None, "degree")):
            raise ValueError("loader 'neighbor' samples whole neighbourhoods from the owners: "
                             "halo samplers, caches, precompute_layer0, overlap and "
                             "exchange_dtype do not apply; its feature cache is "
                             "'degree' (hot remote rows)")


def build_model(config: TrainConfig, in_channels: int, out_channels: int) -> torch.nn.Module:
    r"""A plain PyG BasicGNN; seeded, so every rank builds the same weights."""
    torch.manual_seed(config.seed)
    kwargs = {"heads": config.heads} if config.model == "gat" else {}
    return MODELS[config.model](in_channels, config.hidden, config.num_layers,
                                out_channels, dropout=config.dropout, **kwargs)


def _allreduce_grads(params: List[Tensor], group=None,
                     loss: Optional[Tensor] = None) -> Tuple[float, bool]:
    r"""One bucketed all-reduce of all weight gradients (sum: the loss is
    already normalised by the global train count) and, in the same buffer,
    of :obj:`loss`. Returns the summed loss and whether it and every summed
    gradient are finite: the same answer on every rank."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    extra = [loss.detach().reshape(1).to(grads[0].dtype)] if loss is not None else []
    flat = _flatten_dense_tensors(grads + extra)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(flat, group=group)
    for p, g in zip(params, _unflatten_dense_tensors(flat, grads + extra)):
        p.grad = g
    return (float(flat[-1]) if extra else 0.0), bool(torch.isfinite(flat).all())


def _step(params: List[Tensor], optimizer, loss: Tensor, epoch: int, world: int,
          stats) -> None:
    r"""Sums the gradients over the ranks and steps, unless the loss or a
    gradient is not finite (:class:`NonFiniteError`, on every rank)."""
    with stats.timer("reduce") if world > 1 else nullcontext():
        total, finite = _allreduce_grads(params, loss=loss)
    if not finite:
        raise NonFiniteError(epoch, total)
    optimizer.step()


def _broadcast_params(model: torch.nn.Module) -> None:
    params = [p.data for p in model.parameters()]
    flat = _flatten_dense_tensors(params)
    dist.broadcast(flat, src=0)
    for p, v in zip(params, _unflatten_dense_tensors(flat, params)):
        p.copy_(v)


def num_classes_of(y: Tensor) -> int:
    r"""Classes of labels :obj:`y`: columns of a multi-hot ``[N, C]`` matrix
    (multi-label), else the largest class id + 1."""
    return int(y.size(1)) if y.dim() > 1 else int(y.max()) + 1 if y.numel() else 0


def node_loss(out: Tensor, y: Tensor) -> Tensor:
    r"""The loss of every row of :obj:`out` against :obj:`y`, summed over
    the rows: cross-entropy, or for multi-hot :obj:`y` (Yelp,
    AmazonProducts) the binary cross-entropy averaged over the labels, as in
    GraphSAINT and BNS-GCN."""
    if y.dim() > 1:
        return F.binary_cross_entropy_with_logits(out, y, reduction="sum") / max(y.size(1), 1)
    return F.cross_entropy(out, y, reduction="sum")


def _forward_backward(model: torch.nn.Module, adj, data: Data, num_train: int) -> Tensor:
    r"""One training forward and backward; the loss is summed over the train
    nodes given and divided by the global train count."""
    model.train()
    out = model(data.x, adj)
    mask = data.train_mask
    loss = node_loss(out[mask], data.y[mask]) / num_train
    loss.backward()
    return loss


def _correct_counts(out: Tensor, data: Data) -> Tensor:
    r"""Per mask, a numerator and a denominator summed over ranks: correct
    and all nodes (accuracy), or for multi-label :math:`2TP` and
    :math:`2TP + FP + FN` (micro-F1)."""
    counts = []
    for m in MASKS:
        mask = data[f"{m}_mask"]
        if data.y.dim() > 1:
            tp, fp, fn = f1_counts(out[mask], data.y[mask])
            counts += [2 * tp, 2 * tp + fp + fn]
        else:
            counts += [(out[mask].argmax(-1) == data.y[mask]).sum(), mask.sum()]
    return torch.stack(counts).double()


def _accuracies(counts: Tensor) -> Dict[str, float]:
    return {f"{m}_acc": float(counts[2 * i] / counts[2 * i + 1].clamp(min=1))
            for i, m in enumerate(MASKS)}


def train(root: str, config: TrainConfig, out_dir: Optional[str] = None) -> Dict[str, Any]:
    r"""Trains on the partitions in :obj:`root` as one rank of the current
    process group (a world of one is created if none exists).

    Loss: cross-entropy summed over this rank's train nodes divided by the
    *global* train count, so the summed gradients equal single-process
    training. Weight gradients are summed with one bucketed all-reduce.
    Rank 0 writes ``out_dir/metrics.jsonl`` (one object per epoch),
    ``out_dir/summary.json`` and ``out_dir/model.pt`` (a plain PyG
    ``state_dict``, see :func:`load_model`). Returns the summary.
    """
    config.validate()
    pyg_dist.init()
    claim_out_dir(out_dir, config)
    if config.loader == "neighbor":
        from pyg_dist.train_neighbor import train_neighbor
        return train_neighbor(root, config, out_dir)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = pyg_dist.device()
    checkpoints = checkpointer(root, config, out_dir, world)
    resumed = checkpoints.load() if config.resume else None
    data = pyg_dist.DistData.load(root, rank).to(device)
    num_classes = int(max_over_ranks(torch.tensor([num_classes_of(data.y)],
                                                  device=device))[0])
    model = build_model(config, data.num_features, num_classes).to(device)
    _broadcast_params(model)
    evaluator, eval_data = model, data
    if config.inductive:  # the model trains on the train nodes' subgraph only
        evaluator = pyg_dist.nn.distribute(copy.deepcopy(model), data)
        data = pyg_dist.DistData.load(train_graph_root(root), rank).to(device)
    cache = build_cache(config.cache, **config.cache_args)
    feature_cache = (FeatureCache(config.feature_cache, config.feature_cache_capacity,
                                  config.seed) if config.feature_cache else None)
    pyg_dist.nn.distribute(model, data, precompute_layer0=config.precompute_layer0,
                           exchange_dtype=config.exchange_dtype, cache=cache,
                           feature_cache=feature_cache, overlap=config.overlap)
    ctx, stats = model.dist_context, model.comm_stats
    sampler_args = dict(config.sampler_args)
    if config.sampler == "vr":  # PSC's coefficient c_ij is GCN's; others aggregate plainly
        sampler_args.setdefault("coefficient", "gcn" if config.model == "gcn" else "uniform")
    sampler = build_sampler(config.sampler, data, seed=config.seed, stats=stats,
                            **sampler_args)
    sampler.attach(ctx)
    if feature_cache is not None:
        feature_cache.attach(ctx, sampler)
    lookahead = ctx.cache.lookahead
    if config.loader == "cohesive":
        plans = CohesiveBatchLoader(data, load_batches(root), len(ctx.layer_index),
                                    balanced_root=root if has_batch_parts(root) else None,
                                    seed=config.seed, stats=stats, sampler=None if
                                    config.sampler == "full" else lambda part: build_sampler(
                                        config.sampler, part, seed=config.seed, stats=stats,
                                        **sampler_args))
    else:
        plans = PlanPrefetcher(sampler, lookahead, stats=stats, background=(
            config.background_sampling and lookahead > 0 and device.type == "cpu"))
    stateful = {"model": model, "sampler": sampler, "cache": cache, "loader": plans}
    params, optimizer, num_train, writer, epochs, history = training_loop_parts(
        model, data, config, out_dir, f"train {config.model} x{world}", stateful, resumed)
    try:
        for epoch in epochs:
            row, stop = _train_epoch(epoch, model, data, config, plans, optimizer, params,
                                     num_train, world, device, evaluator, eval_data)
            history.append(row)
            end_of_epoch(epoch, row, history, config, writer, epochs, checkpoints,
                         stateful, optimizer, device, stop)
    except BaseException:
        for cleanup in (ctx.finish, plans.close):  # nothing left in flight...
            try:
                cleanup()
            except Exception:  # ...but the first error is the one reported
                pass
        raise
    try:
        ctx.finish()
    finally:
        plans.close()
    summary = summarize(history, config, world)
    if writer:
        writer.finish(summary, model, config, data.num_features, num_classes)
    return summary


# What a run writes into its out_dir (and --overwrite removes).
RUN_FILES = ("metrics.jsonl", "summary.json", "model.pt", "model.json", "checkpoint",
             "curves.png", "time_breakdown.png", "memory.png")


def claim_out_dir(out_dir: Optional[str], config: TrainConfig) -> None:
    r"""Refuses an :obj:`out_dir` that holds a run unless the config
    resumes it or overwrites it; on overwrite rank 0 removes the old run's
    files first (before any collective, so before any rank writes)."""
    if out_dir is None or not osp.isdir(out_dir):
        return
    found = [f for f in RUN_FILES if osp.exists(osp.join(out_dir, f))]
    if not found or config.resume:
        return
    if not config.overwrite:
        raise FileExistsError(f"'{out_dir}' holds a run ({', '.join(found)}): pass --resume "
                              f"to continue it or --overwrite to replace it")
    if dist.get_rank() == 0:
        for name in found:
            path = osp.join(out_dir, name)
            shutil.rmtree(path) if osp.isdir(path) else os.remove(path)


class NonFiniteError(FloatingPointError):
    r"""The loss or a gradient is not finite: training stops before the
    optimiser step, so the parameters, the metrics and the last checkpoint
    stay those of the last good epoch."""

    def __init__(self, epoch: int, loss: float) -> None:
        super().__init__(f"epoch {epoch}: the loss ({loss}) or a gradient is not finite; "
                         f"stopped before the optimiser step (nothing of this epoch was "
                         f"written). Lower --lr or check the input features")


def train_graph_root(root: str) -> str:
    r"""Where :func:`~pyg_dist.partition_graph` with ``inductive=True``
    wrote the partitions of the train nodes' subgraph."""
    path = osp.join(root, "train_graph")
    if not osp.exists(osp.join(path, "meta.json")):
        raise FileNotFoundError(f"'{root}' has no partitions of the train-node subgraph "
                                f"for inductive training: re-partition with --inductive")
    return path


# Fields that may change between a run and its resumption.
_RUN_CONTROL = ("epochs", "progress", "eval_every", "checkpoint_every", "checkpoint_dir",
                "resume", "overwrite", "background_sampling", "sampler_workers",
                "adaptive_depth")


def checkpointer(root: str, config: TrainConfig, out_dir: Optional[str],
                 world: int) -> Optional[Checkpointer]:
    r"""The run's :class:`~pyg_dist.checkpoint.Checkpointer` (``None``
    without checkpoints); a checkpoint is resumed only by a run with the
    same world size, graph and hyper-parameters (the epochs may grow)."""
    if not config.checkpoint_every and not config.resume:
        return None
    directory = config.checkpoint_dir or (osp.join(out_dir, "checkpoint") if out_dir else None)
    if directory is None:
        raise ValueError("checkpoints need a directory: give out_dir (--out) or "
                         "checkpoint_dir (--checkpoint-dir)")
    run = {k: v for k, v in asdict(config).items() if k not in _RUN_CONTROL}
    meta = read_meta(root)
    return Checkpointer(directory, config.checkpoint_every,
                        {"world_size": world, "graph_hash": meta["graph_hash"],
                         "partitioning_id": meta.get("partitioning_id"),
                         **json.loads(json.dumps(run))})  # compared with what JSON reads


def end_of_epoch(epoch: int, row: Dict[str, Any], history: List[Dict[str, Any]],
                 config: TrainConfig, writer, epochs, checkpoints: Optional[Checkpointer],
                 stateful: Dict[str, Any], optimizer, device, stop: bool = False) -> None:
    r"""Logs an epoch's metrics (file and progress bar) and checkpoints
    the run when one is due; when a rank was asked to stop (SIGTERM),
    checkpoints now (with checkpoints on) and raises :class:`TrainingStopped`."""
    if writer:
        writer.epoch(row)
    if hasattr(epochs, "set_postfix"):
        epochs.set_postfix(loss=f"{row['loss']:.3f}", val=row["val_acc"])
    if checkpoints is not None and (checkpoints.due(epoch, config.epochs)
                                    or (stop and checkpoints.every > 0)):
        state = {name: obj.state_dict() for name, obj in stateful.items()}
        checkpoints.save(epoch, {**state, "optimizer": optimizer.state_dict(),
                                 "rng": rng_state(device), "history": history})
    if stop and epoch < config.epochs:
        saved = checkpoints is not None and checkpoints.every > 0
        raise TrainingStopped(f"stopped by SIGTERM after epoch {epoch}" + (
            "; checkpoint written: continue with --resume" if saved else
            " (no checkpoint: train with --checkpoint-every N to resume)"))


class TrainingStopped(RuntimeError):
    r"""A rank was asked to stop (SIGTERM); the run ended after a whole epoch."""


def training_loop_parts(model: torch.nn.Module, data: Data, config: TrainConfig,
                        out_dir: Optional[str], desc: str, stateful: Dict[str, Any],
                        resumed: Optional[Dict[str, Any]] = None):
    r"""What every training loop starts with: the trainable parameters,
    their Adam optimiser, the global train count (a collective), rank 0's
    :class:`MetricsWriter` (``None`` elsewhere), the epochs to iterate (a
    progress bar named :obj:`desc` on rank 0) and the metrics so far. With a
    :obj:`resumed` checkpoint, the :obj:`stateful` objects, the optimiser and
    the random generators continue from it."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    num_train = int(sum_over_ranks(data.train_mask.sum().double())) or 1
    history: List[Dict[str, Any]] = []
    if resumed is not None:
        for name, obj in stateful.items():
            obj.load_state_dict(resumed[name])
        optimizer.load_state_dict(resumed["optimizer"])
        set_rng_state(resumed["rng"], next(model.parameters()).device)
        history = list(resumed["history"])
        if config.epochs < len(history):
            raise ValueError(f"The checkpoint is at epoch {len(history)}: --epochs "
                             f"{config.epochs} would train nothing (give more epochs)")
        check_same_model(model)
    rank = dist.get_rank()
    writer = MetricsWriter(out_dir, history) if rank == 0 and out_dir else None
    epochs = range(len(history) + 1, config.epochs + 1)
    if rank == 0 and config.progress:
        from tqdm import tqdm
        epochs = tqdm(epochs, desc=desc, unit="epoch", initial=len(history),
                      total=config.epochs)
    return params, optimizer, num_train, writer, epochs, history


def _train_epoch(epoch: int, model, data, config: TrainConfig, plans: PlanPrefetcher,
                 optimizer, params, num_train: int, world: int, device, evaluator,
                 eval_data) -> Dict[str, Any]:
    r"""One full-graph iteration, its evaluation (by :obj:`evaluator` on
    :obj:`eval_data`: the model itself, or its twin on the whole graph when
    training is inductive) and its metrics row."""
    ctx, stats = model.dist_context, model.comm_stats
    stats.reset()
    reset_peak_memory(device)
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    if isinstance(plans, CohesiveBatchLoader):
        loss, halo_rows = _train_batches(model, data, plans, optimizer, params, world, epoch)
    else:
        comm_before = stats.time["comm"]
        with stats.timer("sample"):  # plans are drawn as far ahead as the cache exchanges
            plan, upcoming = plans.next()
        # Waiting in the sampler's own collective counts as communication.
        stats.time["sample"] -= stats.time["comm"] - comm_before
        with ctx.use(plan, upcoming=upcoming):
            loss = _forward_backward(model, data.adj_t, data, num_train)
        ctx.cache.step()
        _step(params, optimizer, loss, epoch, world, stats)
        halo_rows = plan.num_recv
    step_time = time.perf_counter() - start
    row = {"epoch": epoch}
    peak = peak_memory_bytes(device)
    sums = torch.tensor([loss.item(), stats.total_bytes_sent, stats.total_bytes_recv,
                         halo_rows, data.num_halo, stats.counts["cache_hits"],
                         stats.counts["cache_lookups"], stats.counts["bytes_saved"]],
                        dtype=torch.double, device=device)
    maxes = torch.tensor([step_time, stats.time["comm"], stats.time["reduce"],
                          stats.time["sample"], float(stop_requested())],
                         dtype=torch.double, device=device)
    if epoch % config.eval_every == 0 or epoch == config.epochs:
        if evaluator is not model:
            evaluator.load_state_dict(model.state_dict())
        evaluator.eval()  # always on the exact plan, and exact (no autograd)
        with torch.no_grad():
            sums = torch.cat([sums, _correct_counts(evaluator(eval_data.x, eval_data.adj_t),
                                                    eval_data)])
    sums, maxes = sum_over_ranks(sums), max_over_ranks(maxes)
    row.update(loss=float(sums[0]), **(_accuracies(sums[8:]) if sums.numel() > 8 else
                                      dict.fromkeys(f"{m}_acc" for m in MASKS)))
    row.update(time=float(maxes[0]), time_comm=float(maxes[1]),
               time_reduce=float(maxes[2]), time_sample=float(maxes[3]),
               time_compute=float(maxes[0] - maxes[1] - maxes[2] - maxes[3]),
               bytes_sent=int(sums[1]), bytes_recv=int(sums[2]),
               halo_rows=int(sums[3]), halo_rows_total=int(sums[4]),
               **peak_memory_metrics(peak, device),
               cache_hit_rate=float(sums[5] / sums[6]) if sums[6] > 0 else None,
               bytes_saved=int(sums[7]), world_size=world)
    return row, bool(maxes[4])  # any rank asked to stop (the same answer on all)


def peak_memory_metrics(peak: int, device) -> Dict[str, Any]:
    r"""``peak_mem_bytes`` (max), ``peak_mem_bytes_mean`` and
    ``peak_mem_per_rank`` from every rank's :obj:`peak` (one all-gather)."""
    per_rank = [int(v) for v in gather_over_ranks(peak, device)]
    return {"peak_mem_bytes": max(per_rank),
            "peak_mem_bytes_mean": int(sum(per_rank) / len(per_rank)),
            "peak_mem_per_rank": per_rank}


def _train_batches(model, data, loader: CohesiveBatchLoader, optimizer, params,
                   world: int, epoch: int) -> Tuple[Tensor, int]:
    r"""One epoch of CM-GCN mini-batches: per batch, a forward and backward
    on its layer plans, a loss over its training nodes normalised by their
    global count, and a synchronous SGD step (gradients all-reduced).
    Returns the mean loss and the halo rows the first layers received."""
    ctx, stats = model.dist_context, model.comm_stats
    total, halo_rows = torch.zeros((), device=data.x.device), 0
    for batch in loader:
        optimizer.zero_grad(set_to_none=True)
        mask = batch.targets & batch.data.train_mask
        count = loader.count(batch.index, mask)
        model.train()
        with ctx.use(batch.plans):
            out = model(batch.x, batch.data.adj_t)
        mask = mask[:out.size(0)]  # the last layer's input rows, the batch's first
        loss = node_loss(out[mask], batch.data.y[:out.size(0)][mask]) / count
        loss.backward()
        _step(params, optimizer, loss, epoch, world, stats)
        total += loss.detach() / len(loader)
        halo_rows += batch.plans[0].num_recv
    return total, halo_rows


def summarize(history: List[Dict[str, Any]], config: TrainConfig, world: int) -> Dict[str, Any]:
    r"""Final accuracies and the mean epoch time over epochs after the first
    (which pays one-off costs such as building caches)."""
    timed = history[1:] or history
    mean = lambda k: sum(r[k] for r in timed) / len(timed)  # noqa: E731
    last = history[-1]
    evaluated = [r for r in history if r["val_acc"] is not None]
    best = max(evaluated, key=lambda r: r["val_acc"]) if evaluated else last
    return {
        "world_size": world, "epochs": len(history), "config": asdict(config),
        "final_loss": last["loss"], "train_acc": last["train_acc"],
        "val_acc": last["val_acc"], "test_acc": last["test_acc"],
        "best_val_acc": best["val_acc"], "test_acc_at_best_val": best["test_acc"],
        "epoch_time": mean("time"), "time_compute": mean("time_compute"),
        "time_comm": mean("time_comm"), "time_reduce": mean("time_reduce"),
        "time_sample": mean("time_sample"),
        "bytes_sent_per_epoch": mean("bytes_sent"),
        "bytes_saved_per_epoch": mean("bytes_saved"),
        "cache_hit_rate": _mean_of_known([r.get("cache_hit_rate") for r in timed]),
        "halo_rows_per_epoch": mean("halo_rows"),
        "halo_rows_total": last["halo_rows_total"],
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in history),
        "peak_mem_bytes_mean": max(r["peak_mem_bytes_mean"] for r in history),
    }


def _mean_of_known(values: List[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


class MetricsWriter:
    r"""Writes ``metrics.jsonl``, ``summary.json``, ``model.pt`` and
    ``model.json`` (how to rebuild the model) into an output directory."""

    def __init__(self, out_dir: str, history: Sequence[Dict[str, Any]] = ()) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir = out_dir
        self.file = open(osp.join(out_dir, "metrics.jsonl"), "w")
        for row in history:  # a resumed run: the epochs before its checkpoint
            self.epoch(row)

    def epoch(self, row: Dict[str, Any]) -> None:
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def finish(self, summary: Dict[str, Any], model: torch.nn.Module,
               config: TrainConfig, in_channels: int, out_channels: int) -> None:
        self.file.close()
        with open(osp.join(self.out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        torch.save(model.state_dict(), osp.join(self.out_dir, "model.pt"))
        with open(osp.join(self.out_dir, "model.json"), "w") as f:
            json.dump({"config": asdict(config), "in_channels": in_channels,
                       "out_channels": out_channels}, f, indent=1)


def load_model(out_dir: str) -> torch.nn.Module:
    r"""Rebuilds a trained model as a plain PyG model (any number of
    partitions, or none); distribute it again for distributed inference."""
    with open(osp.join(out_dir, "model.json")) as f:
        spec = json.load(f)
    model = build_model(TrainConfig(**spec["config"]), spec["in_channels"],
                        spec["out_channels"])
    model.load_state_dict(torch.load(osp.join(out_dir, "model.pt"), weights_only=True))
    return model


def train_single_process(data: Data, config: TrainConfig):
    r"""The same training in plain single-process PyG on the whole graph
    (inductive: on the train nodes' subgraph, evaluated on the whole graph),
    in its fastest configuration (fused CSR ``adj_t``), for comparisons.
    Returns ``(summary, model)``."""
    config.validate()
    model = build_model(config, data.num_features, num_classes_of(data.y))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay)
    adj_t = _adj_t(data)
    train_data = data.subgraph(data.train_mask) if config.inductive else data
    train_adj_t = _adj_t(train_data) if config.inductive else adj_t
    num_train = int(data.train_mask.sum())
    history = []
    for epoch in range(1, config.epochs + 1):
        reset_peak_memory()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = _forward_backward(model, train_adj_t, train_data, num_train)
        optimizer.step()
        row = {"epoch": epoch, "loss": loss.item(), "time": time.perf_counter() - start,
               "time_comm": 0.0, "time_reduce": 0.0, "time_sample": 0.0, "bytes_sent": 0,
               "bytes_saved": 0, "cache_hit_rate": None,
               "halo_rows": 0, "halo_rows_total": 0, "peak_mem_bytes": peak_memory_bytes()}
        row["peak_mem_bytes_mean"] = row["peak_mem_bytes"]
        row["time_compute"] = row["time"]
        if epoch % config.eval_every == 0 or epoch == config.epochs:
            model.eval()
            with torch.no_grad():
                row.update(_accuracies(_correct_counts(model(data.x, adj_t), data)))
        else:
            row.update(dict.fromkeys(f"{m}_acc" for m in MASKS))
        history.append(row)
    return summarize(history, config, 1), model


def _adj_t(data: Data) -> Tensor:
    return to_torch_csr_tensor(data.edge_index.flip(0), size=(data.num_nodes, data.num_nodes))
