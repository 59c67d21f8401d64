"""PNG plots of a training run's results folder (``metrics.jsonl``):
convergence, the per-epoch time breakdown and per-rank peak memory."""
import json
import os.path as osp
from typing import Any, Dict, List

TIME_PARTS = (("time_compute", "compute"), ("time_comm", "halo exchange"),
              ("time_reduce", "gradient all-reduce"), ("time_sample", "sampling"))


def read_metrics(out_dir: str) -> List[Dict[str, Any]]:
    with open(osp.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_run(out_dir: str) -> List[str]:
    r"""Writes ``curves.png`` (loss and accuracies per epoch),
    ``time_breakdown.png`` (stacked per-epoch time: compute, halo exchange,
    all-reduce, sampling; the slowest rank's) and ``memory.png`` (each
    rank's peak memory) into :obj:`out_dir`; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    rows = read_metrics(out_dir)
    epochs = [r["epoch"] for r in rows]
    paths = []

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    loss_ax.plot(epochs, [r["loss"] for r in rows])
    loss_ax.set(xlabel="epoch", ylabel="training loss", title="Loss")
    for mask in ("train", "val", "test"):
        points = [(r["epoch"], r[f"{mask}_acc"]) for r in rows
                  if r.get(f"{mask}_acc") is not None]
        if points:
            acc_ax.plot(*zip(*points), label=mask)
    acc_ax.set(xlabel="epoch", ylabel="accuracy (micro-F1 if multi-label)",
               title="Accuracy" if acc_ax.lines else "Accuracy (not evaluated)")
    if acc_ax.lines:  # a run with --eval-every 0 has none
        acc_ax.legend()
    paths.append(_save(fig, out_dir, "curves.png"))

    fig, ax = plt.subplots(figsize=(8, 3.6))
    bottom = [0.0] * len(rows)
    for key, label in TIME_PARTS:
        values = [max(r.get(key) or 0.0, 0.0) for r in rows]
        ax.bar(epochs, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(xlabel="epoch", ylabel="seconds", title="Time per epoch")
    ax.legend()
    paths.append(_save(fig, out_dir, "time_breakdown.png"))

    per_rank = [r["peak_mem_per_rank"] for r in rows if r.get("peak_mem_per_rank")]
    if per_rank:
        peaks = [max(epoch[i] for epoch in per_rank) / 2**20 for i in range(len(per_rank[0]))]
        fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(peaks) + 2), 3.6))
        ax.bar(range(len(peaks)), peaks)
        ax.set(xlabel="rank", ylabel="peak memory (MiB)", title="Peak memory per rank")
        paths.append(_save(fig, out_dir, "memory.png"))
    return paths


def _save(fig, out_dir: str, name: str) -> str:
    from matplotlib.ticker import MaxNLocator
    for ax in fig.axes:  # epochs and ranks are whole numbers
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    path = osp.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path
