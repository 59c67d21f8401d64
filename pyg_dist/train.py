"""The training loop: the batches of any registered loader, one step
function and one metrics path; and its single-process PyG twin for
comparisons."""
import copy
import math
import time
import warnings
from contextlib import nullcontext
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch_geometric.data import Data
from torch_geometric.utils import to_torch_csr_tensor

from pyg_dist.cache import FeatureCache, build_cache
from pyg_dist.checkpoint import Checkpointer, check_same_model, rng_state, set_rng_state
from pyg_dist.comm.stats import CommStats
from pyg_dist.config import (MODELS, TrainConfig, build_model, model_layer,  # noqa: F401
                             num_classes_of)
from pyg_dist.data import DistData
from pyg_dist.distributed import device as default_device
from pyg_dist.distributed import init, stop_at_epoch_end, stop_requested, stop_signal
from pyg_dist.loader import LOADERS, Loader, LoaderInputs, TrainBatch, build_loader
from pyg_dist.nn import distribute
from pyg_dist.nn.conv.sage_conv import project_first
from pyg_dist.nn.trim import trimmed, trims
from pyg_dist.metrics import (MASKS, MetricsWriter, correct_counts, accuracies,  # noqa: F401
                              baseline_memory_metrics, current_memory_bytes, epoch_row,
                              live_peak_sampler, peak_memory_bytes, reduce_over_ranks,
                              code_memory_bytes, code_memory_metrics,
                              reset_peak_memory, summarize)
from pyg_dist.partition.book import read_meta
from pyg_dist.reducer import GradientReducer, reduces
# load_model: also importable from here, as documented (pyg_dist.train.load_model).
from pyg_dist.run_files import (checkpointer, claim_out_dir, load_model,  # noqa: F401
                                remove_old_run, require_labelled_training_nodes,
                                train_graph_root)
from pyg_dist.utils.allocator import (THP_ENV, follow_live_memory, release_free_memory,
                                      reuse_freed_memory, thread_cache_on)
from pyg_dist.sampler import build_sampler
from pyg_dist.utils.sparse import valid_sparse


