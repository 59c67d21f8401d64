r"""CM-GCN's asynchronous computation (§III-C): how much halo wait each
schedule hides, forward and backward.

On the embedded default graph, METIS-partitioned once (``--parts``, default
4), on emulated cluster links (``--link``, default 1gbit and 250mbit; see
:mod:`netem`), this trains the same model (``--model``, ``--layers``,
``--hidden``) through ``pyg-dist train`` (one process per rank) with each
schedule of :data:`MODES`:

* ``no overlap``: every layer exchanges its halo rows, then aggregates
  (a barrier per layer, forward and backward);
* ``--overlap`` (``layers``): each layer aggregates its interior rows
  while its own halo rows travel; the backward exchange blocks;
* ``--overlap nodes``: every row of every layer as soon as its inputs
  arrived, across layers, and the backward likewise
  (:mod:`pyg_dist.nn.async_layers`).

First it prints what there is to hide: per layer, the share of each
rank's rows at each depth :math:`d` from the halo (the stages of
``--overlap nodes``). Then, per link, the schedules run in turn for each of
``--seeds`` seeds (same partitions; a seed sets the weights and dropout),
and per run the means over the epochs after the first (times: the slowest
rank's) are taken: the epoch time, the halo wait (``time_comm``) and its
share of the epoch, its backward part (``time_comm_backward``), and the
compute left (``time_compute``). Table: mean ± std over the seeds and the
wait against ``no overlap``'s on the same link.

Output: the table (printed) and the JSON (``--out``, default
``benchmarks/results/async_layers.json``, saved after every run).
``--quick`` is a CI-sized run (small graph, loopback, 2 epochs, one seed).

Usage::

    python benchmarks/async_layers.py                 # the full run (~12 min on 2 cores)
    python benchmarks/async_layers.py --quick
    python benchmarks/async_layers.py --report benchmarks/results/async_layers.json
"""
import argparse
import json
import os.path as osp
import statistics
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from common import apply_preset, mean_std, partitions, run, save  # noqa: E402
from netem import network_for, parse_link  # noqa: E402

import pyg_dist  # noqa: E402
from pyg_dist.comm import HaloPlan  # noqa: E402
from pyg_dist.nn.async_layers import Schedule  # noqa: E402

MODES: Dict[str, List[str]] = {
    "no overlap": [],
    "--overlap": ["--overlap"],
    "--overlap nodes": ["--overlap", "nodes"],
}
BASE = "no overlap"
QUICK = {"num_nodes": 2000, "epochs": 2, "seeds": 1, "links": ["loopback"]}
FULL = {"num_nodes": None, "epochs": 6, "seeds": 3, "links": ["1gbit", "250mbit"]}


def depths(root: str, num_parts: int, num_layers: int) -> Dict[str, Any]:
    r"""Per rank, the rows of each stage of each layer on the exact plan
    (``rows[l-1][s]``: stage ``s`` of layer ``l``, i.e. depth ``l - s + 1``,
    stage 0 deeper than ``l``) and the share of rows at each depth."""
    per_rank = []
    for rank in range(num_parts):
        part = pyg_dist.DistData.load(root, rank)
        plan = HaloPlan.full(part)
        rows = Schedule.build([plan] * num_layers, [part.adj_t] * num_layers,
                              ["x"] * num_layers).rows_per_stage()
        last = rows[-1]  # [d > K, d = K, ..., d = 1]
        share = {f"d={num_layers - s + 1}" if s else f"d>{num_layers}": c / part.num_inner
                 for s, c in enumerate(last)}
        per_rank.append({"rank": rank, "inner": part.num_inner, "halo": part.num_halo,
                         "rows_per_stage": rows, "depth_share": share})
    total = sum(r["inner"] for r in per_rank)
    keys = list(per_rank[0]["depth_share"])
    overall = {k: sum(r["depth_share"][k] * r["inner"] for r in per_rank) / total
               for k in keys}
    return {"per_rank": per_rank, "depth_share": overall}


