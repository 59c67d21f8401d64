r"""The benchmark suite: every method side by side on the same partitions,
model and epochs, in one run.

On the embedded default graph (:func:`pyg_dist.datasets.load_default`; 50K
nodes in the full run, as three-hop neighbour sampling costs PyG's
``NeighborLoader`` most of a second per step on this 2-core machine),
METIS-partitioned once into ``--parts`` parts, this trains the same 3-layer
GraphSAGE (hidden 64, dropout 0.5, Adam 0.01) for ``--epochs``
epochs with every method of :data:`METHODS`:

* single-process PyG: full-graph, ``NeighborLoader`` (fan-outs 10, 5, 5)
  and ``ClusterLoader`` (ClusterGCN, 4M clusters, 4 per batch), in a Python
  with torch-sparse or pyg-lib for the two loaders (``--pyg-python``,
  ``make bench-env``; without one they are reported as not run), and PyG's
  multi-process recipe (DDP, one ``NeighborLoader`` per process, ``--parts``
  processes); each in its fastest configuration (adjacency form, threads,
  loader workers: :func:`pyg_baselines.tuned` probes them once, the JSON
  keeps every probe);
* pyg_dist, one process per partition (``pyg-dist train``): exact, BNS-GCN
  p = 0.1 and 0.01, PipeGCN-GF, PSC-GCN (VR sampler ε = 0.1, τ = 2, the
  inclusion feature cache at 25% of the halo), SANCUS (``fixed:2``, the
  fastest bound of ``benchmarks/staleness.py`` at equal accuracy), CM-GCN's
  balanced cohesive mini-batches (M = ``--num-batches``) and the neighbour
  loader (fan-outs 10, 5, 5; M steps per epoch).

The mini-batch methods take M steps per epoch, one epoch being a pass over
the train nodes. Every run evaluates every epoch (untimed), for the
convergence curves and the time to a target accuracy (``--target`` × the
exact method's final validation accuracy, mean over seeds). Accuracy is the
mean ± std over ``--seeds`` seeds on the first link; the other links
(``--links``: loopback and :mod:`netem`'s emulated links) run seed 0 of the
pyg_dist methods only (the single-process ones send nothing). It also
reports CM-GCN's cost :math:`J(P)` of cohesive against random batches for
every ``--costs`` M.

Every pyg_dist run also records ``wire_bytes_per_epoch``: what all ranks
sent on their emulated links over the whole run, divided by the epochs
(:attr:`netem.LaunchResult.sent`: start-up, every epoch including the
first, the evaluation after every epoch, gradient all-reduce, metric
reductions and TCP/IP/Ethernet headers; ``bytes_sent`` is the halo payload
of training epochs 2 onwards only). :obj:`None` on loopback, whose counters
all ranks share.

Output: one markdown table per link (:mod:`report`), the PNG figures of
the papers (``report.FIGURES``) and the JSON, written after every run
(``--out``; the figures next to it). ``--quick`` is a CI-sized run
(10K nodes, 5 epochs, 2 seeds, loopback); the default is the full one.

Usage::

    python -m benchmarks.run_all --quick
    python -m benchmarks.run_all                       # full: ~1 h on 2 cores
    python -m benchmarks.run_all --report benchmarks/results/suite.json
"""
import argparse
import math
import os.path as osp
import sys
import time
from typing import Any, Dict, List, NamedTuple, Optional

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import cohesive  # noqa: E402
import pyg_baselines  # noqa: E402
import report  # noqa: E402
from common import (add_targets, apply_preset, load_default_graph, partitions,  # noqa: E402
                    run, save, summarize)
from netem import effective_link, network_for, parse_link  # noqa: E402

from pyg_dist.partition import PartitionBook  # noqa: E402


class Method(NamedTuple):
    kind: str  # "pyg" (single process), "dist" (pyg-dist train) or "cohesive" (+ batches)
    flags: List[str]  # pyg: [baseline kind]; else pyg-dist train flags


