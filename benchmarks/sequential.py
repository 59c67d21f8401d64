r"""Memory per rank against the number of ranks: the materialising halo
exchange against the sequential one (SAR, ``--exchange sequential``).

For each graph of ``--graphs`` and each rank count of ``--ranks``, the
graph is partitioned (written once) and a 3-layer GraphSAGE (``--hidden``)
trains ``--epochs`` epochs with ``--exchange halo`` and ``--exchange
sequential`` (interleaved, on loopback, evaluation in the last epoch
only), with the allocator as users have it (``--pin-malloc``: glibc's mmap
threshold pinned, so that freed tensors leave the resident set, a labelled
extra). Per run: the
peak memory per rank above ``baseline_mem_bytes`` (interpreter, libraries,
partition and model), max over ranks and over the training epochs (the
last, evaluating one included), the same for live memory (glibc's bytes in
use above ``baseline_live_mem_bytes``), and the epoch time (mean over the epochs
after the first, slowest rank). One rank is the single-process reference
(no exchange: both modes are the same computation). With ``--repeats N``
each configuration runs N times (the exchanges alternated) and the run of
median peak memory is reported, with the median epoch time: where freed
buffers land in glibc's heap varies from run to run (the same training
measured 137-184 MiB on a rank of 2, live 97-101).

Graphs:

* ``communities``: the scaling benchmark's graph (communities of 500
  nodes, mean in-degree 20; ``--communities-nodes``), METIS: a well-cut
  graph, halo below the interior;
* ``reddit-shaped``: :func:`~pyg_dist.datasets.regime.reddit_shaped`
  (``--reddit-nodes``, mean degree 100, 602 features), METIS: every
  part's halo is about its interior at 2 parts and larger from 4 parts on
  (BNS-GCN's Reddit regime);
* ``reddit-shaped:random``: the same graph, parts drawn at random: the
  halo exceeds the interior at every part count;
* ``rmat``: an R-MAT power-law graph
  (:func:`~pyg_dist.datasets.regime.rmat`, Graph500's parameters,
  ``--rmat-scale``: :math:`2^{scale}` nodes, edge factor 16, 512
  features), METIS: hubs everywhere, so a large halo even when well cut;
* ``rmat:random``: the same graph, parts drawn at random (the user's
  regime of a user who splits a real power-law graph at random).

The targets, checked at every rank count run with both
exchanges: the sequential peak above baseline per rank at most 1.5 ×
(single-process peak above baseline) / ranks, and at 2 ranks never above
the materialising exchange's; at the largest rank count at most 0.6 × the
materialising exchange's; its epoch time at most 1.3 × the materialising
exchange's. The halo/inner ratio of the parts is reported beside them.

Output: a table (printed, and ``--out`` with ``.md``), the JSON
(``--out``) and the plot (``--out`` with ``.png``: memory per rank against
ranks, both exchanges, the linear ideal drawn in).

Usage::

    python benchmarks/sequential.py            # full: ~30 min on 2 cores
    python benchmarks/sequential.py --quick    # a small random-cut graph, 1 and 2 ranks
    python benchmarks/sequential.py --report benchmarks/results/sequential.json
"""
import argparse
import json
import os.path as osp
import statistics
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from common import MiB, apply_preset, run, save  # noqa: E402
from netem import network_for, parse_link  # noqa: E402

import pyg_dist  # noqa: E402
from pyg_dist.partition import PartitionBook  # noqa: E402

EXCHANGES = ("halo", "sequential")
LINEAR_SLACK, VS_MATERIALISING, TIME_SLACK = 1.5, 0.6, 1.3