def one_run(net, root: str, mode: str, seed: int, args) -> Dict[str, Any]:
    out = osp.join(args.workdir, "runs", f"{net.label}-{mode}-{seed}".replace(" ", "_"))
    rows = run(net, root, out, MODES[mode] + ["--model", args.model, "--layers",
                                              str(args.layers), "--seed", str(seed),
                                              "--dropout", str(args.dropout)], args)
    timed = rows[1:] or rows
    mean = lambda k: statistics.fmean(r.get(k) or 0.0 for r in timed)  # noqa: E731
    return {"seed": seed, "epoch_time": mean("time"), "time_comm": mean("time_comm"),
            "time_comm_backward": mean("time_comm_backward"),
            "time_comm_forward": mean("time_comm") - mean("time_comm_backward"),
            "comm_share": mean("time_comm") / mean("time"),
            "time_compute": mean("time_compute"), "time_reduce": mean("time_reduce"),
            "bytes_sent": mean("bytes_sent"), "test_acc": rows[-1].get("test_acc"),
            "epoch_times": [r["time"] for r in rows]}


KEYS = ("epoch_time", "time_comm", "comm_share", "time_comm_forward", "time_comm_backward",
        "time_compute")


def aggregate(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    return {k: mean_std([r[k] for r in runs]) for k in KEYS}


def table(results: List[Dict[str, Any]], depth: Dict[str, Any]) -> str:
    shares = ", ".join(f"{k}: {100 * v:.1f}%" for k, v in depth["depth_share"].items())
    head = ("| link | schedule | epoch s | halo wait s | wait share | forward wait s | "
            "backward wait s | compute s | wait / no overlap |")
    lines = [f"rows by depth from the halo (all ranks): {shares}", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    base = {r["link"]: r["summary"] for r in results if r["mode"] == BASE}
    for r in results:
        s = r["summary"]
        fmt = lambda k, p=3: f"{s[k][0]:.{p}f} ± {s[k][1]:.{p}f}"  # noqa: E731
        ratio = (s["time_comm"][0] / base[r["link"]]["time_comm"][0]
                 if r["link"] in base else float("nan"))
        lines.append(f"| {r['link']} | {r['mode']} | {fmt('epoch_time')} | {fmt('time_comm')} | "
                     f"{100 * s['comm_share'][0]:.1f}% | {fmt('time_comm_forward')} | "
                     f"{fmt('time_comm_backward')} | {fmt('time_compute')} | {ratio:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--link", "--links", dest="links", nargs="+", default=None)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--model", default="sage", choices=["sage", "gcn", "gin"])
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--num-nodes", type=int, default=None)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", default=None)
    parser.add_argument("--report", metavar="JSON", default=None,
                        help="print the table of a saved run and exit")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        print(table(saved["results"], saved["depth"]))
        return
    apply_preset(args, QUICK, FULL, "async_layers")
    started = time.time()
    root = partitions(args.workdir, args.parts, args.num_nodes)
    depth = depths(root, args.parts, args.layers)
    print("rows by depth from the halo: " + ", ".join(
        f"{k} {100 * v:.1f}%" for k, v in depth["depth_share"].items()), flush=True)
    results: List[Dict[str, Any]] = []
    for spec in args.links:
        with network_for(args.parts, parse_link(spec)) as net:
            by_mode: Dict[str, List[Dict[str, Any]]] = {m: [] for m in args.modes}
            for seed in range(args.seeds):  # modes in turn: drift spreads over all
                for mode in args.modes:
                    one = one_run(net, root, mode, seed, args)
                    by_mode[mode].append(one)
                    print(f"  {net.label} {mode} seed {seed}: {one['epoch_time']:.3f} s/epoch, "
                          f"halo wait {one['time_comm']:.3f} s "
                          f"({100 * one['comm_share']:.0f}%; backward "
                          f"{one['time_comm_backward']:.3f} s)", flush=True)
                    current = [r for r in results if r["link"] != net.label] + [
                        {"link": net.label, "mode": m, "runs": rs, "summary": aggregate(rs)}
                        for m, rs in by_mode.items() if rs]
                    save(args, current, started, [], depth=depth)
            results = [r for r in results if r["link"] != net.label] + [
                {"link": net.label, "mode": m, "runs": rs, "summary": aggregate(rs)}
                for m, rs in by_mode.items()]
    save(args, results, started, [], depth=depth)
    print("\n" + table(results, depth))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