PIPE = ["--cache", "pipeline", "--staleness", "1"]
METHODS: Dict[str, Method] = {
    "PyG full-graph": Method("pyg", ["full"]),
    "PyG NeighborLoader": Method("pyg", ["neighbor"]),
    "PyG ClusterLoader": Method("pyg", ["cluster"]),
    "PyG DDP NeighborLoader": Method("pyg", ["ddp"]),  # --parts processes
    "exact": Method("dist", []),
    "BNS p=0.1": Method("dist", ["--sampler", "bns", "--p", "0.1"]),
    "BNS p=0.01": Method("dist", ["--sampler", "bns", "--p", "0.01"]),
    "PipeGCN-GF": Method("dist", PIPE + ["--smooth-features", "0.95",
                                         "--smooth-grads", "0.95"]),
    "PSC": Method("dist", ["--sampler", "vr", "--rate", "0.1", "--staleness", "2",
                           "--feature-cache", "inclusion", "--feature-cache-capacity", "25%"]),
    "SANCUS": Method("dist", ["--bound", "fixed:2"]),
    "CM-GCN cohesive": Method("cohesive", ["--loader", "cohesive"]),
    "neighbour loader": Method("dist", ["--loader", "neighbor"]),  # + fan-out, batch size
}
QUICK = {"num_nodes": 10000, "epochs": 5, "seeds": 2, "links": ["loopback"], "costs": [5, 10]}
FULL = {"num_nodes": 50000, "epochs": 20, "seeds": 3,
        "links": ["loopback", "10gbit,0.1ms", "1gbit,0.1ms"], "costs": [5, 10, 20]}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="CI-sized: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, help="default graph size (full: 50K)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--link", "--links", dest="links", nargs="+",
                        help="loopback or RATE[,DELAY] per network (netem)")
    parser.add_argument("--costs", type=int, nargs="*", help="M values of the J(P) figure")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--num-batches", type=int, default=10,
                        help="M: steps per epoch of the mini-batch methods")
    parser.add_argument("--fanout", type=lambda s: [int(k) for k in s.split(",")],
                        default=[10, 5, 5])
    parser.add_argument("--target", type=float, default=0.98,
                        help="time to this fraction of exact's final val accuracy")
    parser.add_argument("--pyg-python", default=None,
                        help="Python for PyG's loaders (default: this one if it has "
                             "torch-sparse or pyg-lib, else $PYG_ENV/bin/python, default "
                             ".bench/pyg-env/bin/python)")
    parser.add_argument("--workdir", default=None, help="default runs/bench_suite[_quick]")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default=None,
                        help="JSON (default benchmarks/results/suite[_quick].json)")
    parser.add_argument("--report", metavar="JSON",
                        help="print the tables and draw the figures of a saved run")
    args = parser.parse_args(argv)
    if len(args.fanout) != 3:
        parser.error(f"--fanout needs one fan-out per layer of the 3-layer model, "
                     f"got {args.fanout}")
    apply_preset(args, QUICK, FULL, "suite")
    if args.pyg_python is None:
        args.pyg_python = (sys.executable if pyg_baselines.has_loader_backend(sys.executable)
                           is None else pyg_baselines.PYG_PYTHON)
    return args


