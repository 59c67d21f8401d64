r"""The headline table of BENCHMARKS.md, measured on this machine from this
tree (``make bench``; ``make bench-full`` for the long forms).

One row per claim, each the quick form of the benchmark that measures it in
full: full-graph training against single-process PyG (``overhead.py``), the
papers' methods against exact (``run_all.py``), sequential (SAR) memory per
rank at 1/2/4/8 ranks (``sequential.py``), neighbour-sampled mini-batches
against PyG's ``NeighborLoader`` (``minibatch.py``) and DistDGL 2.1
(``distdgl.py``), out-of-core partitioning (``out_of_core.py``) and the peak
resident memory per rank over three runs (``memory.py``). Each benchmark
writes its own JSON under ``runs/headline/``; the numbers the table shows go
to ``benchmarks/results/headline.json`` with the date, the commit and the
machine, and the table replaces what lies between ``<!-- headline:begin -->``
and ``<!-- headline:end -->`` in BENCHMARKS.md (nothing else there changes).
A row whose peer is missing (DistDGL's venv, a Python with PyG's loaders)
says which ``make`` target builds it.

Usage::

    python benchmarks/headline.py              # the quick forms, ~12 min on 2 cores
    python benchmarks/headline.py --full       # the long forms (hours)
    python benchmarks/headline.py --rows sar oocore   # some rows; the others kept
    python benchmarks/headline.py --render     # the table again from headline.json
"""
import argparse
import datetime
import json
import os
import os.path as osp
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(HERE)
RESULTS = osp.join(HERE, "results", "headline.json")
PAGE = osp.join(REPO, "BENCHMARKS.md")
WORK = osp.join("runs", "headline")
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
MiB = 2 ** 20

# Per row: the detail section (anchor), the results file of its full form, and the
# commands of its quick and full forms (``{out}``: the JSON the row reads, ``{work}``:
# its scratch folder). Every command runs from the repository's root.
ROWS: Dict[str, Dict[str, Any]] = {
    "fullgraph": {
        "claim": "Full-graph epoch and accuracy against single-process PyG",
        "section": "full-graph-training-against-single-process-pyg",
        "json": "overhead_1part.json",
        "quick": "benchmarks/overhead.py --parts 1 --reps 5 --epochs 4 --num-nodes 20000 "
                 "--workdir {work} --output {out}",
        "full": "benchmarks/overhead.py --parts 1 --workdir {work} --output {out}",
    },
    "methods": {
        "claim": "BNS, PipeGCN, SANCUS, PSC against exact (2 parts)",
        "section": "the-papers-methods-against-exact",
        "json": "suite.json",
        "quick": "benchmarks/run_all.py --quick --methods exact 'BNS p=0.1' PipeGCN-GF SANCUS "
                 "PSC --seeds 1 --epochs 10 --costs --workdir {work} --out {out}",
        "full": "benchmarks/run_all.py --workdir {work} --out {out}",
    },
    "sar": {
        "claim": "Sequential (SAR) memory per rank at 1/2/4/8 ranks",
        "section": "memory-per-rank",
        "json": "sequential_hidden256.json",
        "quick": "benchmarks/sequential.py --graphs reddit-shaped:random --ranks 1 2 4 8 "
                 "--reddit-nodes 10000 --hidden 128 --epochs 2 --workdir {work} --out {out}",
        "full": "benchmarks/sequential.py --graphs rmat:random rmat reddit-shaped:random "
                "reddit-shaped --ranks 1 2 4 8 --epochs 3 --hidden 256 --reddit-nodes 20000 "
                "--repeats 3 --workdir {work} --out {out}",
    },
    "neighbor": {
        "claim": "Neighbour mini-batches against PyG's NeighborLoader",
        "section": "neighbour-sampled-mini-batches",
        "json": "minibatch.json",
        "quick": "benchmarks/minibatch.py --num-nodes 10000 --parts 2 --methods metis "
                 "--links loopback --epochs 2 --workdir {work} --out {out}",
        "full": "benchmarks/minibatch.py --workdir {work} --out {out}",
    },
    "distdgl": {
        "claim": "Neighbour mini-batches against DistDGL 2.1 (2 parts)",
        "section": "against-distdgl-21",
        "json": "distdgl_2parts.json",
        "quick": "benchmarks/distdgl.py --quick --workdir {work} --out {out}",
        "full": "benchmarks/distdgl.py --repeats 3 --workdir {work} --out {out}",
    },
    "oocore": {
        "claim": "Out-of-core partitioning (R-MAT from disk, KaMinPar)",
        "section": "out-of-core-partitioning",
        "json": "out_of_core.json",
        "quick": "benchmarks/out_of_core.py --scales 18 --methods kaminpar --parts 4 --no-train "
                 "--workdir {work} --out {out}",
        "full": "benchmarks/out_of_core.py --workdir {work} --out {out}",
    },
    "rss": {
        "claim": "Peak RSS per rank, 3 runs (4 parts, exact, `reddit-shaped`)",
        "section": "memory-per-rank",
        "json": "memory_default_vs_compact.json",
        "quick": "benchmarks/memory.py --variants default --reps 3 --graphs reddit-shaped "
                 "--methods exact --epochs 3 --workdir {work} --out {out}",
        "full": "benchmarks/memory.py --variants default compact --reps 3 --workdir {work} "
                "--out {out}",
    },
}