def train(root: str, config: TrainConfig, out_dir: Optional[str] = None) -> Dict[str, Any]:
    r"""Trains on the partitions in :obj:`root` as one rank of the current
    process group (a world of one is created if none exists), on the
    batches of ``config.loader``.

    Per step, the loss is the node loss summed over this rank's batch rows
    divided by the batch's rows on *all* ranks, so the gradients summed by
    one bucketed all-reduce equal single-process training on the union of
    the ranks' batches. Evaluation is exact full-graph inference. Rank 0
    writes ``out_dir/metrics.jsonl`` (one object per epoch),
    ``out_dir/summary.json`` and ``out_dir/model.pt`` (a plain PyG
    ``state_dict``, see :func:`~pyg_dist.run_files.load_model`). Returns the summary.
    """
    config.validate()
    huge_pages = follow_live_memory() if config.malloc == "compact" else None
    if config.malloc == "reuse":
        reuse_freed_memory()
    init()
    if huge_pages is False and dist.get_rank() == 0:
        warnings.warn(f"--malloc compact: torch's buffers do not get huge pages (the "
                      f"kernel has none, or torch allocated one of 2 MiB before the "
                      f"setting): every step faults in 4 KiB pages. Set {THP_ENV}=1 in the "
                      f"ranks' environment (e.g. torchrun's) before torch starts.",
                      stacklevel=2)
    require_labelled_training_nodes(root, read_meta(root))
    old_run = claim_out_dir(out_dir, config)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = default_device()
    checkpoints = checkpointer(root, config, out_dir, world)
    resumed = checkpoints.load() if config.resume else None
    loader_class = LOADERS[config.loader]
    # An undistributed model's loader samples from the partition on the CPU.
    data_device = device if loader_class.distributed else None
    data = _load_partition(root, rank, data_device)
    eval_data = data if device.type == "cpu" or loader_class.distributed else \
        copy.copy(data).to(device)  # Data.to moves in place: the loader keeps the CPU rows
    # The classes the partitioning checked and recorded: the largest label + 1,
    # or a declared label space (whose last classes may have no node).
    num_classes = read_meta(root)["num_classes"]
    model = build_model(config, data.num_features, num_classes).to(device)
    if not loader_class.distributed:  # a plain model: its layers project first where cheaper
        project_first(model)
    _broadcast_params(model)
    evaluator = model
    if config.inductive or not loader_class.distributed:
        evaluator = distribute(copy.deepcopy(model), eval_data)
    if config.inductive:  # the model trains on the train nodes' subgraph only
        data = _load_partition(train_graph_root(root), rank, data_device)
    stats, ctx, stateful = CommStats(), None, {"model": model}
    inputs = LoaderInputs(root, data, config.num_layers, config.seed, device, stats,
                          feature_cache_capacity=(config.feature_cache_capacity
                                                  if config.feature_cache else None),
                          model=model)
    if loader_class.distributed:
        ctx = _distribute(model, data, config, inputs)
        stateful.update(sampler=inputs.sampler, cache=ctx.cache)
    loader = stateful["loader"] = build_loader(config.loader, inputs, **config.loader_args)
    remove_old_run(out_dir, old_run)  # every rank has read its inputs
    params, optimizer, writer, epochs, history = training_loop_parts(
        model, config, out_dir, f"train {config.model} x{world}"
        + ("" if config.loader == "full" else f" ({config.loader})"), stateful, resumed)
    run = _Run(model, evaluator, eval_data, loader, ctx, stats, optimizer, params, config,
               world, device, data.num_halo)
    if run.reducer is not None:  # its bucket order decides the sums' last bits
        stateful["reducer"] = run.reducer
        if resumed is not None:
            run.reducer.load_state_dict(resumed["reducer"])
    if config.loader == "full":  # every epoch reads all of it: in the baseline, as documented
        read_mapped_pages(data.x)
    run.baseline = baseline_memory_metrics(device)
    run.baseline_code = code_memory_bytes(device)
    stop_at_epoch_end()  # before: a stop signal stops the set-up at once (nothing to keep)
    try:
        for epoch in epochs:
            row, stop = run.epoch(epoch)
            history.append(row)
            end_of_epoch(epoch, row, history, config, writer, epochs, checkpoints,
                         stateful, optimizer, device, stop)
    except BaseException:
        for close in run.closers():  # nothing left in flight...
            try:
                close()
            except Exception:  # ...but the first error is the one reported
                pass
        raise
    for close in run.closers():
        close()
    summary = summarize(history, config.to_dict(), world, loader.summary_keys)
    summary["malloc_thread_cache"] = thread_cache_on()  # this rank's (rank 0's in the file)
    # how the layers aggregated with remote rows (docs/architecture.md); "pyg":
    # the model ran as plain PyG on the loader's batches
    summary["engine"] = model.dist_engine.name if hasattr(model, "dist_engine") else "pyg"
    if summary["engine"] != "pyg" and model.dist_engine.budgets_memory:
        # per layer: its whole halo at once, or one peer's rows at a time
        summary["layer_aggregation"] = model.dist_engine.choices()
    if writer:
        writer.finish(summary, model, data.num_features, num_classes)
    return summary


