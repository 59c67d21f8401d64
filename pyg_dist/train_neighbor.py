r"""The training loop of ``--loader neighbor``: DistDGL-style synchronous SGD
on neighbour-sampled mini-batches, with exact full-graph evaluation."""
import copy
import time
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

import pyg_dist
from pyg_dist.distributed import max_over_ranks, stop_requested, sum_over_ranks
from pyg_dist.loader.neighbor.loader import PartitionNeighborLoader
from pyg_dist.comm.stats import CommStats
from pyg_dist.metrics import peak_memory_bytes, reset_peak_memory
from pyg_dist.train import (MASKS, TrainConfig, _accuracies, _broadcast_params,
                            _correct_counts, _step, build_model, checkpointer,
                            end_of_epoch, node_loss, num_classes_of, peak_memory_metrics,
                            summarize,
                            train_graph_root, training_loop_parts)


def train_neighbor(root: str, config: TrainConfig,
                   out_dir: Optional[str] = None) -> Dict[str, Any]:
    r"""Trains a plain PyG model on :class:`PartitionNeighborLoader` mini-batches
    (fan-outs ``config.fanout``, ``config.batch_size`` seeds per rank and
    step), one rank of the current process group. Per step every rank's
    loss is its seeds' summed cross-entropy over the step's seed count on
    all ranks, and weight gradients are summed by one all-reduce, so a step
    is one SGD step on the union of the ranks' batches. Evaluation is exact
    full-graph inference on the partitions (a distributed twin of the model).
    Writes and returns what :func:`pyg_dist.train.train` does, plus the
    sampling metrics (``seeds_per_s``, ``trainer_idle``, ``queue_len``,
    ``feature_bytes``, ...)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = pyg_dist.device()
    checkpoints = checkpointer(root, config, out_dir, world)
    resumed = checkpoints.load() if config.resume else None
    data = pyg_dist.DistData.load(root, rank)  # on the CPU: the sampler's and store's
    num_classes = int(max_over_ranks(torch.tensor([num_classes_of(data.y)]))[0])
    model = build_model(config, data.num_features, num_classes).to(device)
    _broadcast_params(model)
    # Data.to moves in place: the sampler and the feature store keep the CPU rows.
    eval_data = copy.copy(data).to(device) if device.type != "cpu" else data
    evaluator = pyg_dist.nn.distribute(copy.deepcopy(model), eval_data)
    if config.inductive:  # batches are sampled from the train nodes' subgraph
        data = pyg_dist.DistData.load(train_graph_root(root), rank)
    loader = PartitionNeighborLoader(
        data, config.fanout, config.batch_size, seed=config.seed,
        num_workers=config.sampler_workers, adaptive=config.adaptive_depth,
        cache_capacity=config.feature_cache_capacity if config.feature_cache else 0,
        device=device)
    stateful = {"model": model, "loader": loader}
    params, optimizer, num_train, writer, epochs, history = training_loop_parts(
        model, data, config, out_dir, f"train {config.model} x{world} (neighbor)",
        stateful, resumed)
    try:
        for epoch in epochs:
            row, stop = _epoch(epoch, model, evaluator, eval_data, loader, optimizer,
                               params, config, num_train, world, device)
            history.append(row)
            end_of_epoch(epoch, row, history, config, writer, epochs, checkpoints,
                         stateful, optimizer, device, stop)
    finally:
        loader.close()
        evaluator.dist_context.finish()
    summary = summarize(history, config, world)
    timed = history[1:] or history
    for key in ("seeds_per_s", "trainer_idle", "trainer_idle_frac", "queue_len",
                "in_flight", "feature_bytes"):
        summary[key] = sum(r[key] for r in timed) / len(timed)
    summary["local_seed_fraction"] = history[-1]["local_seed_fraction"]
    if writer:
        writer.finish(summary, model, config, data.num_features, num_classes)
    return summary


def _epoch(epoch: int, model, evaluator, data, loader: PartitionNeighborLoader, optimizer,
           params, config: TrainConfig, num_train: int, world: int,
           device) -> Dict[str, Any]:
    loader.reset_report()
    stats = CommStats()
    reset_peak_memory(device)
    start = time.perf_counter()
    loss_sum = torch.zeros((), dtype=torch.double, device=device)
    seeds = 0
    for step, batch in enumerate(loader):
        size = batch.batch_size
        model.train()
        optimizer.zero_grad(set_to_none=True)
        graph = batch.edge_index if config.model == "gat" else batch.adj_t
        out = model(batch.x, graph)[:size]
        loss = node_loss(out, batch.y[:size])
        scaled = loss / max(loader.global_batch_size(step), 1)
        scaled.backward()
        _step(params, optimizer, scaled, epoch, world, stats)
        loss_sum += loss.detach()
        seeds += size
    step_time = time.perf_counter() - start
    report = loader.report()
    row_bytes = sum(t[0].numel() * t.element_size() for t in loader.store.tensors.values())
    peak = peak_memory_bytes(device)
    sums = torch.tensor([float(loss_sum), report["bytes_sent"], report["bytes_recv"],
                         report["feature_bytes"], report["cache_hits"],
                         report["cache_lookups"], report["queue_len"],
                         report["in_flight"], seeds, loader.local_seed_fraction,
                         data.num_halo], dtype=torch.double, device=device)
    maxes = torch.tensor([step_time, stats.time["reduce"], report["idle"],
                          float(stop_requested())], dtype=torch.double, device=device)
    if epoch % config.eval_every == 0 or epoch == config.epochs:
        evaluator.load_state_dict(model.state_dict())
        evaluator.eval()
        with torch.no_grad():
            sums = torch.cat([sums, _correct_counts(evaluator(data.x, data.adj_t), data)])
    sums, maxes = sum_over_ranks(sums), max_over_ranks(maxes)
    (loss, sent, recv, feature_bytes, hits, lookups, queue, depth, seeds, local,
     halo_total) = sums[:11].tolist()
    step_time, reduce_time, idle, stop = maxes.tolist()
    row = {"epoch": epoch, "loss": loss / num_train}
    row.update(_accuracies(sums[11:]) if sums.numel() > 11 else
               dict.fromkeys(f"{m}_acc" for m in MASKS))
    row.update(time=step_time, time_comm=0.0, time_reduce=reduce_time, time_sample=idle,
               time_compute=step_time - reduce_time - idle,
               bytes_sent=int(sent), bytes_recv=int(recv),
               halo_rows=int(lookups - hits), halo_rows_total=int(halo_total),
               **peak_memory_metrics(peak, device),
               cache_hit_rate=hits / lookups if loader.store.num_cached and lookups else None,
               bytes_saved=int(hits * row_bytes), world_size=world,
               seeds_per_s=seeds / step_time, trainer_idle=idle,
               trainer_idle_frac=idle / step_time, queue_len=queue / world,
               in_flight=depth / world, feature_bytes=int(feature_bytes),
               local_seed_fraction=local / world)
    return row, bool(stop)  # any rank asked to stop (the same answer on all)
