r"""Resident memory against live memory per rank: ``pyg-dist
train`` defaults, exact and BNS, on 4 METIS parts of ``reddit-shaped`` and
R-MAT, for

* ``before``: another tree of the package (``--before``, e.g. the commit
  before live memory was measured: ``git archive <commit> | tar -x -C DIR``),
  run as is: its baseline does not hold the partition's mapped features;
* ``default``: this tree with its defaults (``--malloc reuse``: glibc keeps
  freed memory for the next step, and the ranks start with glibc's
  per-thread cache off);
* ``system`` (``--variants``): this tree, ``--malloc system`` (glibc and
  torch as they are: the per-thread cache on, the heap's top trimmed);
* ``compact``: this tree, ``--malloc compact`` (chunks from 256 KiB mapped
  on their own, torch's buffers from 2 MiB on huge pages);
* ``mmap64k`` (``--variants``): this tree with ``MALLOC_MMAP_THRESHOLD_=65536
  MALLOC_TRIM_THRESHOLD_=0`` (every chunk above 64 KiB mapped on its own and
  returned on free), the setting the issue started from;
* ``thp1m`` (``--variants``): this tree with ``MALLOC_MMAP_THRESHOLD_=1048576
  THP_MEM_ALLOC_ENABLE=1``: ``compact`` with a 1 MiB threshold (fewer page
  faults, smaller chunks left to the heap).

Runs alternate (variant after variant, ``--reps`` rounds) so that a loaded
machine slows them alike. Per run: the peak RSS above ``baseline_mem_bytes``
and the live peak above ``baseline_live_mem_bytes`` (per rank, median over
the epochs after the first; the largest over ranks), the machine code
paged in since the baseline (``code_mem_per_rank``: libtorch's kernels,
shared by the machine's processes), the ratio of the RSS peak less that
code to the live peak, and the epoch time (median over the epochs after
the first). A ``before``
run has no live figure: its ratio is over the ``default`` run's live peak of
the same round (the training is the same). Prints a table and writes
``results/memory.json``.

    PYTHONPATH=. python benchmarks/memory.py --before ../before --reps 3
"""
import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from benchmarks.common import RESULTS_DIR, machine, portable  # noqa: E402

MiB = 2**20
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
GRAPHS = {"reddit-shaped": [], "rmat": []}
METHODS = {"exact": [], "bns": ["--sampler", "bns"]}
MMAP64K = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
# name: (tree, environment, flags)
VARIANTS = {"default": (REPO, None, []), "system": (REPO, None, ["--malloc", "system"]),
            "compact": (REPO, None, ["--malloc", "compact"]),
            "mmap64k": (REPO, MMAP64K, []),
            "thp1m": (REPO, {"MALLOC_MMAP_THRESHOLD_": "1048576", "THP_MEM_ALLOC_ENABLE": "1"}, [])}
GOAL_RATIO, GOAL_TIME = 1.25, 1.05


def cli(tree: str, args: List[str], env: Optional[Dict[str, str]] = None,
        timeout: float = 900) -> None:
    r"""``pyg-dist ARGS`` with the package of :obj:`tree`."""
    full = dict(os.environ, PYTHONPATH=tree, PYTHONWARNINGS="ignore", **(env or {}))
    subprocess.run([sys.executable, "-m", "pyg_dist.cli", *args], env=full, cwd=tree,
                   check=True, stdout=subprocess.DEVNULL, timeout=timeout)