def make_graph(name: str, args):
    name = name.split(":")[0]  # graph:method
    if name == "communities":
        from pyg_dist.datasets import synthetic_communities
        return synthetic_communities(num_nodes=args.communities_nodes, avg_degree=20,
                                     num_communities=max(args.communities_nodes // 500, 2))
    if name == "reddit-shaped":
        from pyg_dist.datasets.regime import reddit_shaped
        return reddit_shaped(num_nodes=args.reddit_nodes)
    if name == "rmat":
        from pyg_dist.datasets.regime import rmat
        return rmat(scale=args.rmat_scale, num_features=512)
    raise ValueError(f"unknown graph '{name}'")


def partition(data, name: str, ranks: int, args) -> Dict[str, Any]:
    graph, _, method = name.partition(":")
    root = osp.join(args.workdir, f"{graph}_{method or 'metis'}_parts{ranks}")
    if not osp.exists(osp.join(root, "meta.json")):
        pyg_dist.partition_graph(data, ranks, method=method or "metis", root=root)
    stats = PartitionBook.load(root).stats
    return {"root": root, "halo_ratio_min": min(s["halo_ratio"] for s in stats),
            "halo_ratio_max": max(s["halo_ratio"] for s in stats)}


def one_run(root: str, ranks: int, exchange: str, args) -> Dict[str, Any]:
    out = osp.join(args.workdir, "runs", f"{osp.basename(root)}-{exchange}")
    with network_for(ranks, parse_link("loopback")) as net:
        rows = run(net, root, out, ["--exchange", exchange], args)
    above = [max(r["peak_mem_per_rank"][i] for r in rows) - rows[-1]["baseline_mem_per_rank"][i]
             for i in range(ranks)]
    timed = rows[1:] or rows
    # live memory (glibc's bytes in use), where the C library reports it
    live = [max(r["live_mem_per_rank"][i] for r in rows)
            - rows[-1]["baseline_live_mem_per_rank"][i]
            for i in range(ranks)] if rows[-1].get("live_mem_per_rank") else None
    return {"live_above_baseline_max": max(live) if live else None,
            "live_above_baseline_per_rank": live,
"epoch_time": statistics.fmean(r["time"] for r in timed),
            "time_comm": statistics.fmean(r["time_comm"] for r in timed),
            "above_baseline_max": max(above), "above_baseline_per_rank": above,
            "baseline_mem_max": max(rows[-1]["baseline_mem_per_rank"]),
            "sent_mib_per_epoch": statistics.fmean(r["bytes_sent"] for r in timed) / MiB,
            "test_acc": rows[-1]["test_acc"]}


def median_run(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    r"""The run of median peak memory (the lower middle one of an even
    count), with the median epoch time and halo wait over all runs and
    every run's peak (``above_baseline_runs``)."""
    middle = sorted(runs, key=lambda r: r["above_baseline_max"])[(len(runs) - 1) // 2]
    return {**middle, "epoch_time": statistics.median(r["epoch_time"] for r in runs),
            "time_comm": statistics.median(r["time_comm"] for r in runs),
            "above_baseline_runs": [r["above_baseline_max"] for r in runs]}


def checks(results: List[Dict[str, Any]]) -> List[str]:
    r"""The targets, at every rank count run with both exchanges."""
    lines = []
    for graph in dict.fromkeys(r["graph"] for r in results):
        rows = [r for r in results if r["graph"] == graph]
        single = next((r for r in rows if r["ranks"] == 1), None)
        by = {(r["ranks"], r["exchange"]): r for r in rows}
        multi = sorted({r["ranks"] for r in rows if r["ranks"] > 1
                        and (r["ranks"], "sequential") in by and (r["ranks"], "halo") in by})
        if single is None or not multi:
            continue
        for ranks in multi:
            seq, mat = by[ranks, "sequential"], by[ranks, "halo"]
            bound = LINEAR_SLACK * single["above_baseline_max"] / ranks
            ratio = seq["epoch_time"] / mat["epoch_time"]
            lines.append(
                f"{graph} {ranks} ranks: sequential {seq['above_baseline_max'] / MiB:.0f} MiB "
                f"<= {bound / MiB:.0f} MiB ({LINEAR_SLACK} x single / ranks): "
                f"{'met' if seq['above_baseline_max'] <= bound else 'missed'}; epoch "
                f"{ratio:.2f}x materialising <= {TIME_SLACK}: "
                f"{'met' if ratio <= TIME_SLACK else 'missed'}")
            if ranks == 2:
                below = seq["above_baseline_max"] <= mat["above_baseline_max"]
                lines.append(f"{graph} 2 ranks: sequential {seq['above_baseline_max'] / MiB:.0f} "
                             f"MiB <= materialising {mat['above_baseline_max'] / MiB:.0f} MiB: "
                             f"{'met' if below else 'missed'}")
        last = multi[-1]
        seq, mat = by[last, "sequential"], by[last, "halo"]
        share = seq["above_baseline_max"] / mat["above_baseline_max"]
        lines.append(f"{graph} {last} ranks: sequential / materialising memory {share:.2f} "
                     f"<= {VS_MATERIALISING}: {'met' if share <= VS_MATERIALISING else 'missed'}")
    return lines


def table(results: List[Dict[str, Any]]) -> str:
    lines = ["| graph | ranks | halo/inner (min-max) | exchange | MiB/rank above baseline "
             "| live MiB/rank | linear ideal | s/epoch | halo wait s | MiB sent/epoch "
             "| test acc |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        single = next(s for s in results if s["graph"] == r["graph"] and s["ranks"] == 1)
        live = r.get("live_above_baseline_max")
        lines.append(
            f"| {r['graph']} | {r['ranks']} | {r['halo_ratio_min']:.2f}-{r['halo_ratio_max']:.2f} "
            f"| {r['exchange']} | {r['above_baseline_max'] / MiB:.0f} | "
            f"{'-' if live is None else f'{live / MiB:.0f}'} | "
            f"{single['above_baseline_max'] / MiB / r['ranks']:.0f} | {r['epoch_time']:.2f} | "
            f"{r['time_comm']:.2f} | {r['sent_mib_per_epoch']:.1f} | {r['test_acc']:.3f} |")
    return "\n".join(lines)


def plot(results: List[Dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    graphs = list(dict.fromkeys(r["graph"] for r in results))
    fig, axes = plt.subplots(1, len(graphs), figsize=(5.5 * len(graphs), 4), squeeze=False)
    for ax, graph in zip(axes[0], graphs):
        rows = [r for r in results if r["graph"] == graph]
        single = next(r for r in rows if r["ranks"] == 1)["above_baseline_max"] / MiB
        ranks = sorted({r["ranks"] for r in rows})
        for exchange, style in zip(EXCHANGES, ("o-", "s-")):
            points = [(r["ranks"], r["above_baseline_max"] / MiB) for r in rows
                      if r["exchange"] == exchange or r["ranks"] == 1]
            points = sorted(dict(points).items())
            label = "materialising (halo)" if exchange == "halo" else "sequential (SAR)"
            ax.plot(*zip(*points), style, label=label)
        ax.plot(ranks, [single / k for k in ranks], "k--", label="linear ideal (single / ranks)")
        ax.plot(ranks, [LINEAR_SLACK * single / k for k in ranks], "k:", lw=0.8,
                label=f"{LINEAR_SLACK} x linear")
        ax.set(xscale="log", yscale="log", xlabel="ranks",
               ylabel="peak memory per rank above baseline (MiB)", title=graph)
        ax.set_xticks(ranks, [str(k) for k in ranks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a small boundary-heavy graph, 1 and 2 ranks")
    parser.add_argument("--graphs", nargs="+", default=None)
    parser.add_argument("--ranks", type=int, nargs="+", default=None)
    parser.add_argument("--communities-nodes", type=int, default=None)
    parser.add_argument("--reddit-nodes", type=int, default=None)
    parser.add_argument("--rmat-scale", type=int, default=None,
                        help="the rmat graphs have 2**scale nodes")
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--pin-malloc", action="store_true",
                        help="pin glibc's mmap threshold in the ranks (RSS follows live "
                             "memory; not what users have: report it as such)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each configuration, the exchanges alternated; the "
                             "median run is reported (resident memory varies run to run)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--report", metavar="JSON", default=None,
                        help="redraw the table, targets and plot of a saved run")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            report(json.load(f)["results"], args.report)
        return
    apply_preset(args, dict(graphs=["reddit-shaped:random"], ranks=[1, 2],
                            communities_nodes=4000, reddit_nodes=2000, rmat_scale=11, hidden=16,
                            epochs=2),
                 dict(graphs=["communities", "reddit-shaped", "reddit-shaped:random", "rmat",
                              "rmat:random"],
                      ranks=[1, 2, 4, 8],
                      communities_nodes=200_000, reddit_nodes=40_000, rmat_scale=15,
                      hidden=64, epochs=4),
                 "sequential")
    started, results = time.time(), []
    for graph in args.graphs:
        data = make_graph(graph, args)
        for ranks in args.ranks:
            parts = partition(data, graph, ranks, args)
            exchanges = EXCHANGES[:1] if ranks == 1 else EXCHANGES
            runs: Dict[str, List[Dict[str, Any]]] = {exchange: [] for exchange in exchanges}
            for _ in range(args.repeats):
                for exchange in exchanges:
                    one = one_run(parts["root"], ranks, exchange, args)
                    runs[exchange].append(one)
                    print(f"  {graph} {ranks} ranks {exchange}: "
                          f"{one['above_baseline_max'] / MiB:.0f} MiB/rank above baseline "
                          f"(live {(one['live_above_baseline_max'] or 0) / MiB:.0f}), "
                          f"{one['epoch_time']:.2f} s/epoch", flush=True)
            for exchange in exchanges:
                results.append({"graph": graph, "ranks": ranks, "exchange": exchange,
                                **{k: v for k, v in parts.items() if k != "root"},
                                **median_run(runs[exchange])})
                save(args, results, started, checks(results))
        del data
    report(results, args.out)
    save(args, results, started, checks(results))
    print(f"wrote {args.out} (.md, .png)")


def report(results: List[Dict[str, Any]], out: str) -> None:
    r"""Prints the table and the targets, and writes them (``.md``) and the
    plot (``.png``) beside :obj:`out`."""
    text = table(results) + "\n\n" + "\n".join(checks(results))
    print(text)
    with open(osp.splitext(out)[0] + ".md", "w") as f:
        f.write(text + "\n")
    plot(results, osp.splitext(out)[0] + ".png")


if __name__ == "__main__":
    main()
