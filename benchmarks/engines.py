r"""Every engine's epoch, this tree against another (ABAB).

A change to how layers aggregate with remote rows (``pyg_dist/nn/``) must
keep every engine's speed. This runs ``pyg-dist train`` through the CLI,
as a user does, for each engine's command line (``docs/architecture.md``),
alternating this tree and ``--baseline`` (another checkout of the
repository, e.g. ``git worktree add ../base <commit>``), each run a fresh
set of ranks on the same partition: per run the median epoch time of the
epochs after the first (which pays one-off costs), per engine the median
ratio of adjacent pairs (this tree / baseline) with its range, and the
1-minute load average around each run.

Usage::

    git worktree add ../base <commit>
    python benchmarks/engines.py --baseline ../base            # ~10 min on 2 cores
    python benchmarks/engines.py --baseline ../base --reps 1 --epochs 3   # a smoke run

Writes ``benchmarks/results/engines_abab.json`` (``--output``).
"""
import argparse
import json
import os
import os.path as osp
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
RESULTS = osp.join(REPO, "benchmarks", "results", "engines_abab.json")

#: Each engine's command line (the flags beyond the shared ones).
ENGINES: Dict[str, List[str]] = {
    "gather": [],
    "gather (broadcast)": ["--exchange", "broadcast"],
    "gather (precompute)": ["--precompute-layer0"],
    "overlap": ["--overlap"],
    "nodes": ["--overlap", "nodes"],
    "sequential": ["--exchange", "sequential"],
    "gather (gat)": ["--model", "gat", "--hidden", "16"],
    "gather (gcn, pipeline)": ["--model", "gcn", "--cache", "pipeline"],
    "pyg (neighbour loader)": ["--loader", "neighbor"],
}


def _train(tree: str, root: str, out: str, flags: List[str], epochs: int,
           nproc: int) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=tree)
    load = os.getloadavg()[0]
    subprocess.run([sys.executable, "-m", "pyg_dist.cli", "train", "--root", root, "--out", out,
                    "--nproc", str(nproc), "--epochs", str(epochs), "--eval-every", "0",
                    "--no-progress", *flags], check=True, env=env, cwd=tree,
                   stdout=subprocess.DEVNULL)
    with open(osp.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(osp.join(out, "summary.json")) as f:
        summary = json.load(f)
    times = [r["time"] for r in rows[1:]]
    return {"epoch_s": statistics.median(times), "epoch_times": times,
            "engine": summary.get("engine"), "final_loss": summary["final_loss"],
            "load_before": load, "load_after": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, help="another checkout of the repository")
    parser.add_argument("--num-nodes", type=int, default=20000)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="engines-")
    root = osp.join(work, "parts")
    subprocess.run([sys.executable, "-m", "pyg_dist.cli", "partition", "--num-parts",
                    str(args.nproc), "--num-nodes", str(args.num_nodes), "--root", root],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    trees = {"this": REPO, "baseline": osp.abspath(args.baseline)}
    result: Dict[str, Any] = {"num_nodes": args.num_nodes, "nproc": args.nproc,
                              "epochs": args.epochs, "reps": args.reps,
                              "cores": os.cpu_count(), "engines": {}}
    print(f"| engine | this / baseline (median of {args.reps}) | range | this s | baseline s |")
    print("|---|---|---|---|---|")
    for name in args.engines:
        runs: List[Dict[str, Any]] = []
        for rep in range(args.reps):
            pair = {}
            order = ("this", "baseline") if rep % 2 == 0 else ("baseline", "this")
            for which in order:
                out = osp.join(work, f"run-{which}")
                shutil.rmtree(out, ignore_errors=True)
                pair[which] = _train(trees[which], root, out, ENGINES[name], args.epochs,
                                     args.nproc)
            pair["ratio"] = pair["this"]["epoch_s"] / pair["baseline"]["epoch_s"]
            runs.append(pair)
        ratios = [r["ratio"] for r in runs]
        result["engines"][name] = {
            "flags": ENGINES[name], "ratio_median": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)], "runs": runs}
        print(f"| {name} | {statistics.median(ratios):.3f} | {min(ratios):.3f}–"
              f"{max(ratios):.3f} | {statistics.median(r['this']['epoch_s'] for r in runs):.3f}"
              f" | {statistics.median(r['baseline']['epoch_s'] for r in runs):.3f} |",
              flush=True)
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
