r"""Tables and figures of the benchmark suite (:mod:`run_all`) from its JSON.

Figures (``FIGURES``, PNG next to the JSON), after the papers':

* ``breakdown``: per-epoch time split into compute, halo wait, gradient
  all-reduce and sampling, per method and link (BNS-GCN Fig. 5, PipeGCN
  Fig. 8);
* ``convergence``: test accuracy per epoch, mean over seeds (BNS-GCN
  Fig. 7);
* ``memory``: peak memory of every rank per method (BNS-GCN Fig. 8);
* ``staleness``: test accuracy of the stale and sampled methods against
  exact, per epoch and per second of training (PipeGCN Fig. 4);
* ``cohesive_cost``: CM-GCN's cost :math:`J(P)` of cohesive against random
  mini-batches for each M (CM-GCN Fig. 6).
"""
import json
import os.path as osp
import statistics
from typing import Any, Callable, Dict, List, Optional

from common import MiB, mean_std, typical

STALENESS_METHODS = ("exact", "PipeGCN-GF", "PSC", "SANCUS", "BNS p=0.1")


def _ran(results: List[Dict[str, Any]], link: Optional[str] = None) -> List[Dict[str, Any]]:
    return [r for r in results if r["runs"] and (link is None or r["link"] == link)]


def _first_link(data: Dict[str, Any]) -> Optional[str]:
    r"""The link the seeds ran on (the figures of one link show it)."""
    return data["results"][0]["link"] if data["results"] else None