def cohesive_root(args, data, parts_root: str, made) -> str:
    r"""The partitions plus CM-GCN's balanced cohesive batches (M =
    ``--num-batches``), in a directory of their own."""
    book = PartitionBook.load(parts_root)
    return cohesive.batch_roots(args.workdir, parts_root, data, book, args.parts,
                                args.num_batches, 0, made, [("cohesive", True)])[
                                    "cohesive balanced"]


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    if args.report:
        return report.show(args.report)
    started = time.time()
    data = load_default_graph(args.workdir, args.num_nodes)
    num_train = int(data.train_mask.sum())
    print(f"graph: {data.num_nodes:,} nodes, {data.num_edges:,} edges, {num_train:,} train; "
          f"{args.parts} parts; {args.epochs} epochs x {args.seeds} seeds; links {args.links}",
          flush=True)
    parts_root = partitions(args.workdir, args.parts, args.num_nodes)
    results: List[Dict[str, Any]] = []
    extra: Dict[str, Any] = {"num_train": num_train, "costs": []}

    def checkpoint() -> None:
        add_targets(results, args.target)
        save(args, results, started, report.summary_lines(results, extra), **extra)

    made: Dict[int, Any] = {}  # cohesive batches per M, made once
    if args.costs and "CM-GCN cohesive" in args.methods:
        print("CM-GCN cost J(P) of cohesive vs random batches:", flush=True)
        extra["costs"] = cohesive.costs(data, PartitionBook.load(parts_root), args.parts,
                                        args.costs, 0, made)
    roots = {"dist": parts_root}
    if "CM-GCN cohesive" in args.methods:
        roots["cohesive"] = cohesive_root(args, data, parts_root, made)
    batch_size = math.ceil(math.ceil(num_train / args.num_batches) / args.parts)
    loader_flags = {"neighbour loader": ["--fanout", ",".join(map(str, args.fanout)),
                                         "--batch-size", str(batch_size)]}

    first = effective_link(parse_link(args.links[0])).label  # as network_for labels it
    for name in (m for m in args.methods if METHODS[m].kind == "pyg"):
        result = {"method": name, "link": first, "kind": "pyg", "runs": []}
        kind = METHODS[name].flags[0]  # full-graph needs no loader backend
        python = pyg_baselines.python_for(kind, args.pyg_python)
        try:  # probed once, then every seed in the fastest configuration
            result["config"], result["probes"] = pyg_baselines.tuned(python, kind, args)
            print(f"  {name}: fastest of {len(result['probes'])} probes: {result['config']}",
                  flush=True)
            for seed in range(args.seeds):
                result["runs"].append({"seed": seed, **summarize(
                    pyg_baselines.run(python, kind, args, seed))})
                print(f"  {name} seed {seed}: {result['runs'][-1]['epoch_time']:.3f} s/epoch, "
                      f"acc {result['runs'][-1]['test_acc']:.4f}", flush=True)
        except RuntimeError as e:
            result = {"method": name, "link": first, "kind": "pyg", "error": str(e), "runs": []}
            print(f"  {name}: not run: {e}", flush=True)
        results.append(result)
        checkpoint()

    for i, spec in enumerate(args.links):
        with network_for(args.parts, parse_link(spec)) as net:
            if any(r["link"] == net.label and r["kind"] != "pyg" for r in results):
                print(f"  link {spec}: skipped, it would rerun {net.label}", flush=True)
                continue
            for name in (m for m in args.methods if METHODS[m].kind != "pyg"):
                method = METHODS[name]
                result = {"method": name, "link": net.label, "kind": method.kind,
                          "flags": method.flags + loader_flags.get(name, []), "runs": []}
                for seed in range(args.seeds if i == 0 else 1):
                    out = osp.join(args.workdir, "runs", f"{i}-{name}-{seed}".replace(" ", "_"))
                    wire: Dict[str, Any] = {}
                    rows = run(net, roots[method.kind], out, result["flags"] + [
                        "--seed", str(seed), "--eval-every", "1"], args, wire=wire)
                    result["runs"].append({"seed": seed, **summarize(rows),
                                           "wire_bytes_per_epoch": None if wire["sent"] is None
                                           else wire["sent"] / args.epochs})
                    print(f"  {net.label} {name} seed {seed}: "
                          f"{result['runs'][-1]['epoch_time']:.3f} s/epoch, "
                          f"acc {result['runs'][-1]['test_acc']:.4f}", flush=True)
                results.append(result)
                checkpoint()

    checkpoint()
    report.show(args.out)


if __name__ == "__main__":
    main()
