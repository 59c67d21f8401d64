r"""Halo caches side by side: what stale and cached halo rows save on the
wire and in waiting, and what they cost in accuracy.

On the embedded default graph, METIS-partitioned once (``--parts``), on
loopback and on emulated cluster links (``--link``, see :mod:`netem`), this
trains the same 3-layer GraphSAGE (hidden 64) through ``pyg-dist train``
(one process per rank) with every method of ``METHODS``:

* exact (Step 1), and exact with bf16 / int8 halo exchange;
* PipeGCN (``--cache pipeline --staleness 1``) and its smoothed variants
  -F (features), -G (gradients), -GF (both), decay 0.95;
* PSC-GCN: the variance-reduction sampler at rate 0.1 with a τ = 1, 2
  pipeline, with and without the inclusion-aware feature cache (25% of the
  halo rows);
* SANCUS (``--cache historical``) with each bound: fixed:2, age:2 (what
  ``adaptive:2`` meant before it followed the paper's Algorithm 5; the
  recorded results were run under that name), gap:0.05;
* BNS p = 0.1 with the PipeGCN pipeline.

Reported per method (means over the epochs after the first; times are the
max over ranks): epochs/s, the time an epoch waits on the halo exchange
(``time_comm``: the whole exchange on the exact path, only the waiting
left over by the overlap on the pipelined one), MB sent per epoch (all
ranks), bytes saved by the caches, the feature-cache hit rate, the test
accuracy after ``--epochs`` epochs (mean ± std over ``--seeds`` seeds, run on
the first link; accuracy does not depend on the link), and the epochs and
seconds until the validation accuracy first reaches ``--target`` times the
exact method's final one. Times are those of the seed with the median
epoch time. The targets are checked at the end.
Results go to ``benchmarks/results/staleness.json`` (``--out``), saved after
every run.

Usage::

    python benchmarks/staleness.py                      # the full run
    python benchmarks/staleness.py --link loopback --seeds 1 --methods \
        "psc t=2 +fc" "psc t=2 +fc degree" "psc t=2 +fc random" \
        --out benchmarks/results/staleness_feature_cache.json
    python benchmarks/staleness.py --link loopback --seeds 1 --epochs 5 \
        --methods exact pipegcn --out runs/staleness.json
"""
import argparse
import json
import os.path as osp
import statistics
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from common import (RESULTS_DIR, add_targets, partitions, run, save,  # noqa: E402
                    summarize, typical)
from netem import network_for, parse_link  # noqa: E402

RESULTS = osp.join(RESULTS_DIR, "staleness.json")
PIPE = ["--cache", "pipeline", "--staleness", "1"]
PSC = ["--sampler", "vr", "--rate", "0.1"]
FC = ["--feature-cache", "inclusion", "--feature-cache-capacity", "25%"]
METHODS = {  # label -> pyg-dist train flags
    "exact": [],
    "exact bf16": ["--exchange-dtype", "bf16"],
    "exact int8": ["--exchange-dtype", "int8"],
    "pipegcn": PIPE,
    "pipegcn-F": PIPE + ["--smooth-features", "0.95"],
    "pipegcn-G": PIPE + ["--smooth-grads", "0.95"],
    "pipegcn-GF": PIPE + ["--smooth-features", "0.95", "--smooth-grads", "0.95"],
    "psc t=1": PSC + ["--staleness", "1"],
    "psc t=2": PSC + ["--staleness", "2"],
    "psc t=1 +fc": PSC + ["--staleness", "1"] + FC,
    "psc t=2 +fc": PSC + ["--staleness", "2"] + FC,
    # the feature cache's baselines (PaGraph's degree, random), same capacity
    "psc t=2 +fc degree": PSC + ["--staleness", "2"] + FC[:1] + ["degree"] + FC[2:],
    "psc t=2 +fc random": PSC + ["--staleness", "2"] + FC[:1] + ["random"] + FC[2:],
    "sancus fixed:2": ["--bound", "fixed:2"],
    "sancus age:2": ["--bound", "age:2"],
    "sancus gap:0.05": ["--bound", "gap:0.05"],
    "bns 0.1 +pipe": ["--sampler", "bns", "--p", "0.1"] + PIPE,
}


# The full run; the feature-cache baselines run apart (loopback is enough).
DEFAULT_METHODS = [m for m in METHODS if not m.startswith("psc t=2 +fc ")]