def read_mapped_pages(x: Optional[Tensor]) -> None:
    r"""Reads one element of every memory page of the CPU tensor :obj:`x`:
    a partition's features are memory-mapped from its file (copy-on-write),
    so a page joins the rank's resident memory when first read. Read before
    the baseline is taken, the partition is in ``baseline_mem_bytes`` and
    not in the first epoch's peak above it (a few milliseconds: the pages
    are in the page cache since the partition was checked)."""
    if x is None or x.device.type != "cpu" or x.numel() == 0 or not x.is_contiguous():
        return
    flat = x.reshape(-1)
    flat[::max(1, 4096 // x.element_size())].sum()


def _load_partition(root: str, rank: int, device: Optional[torch.device]):
    r"""This rank's partition, on :obj:`device` (``None``: the CPU)."""
    data = DistData.load(root, rank)
    return data.to(device) if device is not None else data


def _distribute(model: torch.nn.Module, data, config: TrainConfig,
                inputs: LoaderInputs):
    r"""Distributes :obj:`model` over :obj:`data` with the run's caches and
    layer options, and builds the run's halo sampler into :obj:`inputs`.
    Returns the model's :class:`~pyg_dist.nn.HaloContext`."""
    cache = build_cache(config.cache, **config.cache_args)
    feature_cache = (FeatureCache(config.feature_cache, config.feature_cache_capacity,
                                  config.seed) if config.feature_cache else None)
    distribute(model, data, stats=inputs.stats, precompute_layer0=config.precompute_layer0,
               exchange_dtype=config.exchange_dtype, cache=cache,
               feature_cache=feature_cache, overlap=config.overlap,
               exchange=config.exchange, memory_budget=config.memory_budget)
    ctx = model.dist_context
    sampler_args = dict(config.sampler_args)
    if config.sampler == "vr":  # PSC's coefficient c_ij is GCN's; others aggregate plainly
        sampler_args.setdefault("coefficient", "gcn" if config.model == "gcn" else "uniform")

    def make_sampler(part):
        return build_sampler(config.sampler, part, seed=config.seed, stats=inputs.stats,
                             **sampler_args)

    inputs.context, inputs.sampler = ctx, make_sampler(data)
    inputs.make_sampler = None if config.sampler == "full" else make_sampler
    inputs.sampler.attach(ctx)
    if feature_cache is not None:
        feature_cache.attach(ctx, inputs.sampler)
    return ctx


class _Run:
    r"""One training run's parts, and its epoch: the loader's steps, an
    evaluation, and the metrics row."""

    def __init__(self, model, evaluator, eval_data, loader: Loader, ctx, stats: CommStats,
                 optimizer, params: List[Tensor], config: TrainConfig, world: int,
                 device: torch.device, num_halo: int) -> None:
        self.model, self.evaluator, self.eval_data = model, evaluator, eval_data
        self.loader, self.ctx, self.stats = loader, ctx, stats
        self.optimizer, self.params, self.config = optimizer, params, config
        self.world, self.device, self.num_halo = world, device, num_halo
        self.takes_adj_t = model_layer(config.model).takes_adj_t
        self.trims = trims(model)  # a sampled batch's layers: only the rows needed
        self.baseline: Dict[str, Any] = {}  # memory before the first step
        self.baseline_code: Optional[int] = None  # its executable pages
        self.live = live_peak_sampler(device)  # the peak of live memory, per epoch
        self.release_next = True  # release free heap pages at the next epoch's start
        self.epochs_released = 0
        # The all-reduce overlaps backward, unless each rank must clip its
        # whole local gradient first (SANCUS).
        self.reducer = GradientReducer(params, stats=stats) \
            if reduces() and config.clip_grad is None else None

    def closers(self):
        r"""What completes or releases the run's work in flight, in order."""
        contexts = [m.dist_context for m in (self.model, self.evaluator)
                    if hasattr(m, "dist_context")]
        closers = [c.finish for c in dict.fromkeys(contexts)] + [self.loader.close]
        closers += [self.live.close] if self.live is not None else []
        return closers + ([self.reducer.remove] if self.reducer is not None else [])

    def epoch(self, epoch: int) -> Tuple[Dict[str, Any], bool]:
        r"""One epoch of steps, its evaluation (every ``eval_every`` epochs)
        and its metrics row; and whether any rank was asked to stop."""
        stats, loader = self.stats, self.loader
        stats.reset()
        loader.reset_metrics()
        code = code_memory_bytes(self.device)
        start = time.perf_counter()
        # What the last epoch freed (its holes in the heap, one-off buffers,
        # evaluation) leaves the resident set before this epoch's peak, as
        # long as that pays (see _releases_next).
        released = self._release() if self.release_next else None
        reset_peak_memory(self.device)
        if self.live is not None:
            self.live.reset()
        loss = torch.zeros((), device=self.device)
        halo_rows = 0
        for batch in loader:
            loss += self.step(batch, epoch) * batch.loss_weight
            halo_rows += batch.halo_rows
        step_time = time.perf_counter() - start
        peak = peak_memory_bytes(self.device)
        live_peak = self.live.peak if self.live is not None else None
        sums = {"loss": loss.item(), "bytes_sent": stats.total_bytes_sent,
                "bytes_recv": stats.total_bytes_recv, "halo_rows": halo_rows,
                "halo_rows_total": self.num_halo, "cache_hits": stats.counts["cache_hits"],
                "cache_lookups": stats.counts["cache_lookups"],
                "bytes_saved": stats.counts["bytes_saved"]}
        maxes = {"time": step_time, "time_comm": stats.time["comm"],
                 "time_reduce": stats.time["reduce"], "time_sample": stats.time["sample"],
                 "time_comm_backward": stats.time["comm_backward"],
                 "stop": float(stop_requested())}
        loader_sums, loader_maxes = loader.metrics()
        for mine, theirs in ((sums, loader_sums), (maxes, loader_maxes)):
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0.0) + value
        evaluated = self.config.evaluates(epoch)
        if evaluated:
            sums.update(self.evaluate())
        self.release_next = evaluated or self._releases_next(released, peak)
        sums, maxes = reduce_over_ranks(sums, maxes, self.device)
        row = epoch_row(epoch, sums, maxes, peak, self.device, self.world, live_peak)
        row.update(self.baseline)
        row.update(code_memory_metrics(code, self.baseline_code, self.device))
        row["time_comm_backward"] = maxes["time_comm_backward"]  # the part of time_comm
        row.update(loader.row_fields(sums, row, self.world))
        return row, bool(maxes["stop"])  # any rank asked to stop (the same answer on all)

    def _release(self) -> Tuple[int, int]:
        r"""Releases the heap's free pages; the resident set before and after."""
        before = current_memory_bytes()
        release_free_memory()
        self.epochs_released += 1
        return before, current_memory_bytes()

    def _releases_next(self, released: Optional[Tuple[int, int]], peak: int) -> bool:
        r"""Whether the next epoch starts with a release, after one without an
        evaluation: after the first epoch (its one-off buffers), and on CPU
        while the steps left out of their peak at least as many of the pages
        the release at their epoch's start took out as they faulted back in.
        Faulted back, a page costs the fault and lowers no peak (measured:
        2 parts of ``reddit_shaped``, neighbour loader, the 126-161 MB a
        rank's release took out at the second epoch's start were all faulted
        back in)."""
        if released is None:
            return False
        before, after = released
        faulted = min(max(peak - after, 0), before - after)
        return (self.device.type != "cpu" or self.epochs_released == 1
                or before - after - faulted >= faulted)

    def step(self, batch: TrainBatch, epoch: int) -> Tensor:
        r"""One forward, backward (the gradients' all-reduce overlapping
        it, :mod:`pyg_dist.reducer`) and optimiser step on :obj:`batch`;
        returns its (detached) loss."""
        # the reducer's gradients are views of its buffers, zeroed in place
        self.optimizer.zero_grad(set_to_none=self.reducer is None)
        self.model.train()
        distributed = batch.plans is not None
        graph = batch.adj_t if distributed or self.takes_adj_t else batch.edge_index
        if distributed:
            scope = self.ctx.use(batch.plans, batch.upcoming,
                                 input_features=batch.input_features)
        elif self.trims and "num_sampled_nodes" in batch.extra:
            scope = trimmed(self.model, batch.adj_t, batch.num_sampled_nodes,
                            batch.extra.get("rows_plan"))
        else:
            scope = nullcontext()
        with scope:
            loss = batch_loss(self.model(batch.x, graph), batch)
            if self.live is not None:  # every activation saved for backward is live
                self.live.sample()
            if self.reducer is not None:
                self.reducer.start(loss)
            loss.backward()
        if distributed:
            self.ctx.cache.step()
        if self.reducer is None:
            _step(self.params, self.optimizer, loss, epoch, self.world, self.stats,
                  self.config.clip_grad, self.config.exchange_dtype)
        else:
            total, finite = self.reducer.wait()
            if not finite:
                raise NonFiniteError(epoch, total, self.config.exchange_dtype)
            self.optimizer.step()
        return loss.detach()

    def evaluate(self) -> Dict[str, float]:
        r"""Correct counts of the model on the whole partition: on the exact
        plan and exact (no autograd)."""
        if self.evaluator is not self.model:
            self.evaluator.load_state_dict(self.model.state_dict())
        self.evaluator.eval()
        with torch.no_grad():
            return correct_counts(self.evaluator(self.eval_data.x, self.eval_data.adj_t),
                                  self.eval_data)


def batch_loss(out: Tensor, batch: TrainBatch) -> Tensor:
    r"""The node loss of :obj:`batch`'s target rows of :obj:`out` (the
    model's first rows) over the batch's global row count."""
    rows = out.size(0)
    mask = batch.targets[:rows]
    return node_loss(out[mask], batch.y[:rows][mask]) / batch.loss_count


def node_loss(out: Tensor, y: Tensor) -> Tensor:
    r"""The loss of every row of :obj:`out` against :obj:`y`, summed over
    the rows: cross-entropy, or for multi-hot :obj:`y` (Yelp,
    AmazonProducts) the binary cross-entropy averaged over the labels, as in
    GraphSAINT and BNS-GCN."""
    if y.dim() > 1:
        return F.binary_cross_entropy_with_logits(out, y, reduction="sum") / max(y.size(1), 1)
    return F.cross_entropy(out, y, reduction="sum")


def _allreduce_grads(params: List[Tensor], group=None,
                     loss: Optional[Tensor] = None) -> Tuple[float, bool]:
    r"""One bucketed all-reduce of all weight gradients (sum: the loss is
    already normalised by the global row count) and, in the same buffer,
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


def clip_local_grads(params: List[Tensor], clip: float, world: int) -> float:
    r"""SANCUS's local gradient clipping (§4.3.2): this rank's gradient,
    its term of the all-reduced sum, is scaled to norm at most
    :math:`th_i = \sqrt{P} \cdot th` (:obj:`clip` is :math:`th`,
    :obj:`world` is :math:`P`), the local threshold the paper sets for
    :math:`P` workers:

    .. math::
        g_i \leftarrow g_i \cdot \min\left(1, \frac{\sqrt{P}\, th}{\|g_i\|_2}\right)

    with :math:`\|g_i\|_2` over all parameters. Returns the norm before
    clipping."""
    return float(torch.nn.utils.clip_grad_norm_(params, math.sqrt(world) * clip))


def _step(params: List[Tensor], optimizer, loss: Tensor, epoch: int, world: int,
          stats: CommStats, clip_grad: Optional[float] = None,
          exchange_dtype: str = "fp32") -> None:
    r"""Sums the gradients over the ranks and steps, unless the loss or a
    gradient is not finite (:class:`NonFiniteError`, on every rank); with
    :obj:`clip_grad`, each rank clips its own gradient first
    (:func:`clip_local_grads`)."""
    if clip_grad is not None:
        clip_local_grads(params, clip_grad, world)
    with stats.timer("reduce") if world > 1 else nullcontext():
        total, finite = _allreduce_grads(params, loss=loss)
    if not finite:
        raise NonFiniteError(epoch, total, exchange_dtype)
    optimizer.step()


def _broadcast_params(model: torch.nn.Module) -> None:
    params = [p.data for p in model.parameters()]
    flat = _flatten_dense_tensors(params)
    dist.broadcast(flat, src=0)
    for p, v in zip(params, _unflatten_dense_tensors(flat, params)):
        p.copy_(v)


class NonFiniteError(FloatingPointError):
    r"""The loss or a gradient is not finite: training stops before the
    optimiser step, so the parameters, the metrics and the last checkpoint
    stay those of the last good epoch. Under an fp16 exchange the hint
    names its range first: a halo row or gradient above 65504 becomes inf
    in transit."""

    def __init__(self, epoch: int, loss: float, exchange_dtype: str = "fp32") -> None:
        hint = ("--exchange-dtype fp16 carries values up to 65504 only (larger halo rows "
                "or gradients become inf): use bf16 (float32's range) or fp32, or lower "
                "--lr or scale the input features" if exchange_dtype == "fp16" else
                "Lower --lr or check the input features")
        super().__init__(f"epoch {epoch}: the loss ({loss}) or a gradient is not finite; "
                         f"stopped before the optimiser step (nothing of this epoch was "
                         f"written). {hint}")


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
        raise TrainingStopped(f"stopped by {stop_signal() or 'SIGTERM'} after epoch {epoch}" + (
            "; checkpoint written: continue with --resume" if saved else
            " (no checkpoint: train with --checkpoint-every N to resume)"))


class TrainingStopped(RuntimeError):
    r"""A rank was asked to stop (SIGTERM); the run ended after a whole epoch."""


def training_loop_parts(model: torch.nn.Module, config: TrainConfig,
                        out_dir: Optional[str], desc: str, stateful: Dict[str, Any],
                        resumed: Optional[Dict[str, Any]] = None):
    r"""What a training loop starts with: the trainable parameters, their
    Adam optimiser, rank 0's :class:`~pyg_dist.metrics.MetricsWriter`
    (``None`` elsewhere), the epochs to iterate (a progress bar named
    :obj:`desc` on rank 0) and the metrics so far. With a :obj:`resumed`
    checkpoint, the :obj:`stateful` objects, the optimiser and the random
    generators continue from it."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
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
    return params, optimizer, writer, epochs, history


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
    batch = TrainBatch(x=train_data.x, y=train_data.y, targets=train_data.train_mask,
                       adj_t=_adj_t(train_data) if config.inductive else adj_t,
                       loss_count=int(data.train_mask.sum()))
    history = []
    baseline = current_memory_bytes()
    for epoch in range(1, config.epochs + 1):
        reset_peak_memory()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model.train()
        loss = batch_loss(model(batch.x, batch.adj_t), batch)
        loss.backward()
        optimizer.step()
        row = {"epoch": epoch, "loss": loss.item(), "time": time.perf_counter() - start,
               "time_comm": 0.0, "time_reduce": 0.0, "time_sample": 0.0, "bytes_sent": 0,
               "bytes_saved": 0, "cache_hit_rate": None,
               "halo_rows": 0, "halo_rows_total": 0, "peak_mem_bytes": peak_memory_bytes()}
        row["peak_mem_bytes_mean"] = row["peak_mem_bytes"]
        row["baseline_mem_bytes"] = row["baseline_mem_bytes_mean"] = baseline
        row["time_compute"] = row["time"]
        counts = None
        if config.evaluates(epoch):
            model.eval()
            with torch.no_grad():
                counts = correct_counts(model(data.x, adj_t), data)
        row.update(accuracies(counts))
        history.append(row)
    return summarize(history, config.to_dict(), 1), model


def _adj_t(data: Data) -> Tensor:
    with valid_sparse():  # built from the graph's own edge_index
        return to_torch_csr_tensor(data.edge_index.flip(0),
                                   size=(data.num_nodes, data.num_nodes))