# ----------------------------------------------------------------- the machine
def git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def machine() -> Dict[str, Any]:
    r"""What the table was measured on and with: the CPU model, cores,
    memory, Python, torch and PyG, the commit (``+changes`` when the tree
    differs from it)."""
    import torch
    import torch_geometric
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    # the table's own files do not count: a run of some rows rewrites them
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                ":!BENCHMARKS.md", ":!benchmarks/results/headline.json")
    return {"date": datetime.date.today().isoformat(),
            "commit": (git("rev-parse", "--short", "HEAD") or "unknown")
            + ("+changes" if dirty else ""),
            "cpu": model, "cores": os.cpu_count(),
            "memory_gib": round(pages * page_size / 2**30, 1),
            "python": platform.python_version(), "torch": torch.__version__,
            "torch_geometric": torch_geometric.__version__}


# ------------------------------------------------------------- running a row
def command(key: str, full: bool) -> str:
    r"""The command line that reproduces row :obj:`key`, as the table prints it."""
    spec = ROWS[key]
    out = osp.join(WORK, key + ".json")
    return "python " + spec["full" if full else "quick"].format(
        work=osp.join(WORK, key), out=out)


def run(key: str, full: bool, timeout: float) -> Dict[str, Any]:
    r"""Runs row :obj:`key`'s benchmark; its JSON, or ``{"error": ...}``."""
    out = osp.join(REPO, WORK, key + ".json")
    if osp.exists(out):
        os.remove(out)
    # every run starts as on a clean clone: no graph or partition of an earlier run reused
    shutil.rmtree(osp.join(REPO, WORK, key), ignore_errors=True)
    argv = shlex.split(command(key, full))
    argv[0] = sys.executable
    log = osp.join(REPO, WORK, key + ".log")
    os.makedirs(osp.dirname(log), exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore")
    started, load = time.time(), os.getloadavg()[0]
    print(f"[{key}] {command(key, full)}", flush=True)
    with open(log, "w") as f:
        try:
            proc = subprocess.run(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout)
            code: Optional[int] = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = time.time() - started
    meta = {"seconds": round(seconds, 1), "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2), "log": osp.relpath(log, REPO)}
    print(f"[{key}] {seconds:.0f} s, exit {code}", flush=True)
    if code != 0 or not osp.exists(out):
        with open(log) as f:
            tail = [line.strip() for line in f.read().splitlines() if line.strip()][-1:]
        why = "timed out" if code is None else f"exit {code}: {tail[0] if tail else ''}"
        return {"error": why[:300], **meta}
    with open(out) as f:
        return {"data": json.load(f), **meta}


# -------------------------------------------- what each row shows of its JSON
def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def fullgraph(d: Dict[str, Any]) -> Dict[str, Any]:
    ratio = d["ratio"]
    reps = d["repetitions"]
    nodes = d["machine"].get("num_nodes") or 0
    return {"measured": f"pyg_dist on 1 partition: **{ratio['median']:.2f}x** PyG's epoch "
                        f"(default graph, {nodes:,} nodes; median of {ratio['n']} "
                        f"alternated pairs, "
                        f"{ratio['min']:.2f}-{ratio['max']:.2f}x); test accuracy "
                        f"{pct(statistics.median(r['pyg_dist_test_acc'] for r in reps))}",
            "peer": f"PyG, 1 process, CSR `adj_t`: "
                    f"{statistics.median(r['pyg_s'] for r in reps):.3f} s/epoch, test "
                    f"accuracy {pct(statistics.median(r['pyg_test_acc'] for r in reps))}",
            "numbers": {"ratio": ratio, "pyg_s": [r["pyg_s"] for r in reps],
                        "pyg_dist_s": [r["pyg_dist_s"] for r in reps],
                        "graph_nodes": d["machine"].get("num_nodes")}}


def methods(d: Dict[str, Any]) -> Dict[str, Any]:
    by = {r["method"]: r["runs"][0] for r in d["results"] if r.get("runs")}
    exact = by["exact"]
    cells, numbers = [], {}
    for name, label in (("BNS p=0.1", "BNS"), ("PipeGCN-GF", "PipeGCN"),
                        ("SANCUS", "SANCUS"), ("PSC", "PSC")):
        one = by.get(name)
        if one is None:
            continue
        speed = one["epochs_per_s"] / exact["epochs_per_s"]
        data = one["bytes_sent"] / exact["bytes_sent"] if exact["bytes_sent"] else 0.0
        acc = 100 * (one["test_acc"] - exact["test_acc"])
        cells.append(f"{label} {speed:.2f}x, {data:.2f}x bytes, {acc:+.1f} pp")
        numbers[name] = {"epochs_per_s_x_exact": speed, "bytes_x_exact": data,
                         "test_acc_pp_vs_exact": acc}
    a = d["args"]
    return {"measured": "; ".join(cells) + " (epochs/s, halo bytes and test accuracy "
                        f"against exact; default graph, {a['num_nodes']:,} nodes, "
                        f"{a['parts']} ranks, {a['epochs']} epochs, loopback)",
            "peer": f"exact: {exact['epochs_per_s']:.1f} epochs/s, "
                    f"{exact['bytes_sent'] / MiB:.2f} MiB/epoch, test accuracy "
                    f"{pct(exact['test_acc'])}",
            "numbers": numbers}


def sar(d: Dict[str, Any]) -> Dict[str, Any]:
    rows = d["results"]
    seq = {r["ranks"]: r for r in rows if r["exchange"] == "sequential" or r["ranks"] == 1}
    halo = {r["ranks"]: r for r in rows if r["exchange"] == "halo"}
    cells = []
    for k in sorted(seq):
        mem = seq[k]["above_baseline_max"] / MiB
        cells.append(f"{k}: {mem:.0f}" + (f" ({halo[k]['above_baseline_max'] / MiB:.0f})"
                                           if k > 1 and k in halo else ""))
    graph, a = rows[0]["graph"], d["args"]
    return {"measured": "MiB per rank above baseline, sequential (materialising) at "
                        + ", ".join(cells) + f" ranks (`{graph}`, {a['reddit_nodes']:,} "
                        f"nodes, hidden {a['hidden']})",
            "peer": "single process: the 1-rank figure; the ideal falls as 1/ranks",
            "numbers": {str(k): {"sequential_mib": seq[k]["above_baseline_max"] / MiB,
                                 "halo_mib": halo[k]["above_baseline_max"] / MiB
                                 if k in halo else None,
                                 "epoch_s": seq[k]["epoch_time"]} for k in sorted(seq)}}


def neighbor(d: Dict[str, Any]) -> Dict[str, Any]:
    res = d["results"][0]
    runs = res["runs"]
    best = max(runs, key=lambda r: r["seeds_per_s"])
    pyg = res.get("pyg_neighbor_loader") or {"error": "not run"}
    a = d["args"]
    measured = (f"pyg_dist, {best['parts']} ranks ({best['sampling']}): "
                f"{best['seeds_per_s']:,.0f} seeds/s, test accuracy {pct(best['test_acc'])} "
                f"(default graph, {a['num_nodes']:,} nodes, {a['epochs']} epochs)")
    if "error" in pyg:
        peer = ("PyG's NeighborLoader needs torch-sparse or pyg-lib: `make bench-env`, "
                "then `make bench` again")
    else:
        peer = (f"PyG NeighborLoader, 1 process: {pyg['seeds_per_s']:,.0f} seeds/s, test "
                f"accuracy {pct(pyg['test_acc'])}; pyg_dist "
                f"**{best['seeds_per_s'] / pyg['seeds_per_s']:.2f}x**")
    return {"measured": measured, "peer": peer,
            "numbers": {"pyg_dist_seeds_per_s": best["seeds_per_s"],
                        "pyg_seeds_per_s": pyg.get("seeds_per_s")}}


def distdgl(d: Dict[str, Any]) -> Dict[str, Any]:
    s = d["summary"]
    dgl, pyg = s[s["dgl_best"]], s["pyg"]
    return {"measured": f"pyg_dist: {pyg['seeds_per_s_median']:,.0f} seeds/s, test accuracy "
                        f"{pct(pyg['test_acc_mean'])}, peak RSS/trainer "
                        f"{pyg['peak_rss_per_trainer_mib_max']:,.0f} MiB; "
                        f"**{s['pyg_over_dgl_seeds_per_s']:.2f}x** DistDGL's seeds/s "
                        f"(`reddit_shaped`, {d['args']['num_nodes']:,} nodes, "
                        f"{d['args']['epochs']} epochs)",
            "peer": f"DistDGL 2.1 ({s['dgl_best']}): {dgl['seeds_per_s_median']:,.0f} seeds/s, "
                    f"test accuracy {pct(dgl['test_acc_mean'])}, peak RSS/trainer "
                    f"{dgl['peak_rss_per_trainer_mib_max']:,.0f} MiB",
            "numbers": {"pyg_over_dgl_seeds_per_s": s["pyg_over_dgl_seeds_per_s"],
                        "nodes": d["args"].get("num_nodes"), "epochs": d["args"].get("epochs")}}


def oocore(d: Dict[str, Any]) -> Dict[str, Any]:
    p = d["partitions"][0]
    g = d["graphs"].get(str(p["scale"])) or {}
    return {"measured": f"{p['num_nodes']:,} nodes, {p['num_edges']:,} edges into "
                        f"{len(p['part_edges'])} parts: {p['seconds']:.1f} s, peak RSS "
                        f"{p['peak_rss_gib']:.2f} GiB ({p['ns_per_edge']:,.0f} ns/edge, "
                        f"cut {pct(p['edge_cut_ratio'])})",
            "peer": (f"writing the graph: {g['seconds']:.1f} s, peak {g['peak_rss_gib']:.2f} GiB"
                     if g else "-"),
            "numbers": {k: p[k] for k in ("num_nodes", "num_edges", "seconds", "peak_rss_gib",
                                          "ns_per_edge", "edge_cut_ratio")}}


def rss(d: Dict[str, Any]) -> Dict[str, Any]:
    (key, runs), = [(k, v) for k, v in d["runs"].items() if k.endswith("/default")][:1]
    above = sorted(r["rss_above"] / MiB for r in runs)
    live = sorted(r["live_above"] / MiB for r in runs)
    med = statistics.median(above)
    return {"measured": f"largest rank: **{med:.0f} MiB** above baseline, median of "
                        f"{len(above)} runs ({above[0]:.0f}-{above[-1]:.0f}); live "
                        f"{statistics.median(live):.0f} MiB",
            "peer": "the spread is glibc's placement of a step's buffers (see the section)",
            "numbers": {"cell": key, "rss_above_mib": above, "live_above_mib": live}}


PARSE: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
    "fullgraph": fullgraph, "methods": methods, "sar": sar, "neighbor": neighbor,
    "distdgl": distdgl, "oocore": oocore, "rss": rss}


def missing_peer(key: str) -> Optional[str]:
    r"""Why row :obj:`key` cannot run here, as a ``make`` target to run."""
    if key == "distdgl":
        env = os.environ.get("DGL_ENV") or osp.join(REPO, ".bench", "dgl-env")
        if not osp.exists(osp.join(env, "bin", "python")):
            return "DistDGL's venv is missing: `make bench-dgl-env` (~5 GB), then `make bench`"
        if os.geteuid() != 0:
            return "needs root (network and mount namespaces): `sudo make bench-dgl-quick`"
    return None


def measure(key: str, full: bool, timeout: float) -> Dict[str, Any]:
    row: Dict[str, Any] = {"claim": ROWS[key]["claim"], "command": command(key, full),
                           "form": "full" if full else "quick"}
    why = missing_peer(key)
    if why:
        return {**row, "measured": "-", "peer": why}
    got = run(key, full, timeout)
    row.update({k: v for k, v in got.items() if k != "data"})
    if "error" in got:
        return {**row, "measured": f"failed: {got['error']}", "peer": "-"}
    try:
        row.update(PARSE[key](got["data"]))
    except (KeyError, IndexError, ValueError, ZeroDivisionError, TypeError) as e:
        return {**row, "measured": f"unreadable results: {type(e).__name__}: {e}", "peer": "-"}
    return row


# ------------------------------------------------------------------ the table
def render(head: Dict[str, Any]) -> str:
    m = head["machine"]
    loads = [v for r in head["rows"].values() for v in (r.get("load_before"), r.get("load_after"))
             if v is not None]
    # the rows' own times: a run of some rows keeps the others' (--rows)
    minutes = sum(r.get("seconds", 0) for r in head["rows"].values()) / 60
    lines = [BEGIN,
             f"Measured {m['date']} at commit `{m['commit']}` on {m['cpu']}, {m['cores']} "
             f"cores, {m['memory_gib']} GiB; Python {m['python']}, torch {m['torch']}, "
             f"PyG {m['torch_geometric']}. `make bench` ({head['form']} forms, "
             f"{minutes:.0f} min) wrote it and `benchmarks/results/headline.json`"
             + (f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f} during the runs"
                + (" (other work shared the cores: times are noisy)" if max(loads) > 1.0
                   else "") if loads else "") + ". The quick forms train a few epochs on "
             "small graphs, so their accuracies are not converged; each row's section has "
             "its full run.",
             "",
             "| claim | pyg_dist | peer or reference | reproduce | details |",
             "|---|---|---|---|---|"]
    for key in ROWS:
        r = head["rows"].get(key)
        if r is None:
            continue
        spec = ROWS[key]
        lines.append(f"| {r['claim']} | {r['measured']} | {r['peer']} | `{r['command']}` | "
                     f"[section](#{spec['section']}), [full run]"
                     f"(benchmarks/results/{spec['json']}) |")
    lines.append(END)
    return "\n".join(line.replace("\n", " ") for line in lines)


