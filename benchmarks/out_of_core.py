r"""Graphs bigger than one process: out-of-core partitioning and training.

For every ``--scales`` :math:`s`, writes an R-MAT graph of :math:`2^s` nodes
(edge factor 16, 128 fp32 features) to disk with ``pyg-dist rmat``, then
partitions it into ``--parts`` parts with ``pyg-dist partition --from`` and
each of ``--methods`` (the commands of docs/data.md, default settings). Every
command runs in its own process; its wall time and peak resident set
(``wait4``'s ``ru_maxrss``) are recorded with the cut and the communication
volume of the result. METIS runs up to ``--metis-max-scale`` (its work
arrays grow ~4 KB per node, measured; beyond, it is recorded as skipped with
that reason).

``--train`` then runs, on this machine, one epoch of the neighbour loader
on the ``--neighbor-scale`` graph with 4 ranks, and two full-graph epochs
(BNS-GCN, p = 0.1) on the ``--full-scale`` graph with 4 ranks, both from
4-part KaMinPar partitions, recording epoch time and per-rank peak memory.

The table and the extrapolation to ogbn-papers100M (time per edge and
memory per node of the largest scale) are printed and written to ``--out``.

Usage::

    python benchmarks/out_of_core.py                    # 2^20, 2^22, 2^24 (hours on 2 cores)
    python benchmarks/out_of_core.py --scales 16,18 --no-train
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from common import RESULTS_DIR, machine, portable  # noqa: E402

GiB = 2**30
# ogbn-papers100M: nodes and directed citations (the graph folder OGB's
# layout converts to holds both directions: twice as many edges).
PAPERS_NODES, PAPERS_EDGES = 111_059_956, 2 * 1_615_685_872


def measured(cmd: List[str], log: str) -> Tuple[Dict[str, Any], List[Tuple[float, int, int]]]:
    r"""Runs :obj:`cmd` (output to :obj:`log`); its wall time, peak RSS
    (``wait4``) and peak anonymous RSS (``RssAnon``, sampled every 0.1 s:
    RSS without the pages of mapped files, which the kernel can drop and
    re-read), or why it failed; and the samples (:func:`_sample`)."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        samples: List[Tuple[float, int, int]] = []
        sampler = threading.Thread(target=_sample, args=(proc.pid, samples), daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    result = {"seconds": time.perf_counter() - start,
              "peak_rss_gib": usage.ru_maxrss * 1024 / GiB,
              "peak_anon_gib": max((a for _, _, a in samples), default=0) * 1024 / GiB,
              "command": " ".join(cmd)}
    if proc.returncode != 0:
        with open(log) as f:
            result["error"] = f.read()[-2000:]
    return result, samples


def _sample(pid: int, samples: List[Tuple[float, int, int]]) -> None:
    r"""Appends ``(time, VmRSS, RssAnon)`` (KiB) of process :obj:`pid` to
    :obj:`samples` every 0.1 s while it runs."""
    path = f"/proc/{pid}/status"
    while True:
        try:
            with open(path) as f:
                fields = dict(line.split(":", 1) for line in f)
            samples.append((time.time(), int(fields["VmRSS"].split()[0]),
                            int(fields["RssAnon"].split()[0])))
        except (FileNotFoundError, ProcessLookupError, ValueError, KeyError):
            return
        time.sleep(0.1)


def step_peaks(steps: List[Dict[str, Any]], samples) -> List[Dict[str, Any]]:
    r"""The sampled peak RSS and anonymous RSS within each of the
    partitioning's timed :obj:`steps` (``meta["steps"]``)."""
    rows = []
    for step in steps:
        end = step["started"] + step["seconds"]
        inside = [(rss, anon) for t, rss, anon in samples if step["started"] <= t <= end]
        rows.append({"step": step["step"], "seconds": step["seconds"],
                     "peak_rss_gib": max((r for r, _ in inside), default=0) * 1024 / GiB,
                     "peak_anon_gib": max((a for _, a in inside), default=0) * 1024 / GiB})
    return rows


def cli(*args: str) -> List[str]:
    return [sys.executable, "-m", "pyg_dist.cli", *args]


def graph(workdir: str, scale: int) -> Dict[str, Any]:
    folder = osp.join(workdir, f"rmat{scale}")
    if osp.exists(osp.join(folder, "graph.json")):
        return {"folder": folder, "generated": None}
    step, _ = measured(cli("rmat", "--scale", str(scale), "--out", folder),
                       osp.join(workdir, f"rmat{scale}.log"))
    if "error" in step:
        raise SystemExit(f"generating 2^{scale} failed:\n{step['error']}")
    return {"folder": folder, "generated": step}


def partition(workdir: str, folder: str, scale: int, parts: int, method: str) -> Dict[str, Any]:
    root = osp.join(workdir, f"parts{scale}_{method}_{parts}")
    step, samples = measured(cli("partition", "--from", folder, "--num-parts", str(parts),
                                 "--root", root, "--method", method),
                             osp.join(workdir, f"partition{scale}_{method}_{parts}.log"))
    if "error" not in step:
        with open(osp.join(root, "meta.json")) as f:
            meta = json.load(f)
        step.update(root=root, num_nodes=meta["num_nodes"], num_edges=meta["num_edges"],
                    edge_cut_ratio=meta["edge_cut_ratio"], comm_volume=meta["comm_volume"],
                    ns_per_edge=step["seconds"] / meta["num_edges"] * 1e9,
                    part_edges=[p["num_edges"] for p in meta["parts"]],
                    steps=step_peaks(meta["steps"], samples))
    return step


def train(workdir: str, root: str, name: str, flags: List[str]) -> Dict[str, Any]:
    out = osp.join(workdir, f"train_{name}")
    step, _ = measured(cli("train", "--root", root, "--out", out, "--overwrite", "--no-plots",
                           "--no-progress", "--timeout", "3600", *flags),
                       osp.join(workdir, f"train_{name}.log"))
    if "error" not in step:
        with open(osp.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        step.update(epoch_times=[r["time"] for r in rows],
                    peak_mem_per_rank_gib=[m / GiB for m in rows[-1]["peak_mem_per_rank"]],
                    test_acc=rows[-1].get("test_acc"))
    return step


def extrapolate(rows: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    r"""ogbn-papers100M's partitioning by KaMinPar, from the two largest
    scales: time linear in the edges; memory linear in the nodes, step by
    step (both graphs have about 30 symmetrised neighbours per node, as
    papers100M has 29), the peak being the largest step's."""
    done = sorted((r for r in rows if r["method"] == "kaminpar" and "error" not in r
                   and "skipped" not in r), key=lambda r: r["num_nodes"])
    if len(done) < 2 or done[-2]["num_nodes"] == done[-1]["num_nodes"]:
        return None
    small, large = done[-2], done[-1]

    def linear(a: float, b: float) -> float:
        per_node = (b - a) / (large["num_nodes"] - small["num_nodes"])
        return b + per_node * (PAPERS_NODES - large["num_nodes"])

    extrapolated = {"from_scales": [small["scale"], large["scale"]], "nodes": PAPERS_NODES,
                    "edges": PAPERS_EDGES,
                    "hours": large["ns_per_edge"] * PAPERS_EDGES / 1e9 / 3600,
                    "whole_run_peak_rss_gib": linear(small["peak_rss_gib"],
                                                     large["peak_rss_gib"])}
    steps = {s["step"]: s for s in small.get("steps", [])}
    extrapolated["steps"] = [
        {"step": s["step"], **{key: linear(steps[s["step"]][key], s[key])
                               for key in ("peak_rss_gib", "peak_anon_gib")}}
        for s in large.get("steps", []) if s["step"] in steps]
    for key in ("peak_rss_gib", "peak_anon_gib"):  # rows without steps: the whole run's
        extrapolated[key] = max((s[key] for s in extrapolated["steps"]),
                                default=linear(small[key], large[key]))
    return extrapolated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scales", default="20,22,24")
    parser.add_argument("--parts", type=int, default=8)
    parser.add_argument("--methods", default="kaminpar,metis")
    parser.add_argument("--metis-max-scale", type=int, default=22)
    parser.add_argument("--partition", action=argparse.BooleanOptionalAction, default=True,
                        help="--no-partition: training only (the rows of --out that a run "
                             "does not redo are kept)")
    parser.add_argument("--train", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--neighbor-scale", type=int, default=24)
    parser.add_argument("--full-scale", type=int, default=22)
    parser.add_argument("--workdir", default=osp.join("runs", "bench_out_of_core"))
    parser.add_argument("--out", default=osp.join(RESULTS_DIR, "out_of_core.json"))
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    started = time.time()
    results: Dict[str, Any] = {"machine": machine(), "args": vars(args), "graphs": {},
                               "partitions": [], "training": []}

    def save() -> None:
        results["partitions"].sort(key=lambda r: (r["scale"], r["method"]))
        results["minutes"] = (time.time() - started) / 60
        results["extrapolation"] = extrapolate(results["partitions"])
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(portable(results), f, indent=1)

    scales = [int(s) for s in args.scales.split(",")] if args.partition else []
    methods = args.methods.split(",")
    if osp.exists(args.out):  # rows this run does not redo are kept
        with open(args.out) as f:
            kept = json.load(f)
        results["graphs"] = kept["graphs"]
        results["partitions"] = [r for r in kept["partitions"]
                                 if not (r["scale"] in scales and r["method"] in methods)]
        if not args.train:
            results["training"] = kept["training"]
    folders = {}
    for scale in scales:
        made = graph(args.workdir, scale)
        folders[scale] = made["folder"]
        if made["generated"]:
            results["graphs"][str(scale)] = made["generated"]
        for method in methods:
            if method == "metis" and scale > args.metis_max_scale:
                row = {"skipped": f"METIS above 2^{args.metis_max_scale}: its peak grows "
                                  f"~4 KB/node (2^20: 4.4 GB measured), past this machine"}
            else:
                row = partition(args.workdir, made["folder"], scale, args.parts, method)
            row = {"scale": scale, "method": method, **row}
            results["partitions"].append(row)
            save()
            print(json.dumps(row), flush=True)

    if args.train:
        for name, scale, flags in (
                ("neighbor", args.neighbor_scale, ["--loader", "neighbor", "--epochs", "1",
                                                   "--eval-every", "1"]),
                ("full_bns", args.full_scale, ["--sampler", "bns", "--p", "0.1",
                                               "--epochs", "2", "--eval-every", "2"])):
            folder = folders.get(scale) or graph(args.workdir, scale)["folder"]
            four = partition(args.workdir, folder, scale, 4, "kaminpar")
            row = {"name": name, "scale": scale, "partition_4": four}
            if "error" not in four:
                row.update(train(args.workdir, four["root"], name, flags))
            results["training"].append(row)
            save()
            print(json.dumps(row), flush=True)
    save()
    print_table(results)


def print_table(results: Dict[str, Any]) -> None:
    print(f"{'scale':>5} {'method':>8} {'edges':>13} {'time s':>8} {'ns/edge':>8} "
          f"{'peak GiB':>8} {'anon GiB':>8} {'cut':>7} {'comm vol':>11}")
    for r in results["partitions"]:
        if "skipped" in r or "error" in r:
            print(f"{r['scale']:>5} {r['method']:>8}  {r.get('skipped') or 'failed'}")
            continue
        print(f"{r['scale']:>5} {r['method']:>8} {r['num_edges']:>13,} {r['seconds']:>8.1f} "
              f"{r['ns_per_edge']:>8.0f} {r['peak_rss_gib']:>8.2f} "
              f"{r.get('peak_anon_gib', float('nan')):>8.2f} "
              f"{r['edge_cut_ratio']:>7.1%} {r['comm_volume']:>11,}")
    for scale, made in results["graphs"].items():
        if made:
            print(f"rmat 2^{scale}: generated in {made['seconds']:.0f} s, "
                  f"peak {made['peak_rss_gib']:.2f} GiB")
    for r in results["training"]:
        if "error" in r or "epoch_times" not in r:
            print(f"train {r['name']} 2^{r['scale']}: failed")
            continue
        print(f"train {r['name']} 2^{r['scale']}: epochs {r['epoch_times']} s, peak per rank "
              f"{[round(m, 2) for m in r['peak_mem_per_rank_gib']]} GiB, wall "
              f"{r['seconds']:.0f} s (peak RSS of the launcher and ranks: "
              f"{r['peak_rss_gib']:.2f} GiB)")
    for r in results["partitions"]:
        for step in r.get("steps", []):
            print(f"  2^{r['scale']} {r['method']} {step['step']:>18}: {step['seconds']:7.1f} s, "
                  f"peak {step['peak_rss_gib']:.2f} GiB (anonymous {step['peak_anon_gib']:.2f})")
    e = results.get("extrapolation")
    if e:
        print(f"papers100M ({e['nodes']:,} nodes, {e['edges']:,} edges), extrapolated from "
              f"2^{e['from_scales'][0]} and 2^{e['from_scales'][1]}, step by step:")
        for step in e["steps"]:
            print(f"  {step['step']:>18}: {step['peak_rss_gib']:.1f} GiB (anonymous "
                  f"{step['peak_anon_gib']:.1f})")
        print(f"  peak {e['peak_rss_gib']:.1f} GiB, {e['hours']:.1f} h (the whole run's "
              f"peak RSS extrapolated alone: {e['whole_run_peak_rss_gib']:.1f} GiB)")


if __name__ == "__main__":
    main()