def table(results: List[Dict[str, Any]], link: str) -> str:
    rows = [r for r in results if r["link"] == link]
    base = next((r for r in results if r["method"] == "exact" and r["link"] == link), None)
    head = (f"{'method':<19}{'ep/s':>6}{'wait s':>8}{'wait/x':>7}{'MB/ep':>8}"
            f"{'saved MB':>9}{'hit%':>6}{'to tgt':>7}{'s to tgt':>9}  test acc")
    lines = [f"link {link}", head, "-" * len(head)]
    for r in rows:
        s = typical(r["runs"])
        wait = s["time_comm"] / typical(base["runs"])["time_comm"] if base else float("nan")
        acc = [x["test_acc"] for x in r["runs"]]
        sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
        hit = "-" if s["cache_hit_rate"] is None else f"{100 * s['cache_hit_rate']:.0f}"
        ep = s.get("epochs_to_target")
        lines.append(
            f"{r['method']:<19}{s['epochs_per_s']:>6.2f}{s['time_comm']:>8.3f}{wait:>7.2f}"
            f"{s['bytes_sent'] / 1e6:>8.2f}{s['bytes_saved'] / 1e6:>9.2f}{hit:>6}"
            f"{'-' if ep is None else ep:>7}"
            f"{'-' if ep is None else format(s['seconds_to_target'], '.1f'):>9}"
            f"  {100 * statistics.fmean(acc):.2f} ± {100 * sd:.2f} (n={len(acc)})")
    return "\n".join(lines)


def targets(results: List[Dict[str, Any]]) -> List[str]:
    r"""The targets: the pipeline's wait against the exact exchange
    time per link, and its accuracy against exact."""
    out = []
    mean_acc = lambda r: statistics.fmean(x["test_acc"] for x in r["runs"])  # noqa: E731
    for link in dict.fromkeys(r["link"] for r in results):
        by = {r["method"]: r for r in results if r["link"] == link}
        if "exact" not in by:
            continue
        exact = by["exact"]
        for method in ("pipegcn", "pipegcn-GF"):
            if method not in by:
                continue
            wait = typical(by[method]["runs"])["time_comm"] / typical(exact["runs"])["time_comm"]
            line = (f"{link}: {method} wait / exact exchange time = {wait:.3f} "
                    f"[{'ok' if wait <= 0.2 else 'MISS'} <= 0.2]")
            if len(by[method]["runs"]) > 1:
                gap = 100 * (mean_acc(by[method]) - mean_acc(exact))
                line += (f"; acc - exact = {gap:+.2f} pp "
                         f"[{'ok' if abs(gap) <= 0.5 else 'MISS'} within 0.5]")
            out.append(line)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--link", "--links", dest="links", nargs="+",
                        default=["loopback", "1gbit,0.1ms", "10gbit,0.1ms"])
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS,
                        choices=list(METHODS))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--target", type=float, default=0.98,
                        help="time to this fraction of exact's final val accuracy")
    parser.add_argument("--num-nodes", type=int, default=None)
    parser.add_argument("--workdir", default="runs/bench_sampling")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--extra-flags", default="",
                        help="appended to every method's flags, e.g. '--refresh 10'")
    parser.add_argument("--report", metavar="JSON", default=None,
                        help="print the tables of a saved run and exit")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            results = json.load(f)["results"]
        for link in dict.fromkeys(r["link"] for r in results):
            print(table(results, link) + "\n")
        print("\n".join(targets(results)))
        return

    root = partitions(args.workdir, args.parts, args.num_nodes)
    results: List[Dict[str, Any]] = []
    started = time.time()
    for i, spec in enumerate(args.links):
        seeds = range(args.seeds) if i == 0 else range(1)
        with network_for(args.parts, parse_link(spec)) as net:
            for method in args.methods:
                runs = []
                for seed in seeds:
                    out = osp.join(args.workdir, "runs", f"stale-{i}-{method}-{seed}"
                                   .replace(" ", "_"))
                    rows = run(net, root, out, METHODS[method] + args.extra_flags.split()
                               + ["--seed", str(seed), "--eval-every", "1"], args)
                    runs.append({"seed": seed, **summarize(rows)})
                    print(f"  {net.label} {method} seed {seed}: "
                          f"{runs[-1]['epoch_time']:.3f} s/epoch, wait "
                          f"{runs[-1]['time_comm']:.3f} s, acc {runs[-1]['test_acc']:.4f}",
                          flush=True)
                results.append({"link": net.label, "method": method,
                                "flags": METHODS[method], "runs": runs})
                add_targets(results, args.target)
                save(args, results, started, targets(results))  # a late failure loses nothing
        print("\n" + table(results, net.label) + "\n", flush=True)
    print("\n".join(targets(results)))
    save(args, results, started, targets(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
