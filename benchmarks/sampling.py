r"""Boundary sampling side by side: what BNS-GCN, PSC-GCN's variance-reduction
sampler and the edge-sampling baselines save, and what they cost.

On the embedded default graph (:func:`pyg_dist.datasets.load_default`), for
2 and 4 METIS partitions (``--parts``), on loopback and on an emulated
cluster link (``--link RATE[,DELAY] ...``, see :mod:`netem`: one network namespace per rank,
veth pairs to a bridge, ``tc`` shaping), this trains the same 3-layer
GraphSAGE (hidden 64) with every method of ``METHODS``, on the same
partitions, through ``pyg-dist train`` (one process per rank, torchrun-style
environment):

* BNS-GCN at p = 1 (the exact plan), 0.1, 0.01 and 0 (isolated partitions),
* PSC-GCN's variance-reduction sampler at rate 0.1,
* DropEdge and boundary edge sampling (BES) dropping as many edges as BNS
  at p = 0.1 (BNS-GCN Table 9).

Reported per configuration (means over the epochs after the first, which
pays one-off costs; times are the max over ranks): epoch time split into
compute / halo exchange / gradient all-reduce / sampling, the bytes all ranks
send per epoch and their ratio to p = 1, halo rows fetched per epoch as a
share of all halo rows, the per-epoch peak memory of the busiest rank and the
mean over ranks, the sampling overhead as a share of the epoch, and the test
accuracy after ``--epochs`` epochs, mean ± std over ``--seeds`` seeds (seeds
run on the first link only; accuracy does not depend on the link). The
targets of the issue are checked at the end. Results go to
``benchmarks/results/sampling.json`` (``--out``), saved after every
configuration. Peak RSS on CPU also holds whatever glibc keeps cached;
``--pin-malloc`` fixes its mmap threshold so the per-epoch peak follows the
live tensors (use it for memory comparisons, not for timings).

Usage::

    python benchmarks/sampling.py                          # the full run
    python benchmarks/sampling.py --parts 2 --seeds 1 --epochs 5 --link loopback
    python benchmarks/sampling.py --link loopback --methods p=1 p=0.1 p=0.01 \
        --seeds 1 --epochs 5 --hidden 256 --pin-malloc --out results/sampling_memory.json
"""
import argparse
import os.path as osp
import statistics
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from common import MiB, RESULTS_DIR, partitions, run, save, summarize  # noqa: E402
from netem import network_for, parse_link  # noqa: E402

RESULTS = osp.join(RESULTS_DIR, "sampling.json")
METHODS = {  # label -> pyg-dist train flags
    "p=1": ["--sampler", "bns", "--p", "1"],
    "p=0.1": ["--sampler", "bns", "--p", "0.1"],
    "p=0.01": ["--sampler", "bns", "--p", "0.01"],
    "p=0": ["--sampler", "bns", "--p", "0"],
    "vr 0.1": ["--sampler", "vr", "--rate", "0.1"],
    "dropedge 0.1": ["--sampler", "dropedge", "--p", "0.1"],
    "bes 0.1": ["--sampler", "bes", "--p", "0.1"],
}


def table(results: List[Dict[str, Any]], parts: int, link: str) -> str:
    rows = [r for r in results if r["parts"] == parts and r["link"] == link]
    base = next((r for r in rows if r["method"] == "p=1"), None)
    head = (f"{'method':<13}{'epoch s':>8}{'compute':>8}{'comm':>7}{'reduce':>7}"
            f"{'sample%':>8}{'MB/ep':>8}{'bytes':>7}{'halo%':>7}{'mem max':>8}"
            f"{'mem avg':>8}  test acc")
    lines = [f"{parts} partitions, link {link}", head, "-" * len(head)]
    for r in rows:
        s = r["runs"][0]
        ratio = s["bytes_sent"] / base["runs"][0]["bytes_sent"] if base else float("nan")
        acc = [x["test_acc"] for x in r["runs"]]
        sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
        lines.append(
            f"{r['method']:<13}{s['epoch_time']:>8.3f}{s['time_compute']:>8.3f}"
            f"{s['time_comm']:>7.3f}{s['time_reduce']:>7.3f}"
            f"{100 * s['sample_overhead']:>7.1f}%{s['bytes_sent'] / 1e6:>8.2f}"
            f"{ratio:>7.3f}{100 * s['halo_rows'] / max(s['halo_rows_total'], 1):>6.1f}%"
            f"{s['peak_mem_max'] / MiB:>8.0f}{s['peak_mem_mean'] / MiB:>8.0f}"
            f"  {100 * statistics.fmean(acc):.2f} ± {100 * sd:.2f} (n={len(acc)})")
    return "\n".join(lines)