def one_run(tree: str, root: str, out: str, flags: List[str], epochs: int,
            env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    cli(tree, ["train", "--root", root, "--out", out, "--epochs", str(epochs),
               "--eval-every", str(epochs), "--no-progress", "--no-plots", "--overwrite",
               *flags], env)
    rows = [json.loads(line) for line in open(osp.join(out, "metrics.jsonl"))]
    timed = rows[1:] or rows
    world = len(rows[0]["peak_mem_per_rank"])

    def above(key: str, base: str) -> Optional[int]:
        if key not in timed[0]:
            return None
        return max(int(statistics.median(r[key][i] - r[base][i] for r in timed))
                   for i in range(world))

    code = (max(int(statistics.median(r["code_mem_per_rank"][i] for r in timed))
                for i in range(world)) if "code_mem_per_rank" in timed[0] else 0)
    return {"epoch_time": statistics.median(r["time"] for r in timed),
            "rss_above": above("peak_mem_per_rank", "baseline_mem_per_rank"),
            "code_above": code,
            "live_above": above("live_mem_per_rank", "baseline_live_mem_per_rank"),
            "epoch_times": [r["time"] for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="the package tree to compare with (optional)")
    parser.add_argument("--workdir", default=osp.join("runs", "bench_memory"))
    parser.add_argument("--out", default=osp.join(RESULTS_DIR, "memory.json"))
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=list(GRAPHS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--variants", nargs="+", default=["default", "compact"],
                        choices=list(VARIANTS))
    args = parser.parse_args()
    started = time.time()
    variants = {name: VARIANTS[name] for name in args.variants}
    if args.before:
        variants = {"before": (osp.abspath(args.before), None, []), **variants}
    runs: Dict[str, List[Dict[str, Any]]] = {}
    for graph in args.graphs:
        root = osp.join(args.workdir, f"{graph}{args.parts}")
        if not osp.exists(osp.join(root, "meta.json")):
            cli(REPO, ["partition", "--dataset", graph, "--num-parts", str(args.parts),
                       "--root", root, "--data-dir", osp.join(args.workdir, "data")])
        for method in args.methods:
            for rep in range(args.reps):
                for name, (tree, env, flags) in variants.items():
                    key = f"{graph}/{method}/{name}"
                    one = one_run(tree, root, osp.join(args.workdir, "run"),
                                  METHODS[method] + flags, args.epochs, env)
                    runs.setdefault(key, []).append(one)
                    print(f"{key} round {rep}: {one['epoch_time']:.3f} s, RSS+ "
                          f"{one['rss_above'] / MiB:.0f} MiB (code "
                          f"{one['code_above'] / MiB:.0f}), live+ "
                          f"{(one['live_above'] or 0) / MiB:.0f} MiB", flush=True)
    table = []
    for graph in args.graphs:
        for method in args.methods:
            ref = runs[f"{graph}/{method}/default"]
            for name in variants:
                rs = runs[f"{graph}/{method}/{name}"]
                # a before run's live peak: the default run's of the same round
                ratios = [(r["rss_above"] - r["code_above"])
                          / (r["live_above"] or d["live_above"]) for r, d in zip(rs, ref)]
                before = runs.get(f"{graph}/{method}/before", ref)
                times = [r["epoch_time"] / b["epoch_time"] for r, b in zip(rs, before)]
                table.append({
                    "graph": graph, "method": method, "variant": name,
                    "rss_above_mib": statistics.median(r["rss_above"] for r in rs) / MiB,
                    "code_above_mib": statistics.median(r["code_above"] for r in rs) / MiB,
                    "live_above_mib": statistics.median(
                        (r["live_above"] or d["live_above"]) for r, d in zip(rs, ref)) / MiB,
                    "ratio": statistics.median(ratios),
                    "epoch_time": statistics.median(r["epoch_time"] for r in rs),
                    "time_vs_before": statistics.median(times),
                    "meets_goal": (statistics.median(ratios) <= GOAL_RATIO
                                   and statistics.median(times) <= GOAL_TIME)})
    print(f"\n{'graph':14s} {'method':6s} {'variant':8s} {'RSS+ MiB':>9s} {'code MiB':>9s} "
          f"{'live+ MiB':>9s} "
          f"{'ratio':>6s} {'epoch s':>8s} {'t/before':>8s}  goal (<= {GOAL_RATIO}x, "
          f"<= {GOAL_TIME}x time)")
    for r in table:
        print(f"{r['graph']:14s} {r['method']:6s} {r['variant']:8s} {r['rss_above_mib']:9.0f} "
              f"{r['code_above_mib']:9.0f} "
              f"{r['live_above_mib']:9.0f} {r['ratio']:6.2f} {r['epoch_time']:8.3f} "
              f"{r['time_vs_before']:8.2f}  {'met' if r['meets_goal'] else 'missed'}")
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(portable({"machine": machine(), "args": vars(args),
                            "load_average": os.getloadavg(),
                            "minutes": (time.time() - started) / 60,
                            "table": table, "runs": runs}), f, indent=1)


if __name__ == "__main__":
    main()