def table(results: List[Dict[str, Any]], link: str) -> str:
    r"""The markdown table of one link: per method, epochs/s and its ratio
    to exact, halo wait and bytes sent per epoch (``MB/epoch``: the halo
    payload of a training epoch; ``wire MB/epoch``: everything the ranks
    sent on their emulated links over the run, start-up, evaluation,
    all-reduce and headers included, divided by the epochs; "-" where not
    measured, such as on loopback), peak memory (max and mean over ranks),
    test accuracy (mean ± std over seeds) and the epochs and seconds to the
    target validation accuracy. Times are of the seed with the median epoch
    time."""
    rows = [r for r in results if r["link"] == link]
    exact = next((r for r in _ran(rows) if r["method"] == "exact"), None)
    base = typical(exact["runs"])["epochs_per_s"] if exact else None
    lines = [f"link: {link}", "",
             "| method | epochs/s | x exact | halo wait s | MB/epoch | wire MB/epoch "
             "| peak MiB max | peak MiB mean | test acc % | epochs to target | s to target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["runs"]:
            lines.append(f"| {r['method']} | not run: {r.get('error', '?')} "
                         "| | | | | | | | | |")
            continue
        s = typical(r["runs"])
        acc, sd = mean_std([one["test_acc"] for one in r["runs"]])
        ratio = f"{s['epochs_per_s'] / base:.2f}" if base else "-"
        epochs = s.get("epochs_to_target")
        wire = s.get("wire_bytes_per_epoch")  # missing in older results
        wire = "-" if wire is None else f"{wire / 1e6:.2f}"
        lines.append(
            f"| {r['method']} | {s['epochs_per_s']:.2f} | {ratio} | {s['time_comm']:.3f} "
            f"| {s['bytes_sent'] / 1e6:.2f} | {wire} | {s['peak_mem_max'] / MiB:.0f} "
            f"| {s['peak_mem_mean'] / MiB:.0f} | {100 * acc:.2f} ± {100 * sd:.2f} "
            f"(n={len(r['runs'])}) | {'-' if epochs is None else epochs} "
            f"| {'-' if epochs is None else format(s['seconds_to_target'], '.1f')} |")
    return "\n".join(lines)


def cost_table(costs: List[Dict[str, Any]]) -> str:
    lines = ["| M | J(P) cohesive | J(P) random | reduction | batching s |",
             "|---|---|---|---|---|"]
    lines += [f"| {c['M']} | {c['J_cohesive']:.4g} | {c['J_random']:.4g} "
              f"| {100 * c['reduction']:.1f}% | {c['seconds']:.1f} |" for c in costs]
    return "\n".join(lines)


def summary_lines(results: List[Dict[str, Any]], extra: Dict[str, Any]) -> List[str]:
    r"""The headline comparisons per link: bytes and speed of each method
    against exact, its accuracy gap, and the cost reduction of cohesive
    batches."""
    out = []
    for link in dict.fromkeys(r["link"] for r in _ran(results)):
        by = {r["method"]: r for r in _ran(results, link)}
        if "exact" not in by:
            continue
        exact = typical(by["exact"]["runs"])
        exact_acc = statistics.fmean(one["test_acc"] for one in by["exact"]["runs"])
        for name, r in by.items():
            if name == "exact" or r["kind"] == "pyg":
                continue
            s = typical(r["runs"])
            acc = statistics.fmean(one["test_acc"] for one in r["runs"])
            sent = (f"{s['bytes_sent'] / exact['bytes_sent']:.3f}x the bytes"
                    if exact["bytes_sent"] else "")
            out.append(f"{link}: {name}: {s['epochs_per_s'] / exact['epochs_per_s']:.2f}x "
                       f"exact's epochs/s, {sent}, accuracy {100 * (acc - exact_acc):+.2f} pp")
    for c in extra.get("costs", []):
        out.append(f"CM-GCN M={c['M']}: J(P) of cohesive batches "
                   f"{100 * c['reduction']:.1f}% below random")
    return out


def _figure(path: str, draw: Callable[[Any], None], width: float = 7.0,
            height: float = 4.0, ncols: int = 1) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    draw(axes[0] if ncols > 1 else axes[0][0])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def breakdown(data: Dict[str, Any], path: str) -> None:
    links = list(dict.fromkeys(r["link"] for r in _ran(data["results"])))
    parts = (("time_compute", "compute"), ("time_comm", "halo wait"),
             ("time_reduce", "all-reduce"), ("time_sample", "sampling"))

    def draw(axes):
        for ax, link in zip(axes if len(links) > 1 else [axes], links):
            rows = _ran(data["results"], link)
            left = [0.0] * len(rows)
            for key, label in parts:
                width = [max(typical(r["runs"])[key], 0.0) for r in rows]
                ax.barh([r["method"] for r in rows], width, left=left, label=label)
                left = [a + b for a, b in zip(left, width)]
            ax.invert_yaxis()
            ax.set_title(f"epoch time, {link}")
            ax.set_xlabel("seconds per epoch (max over ranks)")
        (axes[0] if len(links) > 1 else axes).legend(fontsize=7)
    _figure(path, draw, 4.5 * max(len(links), 1) + 2, 4.5, max(len(links), 1))


def convergence(data: Dict[str, Any], path: str) -> None:
    first = _first_link(data)

    def draw(ax):
        for r in _ran(data["results"], first):
            curves = [[c[2] for c in one["curve"]] for one in r["runs"]]
            mean = [statistics.fmean(v for v in epoch if v is not None) for epoch in
                    zip(*curves)]
            ax.plot(range(1, len(mean) + 1), [100 * v for v in mean], label=r["method"],
                    linestyle="--" if r["kind"] == "pyg" else "-")
        ax.set_xlabel("epoch")
        ax.set_ylabel("test accuracy % (mean over seeds)")
        ax.set_title("convergence")
        ax.legend(fontsize=7, ncol=2)
    _figure(path, draw)


def memory(data: Dict[str, Any], path: str) -> None:
    first = _first_link(data)

    def draw(ax):
        rows = [r for r in _ran(data["results"], first)
                if typical(r["runs"]).get("peak_mem_per_rank")]
        for i, r in enumerate(rows):
            per_rank = typical(r["runs"])["peak_mem_per_rank"]
            ax.scatter([i] * len(per_rank), [v / MiB for v in per_rank], s=25)
            ax.hlines(max(per_rank) / MiB, i - 0.3, i + 0.3, color="gray")
        ax.set_xticks(range(len(rows)), [r["method"] for r in rows], rotation=40,
                      ha="right", fontsize=7)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("peak memory per rank, MiB")
        ax.set_title("per-rank peak memory (line: the busiest rank)")
    _figure(path, draw)


def staleness(data: Dict[str, Any], path: str) -> None:
    first = _first_link(data)
    rows = [r for r in _ran(data["results"], first) if r["method"] in STALENESS_METHODS]

    def draw(axes):
        for r in rows:
            one = r["runs"][0]
            acc = [100 * (c[2] or 0) for c in one["curve"]]
            seconds, elapsed = [], 0.0
            for c in one["curve"]:
                elapsed += c[0]
                seconds.append(elapsed)
            axes[0].plot(range(1, len(acc) + 1), acc, label=r["method"])
            axes[1].plot(seconds, acc, label=r["method"])
        axes[0].set_xlabel("epoch")
        axes[1].set_xlabel("training seconds")
        axes[0].set_ylabel("test accuracy % (seed 0)")
        axes[0].legend(fontsize=7)
        axes[0].set_title("stale and sampled halos vs exact")
    _figure(path, draw, 10, 4, 2)


def cohesive_cost(data: Dict[str, Any], path: str) -> None:
    costs = data.get("costs") or []

    def draw(ax):
        x = range(len(costs))
        ax.bar([i - 0.2 for i in x], [c["J_random"] for c in costs], 0.4, label="random")
        ax.bar([i + 0.2 for i in x], [c["J_cohesive"] for c in costs], 0.4, label="cohesive")
        ax.set_xticks(list(x), [str(c["M"]) for c in costs])
        ax.set_xlabel("mini-batches M")
        ax.set_ylabel("computation cost J(P)")
        ax.set_title("CM-GCN: cost of random vs cohesive mini-batches")
        ax.legend()
    if costs:
        _figure(path, draw, 6, 4)


FIGURES: Dict[str, Callable[[Dict[str, Any], str], None]] = {
    "breakdown": breakdown, "convergence": convergence, "memory": memory,
    "staleness": staleness, "cohesive_cost": cohesive_cost}


def show(json_path: str) -> List[str]:
    r"""Prints the tables and summary of a saved run, writes them as
    markdown next to it and draws :data:`FIGURES`; returns the paths."""
    with open(json_path) as f:
        data = json.load(f)
    stem = osp.splitext(json_path)[0]
    text = [f"{data['date']}; {data['machine']['cpus']} CPUs, "
            f"{data['machine']['memory_gib']} GiB, GPU: {data['machine']['gpu']}; torch "
            f"{data['machine']['torch']}, PyG {data['machine']['torch_geometric']}"]
    for link in dict.fromkeys(r["link"] for r in data["results"]):
        text += ["", table(data["results"], link)]
    if data.get("costs"):
        text += ["", "CM-GCN cost of the batches (Fig. 6):", "", cost_table(data["costs"])]
    text += ["", *data["targets"]]
    print("\n".join(text))
    with open(stem + ".md", "w") as f:
        f.write("\n".join(text) + "\n")
    paths = []
    for name, draw in FIGURES.items():
        draw(data, f"{stem}_{name}.png")
        if osp.exists(f"{stem}_{name}.png"):
            paths.append(f"{stem}_{name}.png")
    print(f"wrote {json_path}, {stem}.md and {stem}_{{{','.join(FIGURES)}}}.png")
    return paths