def rewrite_page(block: str, page: str = PAGE) -> None:
    r"""Replaces the table between the markers of :obj:`page`."""
    with open(page) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{page} has no {BEGIN} ... {END} block to rewrite")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    with open(page, "w") as f:
        f.write(pattern.sub(lambda _: block, text, count=1))


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the long forms (hours)")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS),
                        help="rows to measure (the others keep headline.json's)")
    parser.add_argument("--render", action="store_true",
                        help="only write the table again from headline.json")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per row")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--page", default=PAGE)
    args = parser.parse_args(argv)
    old: Dict[str, Any] = {}
    if osp.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
    if args.render:
        if not old:
            raise SystemExit(f"{args.out} not found: run without --render first")
        rewrite_page(render(old), args.page)
        return
    started = time.time()
    rows = dict(old.get("rows", {})) if set(args.rows) != set(ROWS) else {}
    for key in args.rows:
        rows[key] = measure(key, args.full, args.timeout)
    head = {"machine": machine(), "form": "full" if args.full else "quick",
            "minutes": (time.time() - started) / 60,
            "rows": {k: rows[k] for k in ROWS if k in rows}}
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(head, f, indent=1)
    block = render(head)
    rewrite_page(block, args.page)
    print(block)
    print(f"wrote {osp.relpath(args.out, REPO)} and the table of {osp.relpath(args.page, REPO)}")


if __name__ == "__main__":
    main()