def targets(results: List[Dict[str, Any]]) -> List[str]:
    r"""The targets, per (parts, link)."""
    out = []
    for parts, link in sorted({(r["parts"], r["link"]) for r in results}):
        by = {r["method"]: r for r in results if r["parts"] == parts and r["link"] == link}
        if "p=1" not in by or "p=0.1" not in by:
            continue
        full, bns = by["p=1"]["runs"], by["p=0.1"]["runs"]
        ratio = bns[0]["bytes_sent"] / full[0]["bytes_sent"]
        acc_gap = 100 * (statistics.fmean(r["test_acc"] for r in bns)
                         - statistics.fmean(r["test_acc"] for r in full))
        overhead = max(s["sample_overhead"] for r in by.values() for s in r["runs"])
        mem = bns[0]["peak_mem_max"] / full[0]["peak_mem_max"]
        out.append(f"{parts} parts / {link}: bytes(p=0.1)/bytes(p=1) = {ratio:.3f} "
                   f"[{'ok' if ratio <= 0.12 else 'MISS'} <= 0.12]; acc(p=0.1) - acc(p=1) "
                   f"= {acc_gap:+.2f} pp [{'ok' if abs(acc_gap) <= 0.5 else 'MISS'} "
                   f"within 0.5]; max sampling overhead {100 * overhead:.1f}% "
                   f"[{'ok' if overhead <= 0.10 else 'MISS'} <= 10%]; peak mem "
                   f"p=0.1/p=1 = {mem:.3f} [{'ok' if mem < 1 else 'MISS'} < 1]")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--link", "--links", dest="links", nargs="+",
                        default=["loopback", "1gbit,0.1ms"],
                        help="RATE[,DELAY] per network to run on, e.g. 1gbit,0.1ms "
                             "or 100mbit,1ms; 'loopback' for none")
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        choices=list(METHODS))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--num-nodes", type=int, default=None)
    parser.add_argument("--workdir", default="runs/bench_sampling")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--pin-malloc", action="store_true",
                        help="fix glibc's mmap threshold so the per-epoch peak RSS follows "
                             "the live tensors (deterministic memory, slower epochs)")
    args = parser.parse_args()

    results: List[Dict[str, Any]] = []
    started = time.time()
    for parts in args.parts:
        root = partitions(args.workdir, parts, args.num_nodes)
        for i, spec in enumerate(args.links):
            link = parse_link(spec)
            seeds = range(args.seeds) if i == 0 else range(1)
            with network_for(parts, link) as net:
                for method in args.methods:
                    runs = []
                    for seed in seeds:
                        out = osp.join(args.workdir, "runs", f"{parts}-{i}-{method}-{seed}")
                        rows = run(net, root, out, METHODS[method] + ["--seed", str(seed)],
                                   args)
                        runs.append({"seed": seed, **summarize(rows)})
                        print(f"  {parts} parts {net.label} {method} seed {seed}: "
                              f"{runs[-1]['epoch_time']:.3f} s/epoch, "
                              f"acc {runs[-1]['test_acc']:.4f}", flush=True)
                    results.append({"parts": parts, "link": net.label, "method": method,
                                    "flags": METHODS[method], "runs": runs})
                    save(args, results, started, targets(results))  # a late failure loses nothing
            print("\n" + table(results, parts, net.label) + "\n", flush=True)
    print("\n".join(targets(results)))
    save(args, results, started, targets(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
