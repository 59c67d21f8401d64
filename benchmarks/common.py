r"""What every benchmark shares: the partitions of the default graph, one
``pyg-dist train`` run on a (possibly emulated) network, the summary of its
per-epoch rows, time to a target accuracy, and the results file with the
machine it ran on."""
import datetime
import json
import os
import os.path as osp
import platform
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch_geometric

import pyg_dist

MiB = 2**20
RESULTS_DIR = osp.join(osp.dirname(osp.abspath(__file__)), "results")
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def machine() -> Dict[str, Any]:
    r"""Where and with what a benchmark ran."""
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "cpus": os.cpu_count(), "memory_gib": round(pages * page_size / 2**30, 1),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
            "pyg_dist": pyg_dist.__version__}


def save(args, results: List[Dict[str, Any]], started: float,
         target_lines: Sequence[str], **extra: Any) -> None:
    r"""Writes :obj:`results` to ``args.out`` with the machine, the
    arguments, the minutes since :obj:`started`, the target checks and
    :obj:`extra` keys (called after every run, so a late failure loses
    nothing)."""
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(portable({"date": datetime.datetime.now().isoformat(timespec="seconds"),
                            "machine": machine(), "args": vars(args),
                            "minutes": (time.time() - started) / 60,
                            "targets": list(target_lines), "results": results, **extra}),
                  f, indent=1)


def portable(value: Any) -> Any:
    r""":obj:`value` with the repository's absolute path cut from every string
    (paths relative to it), so that a results file names no folder of the
    machine that wrote it."""
    if isinstance(value, str):
        return value.replace(REPO + os.sep, "").replace(REPO, ".")
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    return value


def apply_preset(args, quick: Dict[str, Any], full: Dict[str, Any], name: str) -> None:
    r"""Fills the arguments left unset from the ``--quick`` or the full
    preset, and defaults ``--workdir`` to ``runs/bench_{name}[_quick]`` and
    ``--out`` to ``results/{name}[_quick].json``."""
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    name = name + "_quick" if args.quick else name
    args.workdir = args.workdir or osp.join("runs", "bench_" + name)
    args.out = args.out or osp.join(RESULTS_DIR, name + ".json")


def partitions(workdir: str, num_parts: int, num_nodes: Optional[int]) -> str:
    r"""METIS partitions of the default graph in ``workdir/parts{K}``,
    written once and reused."""
    root = osp.join(workdir, f"parts{num_parts}")
    if not osp.exists(osp.join(root, "meta.json")):
        pyg_dist.partition_graph(load_default_graph(workdir, num_nodes), num_parts, root=root)
    return root


def load_default_graph(workdir: str, num_nodes: Optional[int]):
    from pyg_dist.datasets import load_default
    return load_default(osp.join(workdir, "data"),
                        **({"num_nodes": num_nodes} if num_nodes else {}))


def run(net, root: str, out: str, flags: List[str], args,
        wire: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    r"""``pyg-dist train`` on partitions :obj:`root`, one process per rank
    of :obj:`net` (``--epochs``, ``--hidden`` and ``--timeout`` from
    :obj:`args`; evaluation in the last epoch unless :obj:`flags` say
    otherwise); returns the rows of its ``metrics.jsonl``.

    A :obj:`wire` dict gets what the ranks' links carried over the whole
    run (:attr:`netem.LaunchResult.wire_bytes`): ``sent`` and ``received``
    (bytes, all ranks) and ``per_rank``, all :obj:`None` on loopback. That is
    everything: start-up and rendezvous, every epoch (the first included),
    evaluation, gradient all-reduce, metric reductions and the TCP/IP/Ethernet
    headers, so more than the rows' ``bytes_sent`` (halo payload only)."""
    cmd = [sys.executable, "-m", "pyg_dist.cli", "train", "--root", root, "--out", out,
           "--epochs", str(args.epochs), "--eval-every", str(args.epochs),
           "--hidden", str(args.hidden), "--no-progress", "--no-plots",
           "--overwrite", *flags]  # benchmark folders are scratch: reruns replace them
    env = {"PYTHONWARNINGS": "ignore"}
    if getattr(args, "pin_malloc", False):  # large tensors mmapped and returned: RSS = live
        env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    result = net.launch(cmd, env=env, timeout=args.timeout).check()
    if wire is not None:
        wire.update(sent=result.sent, received=result.received, per_rank=result.wire_bytes)
    with open(osp.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def summarize(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    r"""One run's summary: means over the epochs after the first (which
    pays one-off costs; times are the max over ranks), the per-epoch peak
    memory (median over epochs; per rank: max over epochs), the final test
    accuracy and the ``(seconds, val_acc, test_acc)`` curve."""
    timed = rows[1:] or rows
    mean = lambda k: statistics.fmean(r.get(k) or 0 for r in timed)  # noqa: E731
    median = lambda k: statistics.median(r[k] for r in timed)  # noqa: E731
    per_rank = [r["peak_mem_per_rank"] for r in rows if r.get("peak_mem_per_rank")]
    hits = [r["cache_hit_rate"] for r in timed if r.get("cache_hit_rate") is not None]
    return {
        "epoch_time": mean("time"), "epochs_per_s": 1 / mean("time"),
        "time_compute": mean("time_compute"), "time_comm": mean("time_comm"),
        "time_reduce": mean("time_reduce"), "time_sample": mean("time_sample"),
        "sample_overhead": mean("time_sample") / mean("time"),
        "bytes_sent": mean("bytes_sent"), "bytes_saved": mean("bytes_saved"),
        "cache_hit_rate": statistics.fmean(hits) if hits else None,
        "halo_rows": mean("halo_rows"), "halo_rows_total": rows[-1].get("halo_rows_total", 0),
        "peak_mem_max": median("peak_mem_bytes"), "peak_mem_mean": median("peak_mem_bytes_mean"),
        "peak_mem_per_rank": [max(col) for col in zip(*per_rank)] if per_rank else None,
        "test_acc": rows[-1]["test_acc"], "epoch_times": [r["time"] for r in rows],
        "curve": [(r["time"], r.get("val_acc"), r.get("test_acc")) for r in rows],
    }


def time_to_target(curve: Sequence[Sequence[Optional[float]]],
                   target: float) -> Tuple[Optional[int], Optional[float]]:
    r"""(epochs, training seconds) until the validation accuracy of a
    ``(seconds, val_acc, test_acc)`` curve first reaches :obj:`target`;
    ``(None, None)`` if it never does."""
    elapsed = 0.0
    for epoch, (seconds, val, _) in enumerate(curve, 1):
        elapsed += seconds
        if val is not None and val >= target:
            return epoch, elapsed
    return None, None


def add_targets(results: List[Dict[str, Any]], fraction: float, base: str = "exact") -> None:
    r"""Per run of every result: the epochs and seconds until the validation
    accuracy reaches :obj:`fraction` × the final one of method :obj:`base`
    (mean over its seeds, on the first network it ran on)."""
    reference = next((r for r in results if r["method"] == base), None)
    if reference is None:
        return
    target = fraction * statistics.fmean(one["curve"][-1][1] for one in reference["runs"])
    for result in results:
        for one in result["runs"]:
            one["target_val_acc"] = target
            one["epochs_to_target"], one["seconds_to_target"] = time_to_target(
                one["curve"], target)


def typical(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    r"""The run whose epoch time is the median over seeds (robust to a seed
    that shared the machine with something else)."""
    return sorted(runs, key=lambda run: run["epoch_time"])[(len(runs) - 1) // 2]


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
