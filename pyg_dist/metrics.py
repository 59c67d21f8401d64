"""What a run measures per epoch: peak memory per rank, the counters every
rank sums or maximises (by name), accuracies, and the files they go to."""
import json
import os
import os.path as osp
import resource
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_dist.datasets.real import f1_counts
from pyg_dist.distributed import gather_over_ranks, max_over_ranks, sum_over_ranks
from pyg_dist.integrity import save_checked, save_json
from pyg_dist.utils.allocator import PeakSampler, code_resident_bytes, malloc_in_use


def reset_peak_memory(device: torch.device = torch.device("cpu")) -> None:
    r"""Starts a new peak-memory window (e.g. per epoch): resets CUDA's peak
    allocation counter, or on Linux the process' resident-set high-water
    mark (``/proc/self/clear_refs``); elsewhere the peak stays the
    process-lifetime one."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory_bytes(device: torch.device = torch.device("cpu")) -> int:
    r"""Peak memory of this process since the last :func:`reset_peak_memory`:
    allocated GPU memory on CUDA, the resident set size (RSS) high-water
    mark on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    hwm = _proc_status_bytes("VmHWM")
    return hwm if hwm is not None else \
        int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def current_memory_bytes(device: torch.device = torch.device("cpu")) -> int:
    r"""Memory this process holds now: allocated GPU memory on CUDA, the
    resident set size (RSS) on CPU (0 where it cannot be read)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return _proc_status_bytes("VmRSS") or 0


def _proc_status_bytes(field: str) -> Optional[int]:
    r"""A memory field of ``/proc/self/status`` (e.g. ``VmRSS``) in bytes;
    ``None`` where there is none (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def baseline_memory_metrics(device) -> Dict[str, Any]:
    r"""``baseline_mem_bytes`` (max over ranks), ``baseline_mem_bytes_mean``
    and ``baseline_mem_per_rank``: every rank's :func:`current_memory_bytes`
    once the partition and the model are loaded, before the first step (the
    interpreter, the libraries and the partition, so that ``peak_mem_bytes``
    minus it is what training itself adds; one all-gather). On CPU with
    glibc also ``baseline_live_mem_bytes`` (max), ``..._mean`` and
    ``baseline_live_mem_per_rank``: every rank's :func:`live_memory_bytes`
    then, the baseline of ``live_mem_*``."""
    return {**_over_ranks("baseline_mem", current_memory_bytes(device), device),
            **_over_ranks("baseline_live_mem", live_memory_bytes(device), device)}


def live_memory_bytes(device: torch.device = torch.device("cpu")) -> Optional[int]:
    r"""Memory this process' tensors and buffers hold now (live memory, as
    opposed to what the process keeps resident): on CPU the bytes glibc's
    malloc has handed out (:func:`~pyg_dist.utils.allocator.malloc_in_use`);
    ``None`` on CUDA (whose allocated bytes ``peak_mem_bytes`` already
    is) and without glibc."""
    return malloc_in_use() if device.type == "cpu" else None


def code_memory_bytes(device: torch.device = torch.device("cpu")) -> Optional[int]:
    r"""The resident bytes of this process' machine code
    (:func:`~pyg_dist.utils.allocator.code_resident_bytes`) on CPU; ``None``
    on CUDA (whose memory figures are allocations) and where unreadable."""
    return code_resident_bytes() if device.type == "cpu" else None


def code_memory_metrics(now: Optional[int], baseline: Optional[int],
                        device) -> Dict[str, Any]:
    r"""``code_mem_bytes`` (max over ranks), ``code_mem_bytes_mean`` and
    ``code_mem_per_rank``: the machine code every rank has paged in since
    the baseline (:obj:`now` minus :obj:`baseline`, read at an epoch's
    start): libtorch's kernels the first steps and evaluation ran, a few
    MiB per rank, shared by every process on the machine and independent
    of the graph. In an epoch's RSS peak (``peak_mem_*``), so that
    ``peak_mem - baseline_mem - code_mem`` is what the training's data
    adds. Nothing where a rank cannot read it (one all-gather)."""
    value = None if now is None or baseline is None else max(now - baseline, 0)
    return _over_ranks("code_mem", value, device)


def live_peak_sampler(device: torch.device = torch.device("cpu")) -> Optional[PeakSampler]:
    r"""A sampler of the peak of :func:`live_memory_bytes` (``None`` where
    there is none to sample)."""
    return PeakSampler() if live_memory_bytes(device) is not None else None


def _over_ranks(name: str, value: Optional[int], device) -> Dict[str, Any]:
    r"""``{name}_bytes`` (max over ranks), ``{name}_bytes_mean`` and
    ``{name}_per_rank`` of every rank's :obj:`value` (one all-gather;
    nothing where a rank has no value: every rank takes part either way)."""
    per_rank = [int(v) for v in gather_over_ranks(-1 if value is None else value, device)]
    if min(per_rank) < 0:
        return {}
    return {f"{name}_bytes": max(per_rank), f"{name}_bytes_mean": int(sum(per_rank) / len(per_rank)),
            f"{name}_per_rank": per_rank}


MASKS = ("train", "val", "test")
# The per-epoch counters every run sums over its ranks (missing ones are 0).
SUMMED = ("loss", "bytes_sent", "bytes_recv", "halo_rows", "halo_rows_total", "cache_hits",
          "cache_lookups", "bytes_saved")
# ...and those of which it takes the largest over its ranks.
MAXED = ("time", "time_comm", "time_reduce", "time_sample", "stop")


def reduce_over_ranks(sums: Dict[str, float], maxes: Dict[str, float],
                      device: torch.device) -> Tuple[Dict[str, float], Dict[str, float]]:
    r"""Named values summed and maximised over the ranks (two all-reduces
    in all; the names are the same on every rank)."""
    out = []
    for values, reduce in ((sums, sum_over_ranks), (maxes, max_over_ranks)):
        names = sorted(values)
        total = reduce(torch.tensor([float(values[k]) for k in names], dtype=torch.double,
                                    device=device))
        out.append(dict(zip(names, total.tolist())))
    return out[0], out[1]


def correct_counts(out: Tensor, data) -> Dict[str, float]:
    r"""Per mask, a numerator and a denominator to sum over ranks: correct
    and all nodes (accuracy), or for multi-label :math:`2TP` and
    :math:`2TP + FP + FN` (micro-F1)."""
    counts = {}
    for m in MASKS:
        mask = data[f"{m}_mask"]
        if data.y.dim() > 1:
            tp, fp, fn = f1_counts(out[mask], data.y[mask])
            counts[f"{m}_hit"], counts[f"{m}_of"] = 2 * tp, 2 * tp + fp + fn
        else:
            counts[f"{m}_hit"] = (out[mask].argmax(-1) == data.y[mask]).sum()
            counts[f"{m}_of"] = mask.sum()
    return {k: float(v) for k, v in counts.items()}


def accuracies(counts: Optional[Dict[str, float]]) -> Dict[str, Optional[float]]:
    r"""``{train,val,test}_acc`` from summed :func:`correct_counts`
    (``None`` in an epoch without evaluation, and for an empty mask: an
    accuracy of no node is no number, and a best validation accuracy must
    not be chosen among zeros)."""
    if counts is None or f"{MASKS[0]}_hit" not in counts:
        return dict.fromkeys(f"{m}_acc" for m in MASKS)
    return {f"{m}_acc": counts[f"{m}_hit"] / counts[f"{m}_of"] if counts[f"{m}_of"] > 0
            else None for m in MASKS}


def peak_memory_metrics(peak: int, device) -> Dict[str, Any]:
    r"""``peak_mem_bytes`` (max), ``peak_mem_bytes_mean`` and
    ``peak_mem_per_rank`` from every rank's :obj:`peak` (one all-gather)."""
    return _over_ranks("peak_mem", peak, device)


def epoch_row(epoch: int, sums: Dict[str, float], maxes: Dict[str, float], peak: int,
              device, world: int, live_peak: Optional[int] = None) -> Dict[str, Any]:
    r"""An epoch's metrics row from its reduced counters; with this rank's
    :obj:`live_peak` (its peak :func:`live_memory_bytes`), also
    ``live_mem_bytes``, ``live_mem_bytes_mean`` and ``live_mem_per_rank``
    (absolute, as ``peak_mem_*``: minus ``baseline_live_mem_*`` it is what
    training adds)."""
    row: Dict[str, Any] = {"epoch": epoch, "loss": sums["loss"], **accuracies(sums)}
    row.update(time=maxes["time"], time_comm=maxes["time_comm"],
               time_reduce=maxes["time_reduce"], time_sample=maxes["time_sample"],
               time_compute=(maxes["time"] - maxes["time_comm"] - maxes["time_reduce"]
                             - maxes["time_sample"]),
               bytes_sent=int(sums["bytes_sent"]), bytes_recv=int(sums["bytes_recv"]),
               halo_rows=int(sums["halo_rows"]), halo_rows_total=int(sums["halo_rows_total"]),
               **peak_memory_metrics(peak, device),
               cache_hit_rate=(sums["cache_hits"] / sums["cache_lookups"]
                               if sums["cache_lookups"] > 0 else None),
               bytes_saved=int(sums["bytes_saved"]), world_size=world)
    row.update(_over_ranks("live_mem", live_peak, device))
    return row


def summarize(history: List[Dict[str, Any]], config: Dict[str, Any], world: int,
              extra_keys: Sequence[str] = ()) -> Dict[str, Any]:
    r"""Final accuracies and the mean epoch time over epochs after the first
    (which pays one-off costs such as building caches); :obj:`extra_keys`:
    more row fields to average (a loader's)."""
    timed = history[1:] or history
    mean = lambda k: sum(r[k] for r in timed) / len(timed)  # noqa: E731
    last = history[-1]
    evaluated = [r for r in history if r["val_acc"] is not None]
    best = max(evaluated, key=lambda r: r["val_acc"]) if evaluated else last
    summary = {
        "world_size": world, "epochs": len(history), "config": config,
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
        "baseline_mem_bytes": last.get("baseline_mem_bytes"),
        "baseline_mem_bytes_mean": last.get("baseline_mem_bytes_mean"),
    }
    if all("live_mem_bytes" in r for r in history):
        summary.update(live_mem_bytes=max(r["live_mem_bytes"] for r in history),
                       live_mem_bytes_mean=max(r["live_mem_bytes_mean"] for r in history),
                       baseline_live_mem_bytes=last.get("baseline_live_mem_bytes"),
                       baseline_live_mem_bytes_mean=last.get("baseline_live_mem_bytes_mean"))
    summary.update({k: mean(k) for k in extra_keys})
    return summary


def _mean_of_known(values: List[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


class MetricsWriter:
    r"""Writes ``metrics.jsonl``, ``summary.json``, ``model.pt`` and
    ``model.json`` (how to rebuild the model, and the size and checksum of
    ``model.pt``) into an output directory."""

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
               in_channels: int, out_channels: int) -> None:
        self.file.close()
        with open(osp.join(self.out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        # model.json last: it describes model.pt, which load_model verifies
        described = save_checked(model.state_dict(), osp.join(self.out_dir, "model.pt"))
        save_json({"config": summary["config"], "in_channels": in_channels,
                   "out_channels": out_channels, "files": {"model.pt": described}},
                  osp.join(self.out_dir, "model.json"))
