"""``pyg-dist``: partition, inspect and train from the command line."""
import argparse
import functools
import json
import math
import os
import os.path as osp
import sys
from typing import List, Optional

import torch

from pyg_dist.distributed import DEFAULT_TIMEOUT


def _add_train_args(p: argparse.ArgumentParser) -> None:
    from pyg_dist.comm.compress import CODECS
    from pyg_dist.train import MODELS, TrainConfig
    d = TrainConfig()
    p.add_argument("--model", choices=sorted(MODELS), default=d.model)
    p.add_argument("--layers", type=int, default=d.num_layers, dest="num_layers")
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--heads", type=int, default=d.heads, help="GAT attention heads")
    p.add_argument("--dropout", type=float, default=d.dropout)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    p.add_argument("--nproc", type=_positive(int, "--nproc"), default=None,
                   help="spawn this many local ranks (default: one per partition; "
                        "ignored under torchrun)")
    p.add_argument("--timeout", type=_positive(float, "--timeout"), default=DEFAULT_TIMEOUT,
                   help="seconds a rank waits for a peer before failing")
    p.add_argument("--exchange-dtype", choices=list(CODECS), default=d.exchange_dtype,
                   help="how halo rows and gradients travel (int8: per-row scale)")
    p.add_argument("--loader", choices=["full", "cohesive", "neighbor"], default=d.loader,
                   help="full-graph epochs, CM-GCN cohesive mini-batches (needs "
                        "partition --num-batches) or DistDGL neighbour-sampled "
                        "mini-batches")
    g = p.add_argument_group("neighbour loader (--loader neighbor)")
    g.add_argument("--fanout", type=_fanout, default=d.fanout,
                   help="neighbours sampled per hop, one per layer, -1 for all "
                        "(default 15,10,5)")
    g.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="seed nodes per rank and step")
    g.add_argument("--sampler-workers", type=int, default=d.sampler_workers,
                   help="background workers sampling batches ahead of the trainer "
                        "(ByteGNN pipelining; 0: sample in the training loop)")
    g.add_argument("--fixed-depth", action="store_true",
                   help="keep every worker busy instead of adapting how many batches "
                        "are sampled ahead")
    p.add_argument("--inductive", action="store_true",
                   help="train on the train nodes' subgraph, evaluate on the whole graph "
                        "(needs partition --inductive)")
    g = p.add_argument_group("checkpoints")
    g.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, metavar="N",
                   help="save model, optimiser, RNG, sampler and cache state every N "
                        "epochs (0: never)")
    g.add_argument("--checkpoint-dir", default=None,
                   help="where checkpoints go (default OUT/checkpoint)")
    g.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint (same ranks, graph and "
                        "hyper-parameters; --epochs may grow)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --out (without it, or --resume, an "
                        "--out that holds a run is refused)")
    _add_sampler_args(p)
    _add_cache_args(p)


def _fanout(text: str) -> List[int]:
    try:
        return [int(k) for k in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"fan-outs are integers separated by commas, "
                                         f"e.g. 15,10,5 (got '{text}')")


def _add_cache_args(p: argparse.ArgumentParser) -> None:
    from pyg_dist.cache import CACHES
    from pyg_dist.cache.feature import POLICIES
    g = p.add_argument_group("halo caches")
    g.add_argument("--cache", choices=list(CACHES), default=None,
                   help="how fresh halo rows are: exact (default), pipeline "
                        "(PipeGCN/PSC: tau-stale, overlapped) or historical (SANCUS)")
    g.add_argument("--staleness", type=int, default=None,
                   help="pipeline: exchanges in flight, tau (default 1)")
    g.add_argument("--smooth-features", type=float, nargs="?", const=0.95, default=None,
                   metavar="GAMMA", help="pipeline: smooth stale features (PipeGCN-F)")
    g.add_argument("--smooth-grads", type=float, nargs="?", const=0.95, default=None,
                   metavar="GAMMA", help="pipeline: smooth stale gradients (PipeGCN-G)")
    g.add_argument("--bound", default=None,
                   help="historical: fixed:E | adaptive:A | gap:H (default adaptive:1)")
    g.add_argument("--feature-cache", choices=POLICIES, default=None,
                   help="keep input features of halo nodes (PSC-GCN: inclusion; "
                        "--loader neighbor: degree, the hottest remote rows)")
    g.add_argument("--feature-cache-capacity", default="25%",
                   help="rows, a share of halo rows (25%%) or a size (8MB)")
    g.add_argument("--no-background-sampling", action="store_true",
                   help="draw the plans of a pipelined cache in the training loop")


def _cache_args(args: argparse.Namespace):
    r"""``(cache, params)`` from the flags; the cache follows from its
    parameters when ``--cache`` is not given (``--staleness 2``: pipeline)."""
    pipeline = {k: getattr(args, k) for k in ("staleness", "smooth_features", "smooth_grads")
                if getattr(args, k) is not None}
    historical = {"bound": args.bound} if args.bound is not None else {}
    cache = args.cache or ("pipeline" if pipeline else "historical" if historical
                           else "exact")
    given = {"pipeline": pipeline, "historical": historical, "exact": {}}
    unused = [k for name, params in given.items() if name != cache for k in params]
    if unused:
        flags = ", ".join(f"--{u.replace('_', '-')}" for u in sorted(unused))
        raise SystemExit(f"pyg-dist train: error: {flags} do(es) not apply to "
                         f"--cache {cache}")
    return cache, given[cache]


def _add_sampler_args(p: argparse.ArgumentParser) -> None:
    r"""``--sampler`` and one flag per sampler hyper-parameter, generated
    from the registry (a new sampler needs no CLI change)."""
    from pyg_dist.sampler import SAMPLERS, sampler_params
    g = p.add_argument_group("halo sampling")
    g.add_argument("--sampler", choices=list(SAMPLERS), default="full",
                   help="which halo rows each training iteration fetches "
                        "(evaluation always uses all)")
    seen = {}
    for name in SAMPLERS:
        for param, default in sampler_params(name).items():
            seen.setdefault(param, (default, []))[1].append(name)
    for param, (default, users) in seen.items():
        g.add_argument(f"--{param.replace('_', '-')}", type=type(default), default=None,
                       help=f"{'/'.join(users)} (default {default})")
    g.add_argument("--precompute-layer0", action="store_true",
                   help="aggregate the raw features of layer 0 once (no layer-0 exchange)")
    g.add_argument("--overlap", action="store_true",
                   help="aggregate interior nodes while the halo rows travel (CM-GCN "
                        "asynchronous computation; exact)")


def _sampler_args(args: argparse.Namespace) -> dict:
    from pyg_dist.sampler import SAMPLERS, sampler_params
    given = {param: getattr(args, param) for name in SAMPLERS
             for param in sampler_params(name) if getattr(args, param) is not None}
    unused = set(given) - set(sampler_params(args.sampler))
    if unused:
        flags = ", ".join(f"--{u.replace('_', '-')}" for u in sorted(unused))
        raise SystemExit(f"pyg-dist train: error: {flags} do(es) not apply to "
                         f"--sampler {args.sampler}")
    return given


def _config(args: argparse.Namespace):
    from pyg_dist.train import TrainConfig
    cache, cache_args = _cache_args(args)
    return TrainConfig(model=args.model, num_layers=args.num_layers, hidden=args.hidden,
                       heads=args.heads, dropout=args.dropout, lr=args.lr,
                       weight_decay=args.weight_decay, epochs=args.epochs,
                       seed=args.seed, eval_every=args.eval_every,
                       progress=not args.no_progress, sampler=args.sampler,
                       sampler_args=_sampler_args(args),
                       precompute_layer0=args.precompute_layer0,
                       exchange_dtype=args.exchange_dtype, cache=cache,
                       cache_args=cache_args, feature_cache=args.feature_cache,
                       feature_cache_capacity=args.feature_cache_capacity,
                       background_sampling=not args.no_background_sampling,
                       loader=args.loader, overlap=args.overlap, fanout=args.fanout,
                       batch_size=args.batch_size, sampler_workers=args.sampler_workers,
                       adaptive_depth=not args.fixed_depth, inductive=args.inductive,
                       checkpoint_every=args.checkpoint_every,
                       checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                       overwrite=args.overwrite)


def run_training(root: str, config, out: Optional[str], nproc: Optional[int] = None,
                 timeout: float = DEFAULT_TIMEOUT) -> dict:
    r"""Trains under torchrun (environment present) or by spawning
    :obj:`nproc` local ranks (default: one per partition)."""
    from pyg_dist.train import train
    config.validate()
    return _run_ranks(train, (root, config, out), root, nproc, timeout)


def _run_ranks(fn, fn_args: tuple, root: str, nproc: Optional[int], timeout: float):
    r"""``fn(*fn_args)`` in every rank: in this process under torchrun
    (environment present) or for a single rank, else in :obj:`nproc` spawned
    local ranks (default: one per partition of :obj:`root`). Returns this
    rank's result (spawned: rank 0's)."""
    from pyg_dist.distributed import die_with_parent, rank_threads, spawn
    from pyg_dist.partition.book import read_meta
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        die_with_parent(os.getppid())  # the agent: a killed torchrun leaves no rank
        torch.set_num_threads(rank_threads(int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
        return _in_group(fn, fn_args, timeout)
    nproc = nproc or read_meta(root)["num_parts"]
    if nproc == 1:
        return _in_group(fn, fn_args, timeout)
    return spawn(fn, nproc, fn_args, timeout=timeout)[0]


def _in_group(fn, fn_args: tuple, timeout: float):
    r"""Runs in this process' group and tears it down before the
    interpreter exits (gloo's threads otherwise may abort the process)."""
    import torch.distributed as dist
    from pyg_dist.distributed import init, name_lost_ranks, stop_heartbeat, stop_on_sigterm
    stop_on_sigterm(leave_ctrl_c_to_launcher="LOCAL_WORLD_SIZE" in os.environ)  # torchrun
    init(timeout=timeout)
    try:
        return fn(*fn_args)
    except BaseException as e:
        named = name_lost_ranks(e)
        if named is e:
            raise
        raise named from e
    finally:
        stop_heartbeat()
        dist.destroy_process_group()


def _load_dataset(args: argparse.Namespace):
    from pyg_dist.datasets import load, load_default
    if args.dataset != "default":
        return load(args.dataset, args.data_dir)
    return load_default(args.data_dir, seed=args.data_seed,
                        **({"num_nodes": args.num_nodes} if args.num_nodes else {}))


def _add_dataset_args(p: argparse.ArgumentParser) -> None:
    from pyg_dist.datasets import DATASETS
    p.add_argument("--dataset", default="default", choices=DATASETS,
                   help="'default': the embedded synthetic community graph; the others "
                        "are read from --data-dir (see README, Datasets)")
    p.add_argument("--data-dir", default=None, help="dataset directory (default "
                   "$PYG_DIST_DATA or ~/.cache/pyg_dist)")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--num-nodes", type=_positive(int, "--num-nodes"), default=None,
                   help="size of the generated default graph")


def _check_writable_dir(command: str, flag: str, path: str) -> None:
    r"""Refuses, in one line, a directory argument that is a file or that
    cannot be created or written (before any work)."""
    if osp.exists(path) and not osp.isdir(path):
        raise SystemExit(f"pyg-dist {command}: error: {flag} '{path}' is a file, not a "
                         f"directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"pyg-dist {command}: error: cannot create {flag} '{path}': "
                         f"{e.strerror}")
    if not os.access(path, os.W_OK):
        raise SystemExit(f"pyg-dist {command}: error: {flag} '{path}' is not writable")


def cmd_partition(args: argparse.Namespace) -> None:
    from pyg_dist.partition import partition_graph
    if args.balance_batches and not args.num_batches:
        raise SystemExit("pyg-dist partition: error: --balance-batches needs --num-batches")
    _check_writable_dir("partition", "--root", args.root)
    data = _load_dataset(args)
    book = partition_graph(data, args.num_parts, method=args.method,
                           block_hops=args.block_hops,
                           objective=args.objective, root=args.root, seed=args.seed,
                           inductive=args.inductive, progress=True)
    print(book.summary())
    print(f"wrote {args.num_parts} partitions to {args.root}")
    if args.num_batches:
        _write_batches(data, args, book)


def _write_batches(data, args: argparse.Namespace, book) -> None:
    r"""CM-GCN's cohesive mini-batches of the training nodes, saved next to
    the partitions for ``pyg-dist train --loader cohesive``."""
    import torch
    from pyg_dist.loader import CostModel, HopGraph, cohesive_batches, random_batches
    from pyg_dist.loader import save_batches
    nodes = data.train_mask.nonzero().view(-1)
    num_classes = int(data.y.max()) + 1
    cost = CostModel(dims=[data.num_features] + [64] * (args.batch_layers - 1)
                     + [num_classes])
    graph = HopGraph(data.edge_index, data.num_nodes, cost)
    assignment = cohesive_batches(graph, data.edge_index, nodes, args.num_batches,
                                  seed=args.seed)
    batch_of = torch.full((data.num_nodes, ), -1, dtype=torch.long)
    batch_of[nodes] = assignment
    path = save_batches(args.root, batch_of)
    j = graph.partition_cost(assignment, nodes)
    rand = random_batches(nodes.numel(), args.num_batches, args.seed)
    j_random = graph.partition_cost(rand, nodes)
    print(f"wrote {args.num_batches} cohesive batches to {path}: J(P) = {j:.4g}, "
          f"{100 * (1 - j / j_random):.1f}% below random batches")
    from pyg_dist.loader.cohesive.cost import imbalance, rank_costs
    part_of = book.owner(book.inv_perm)  # original id -> part
    worst = [max(imbalance(rank_costs(graph, nodes[a == b], part_of, args.num_parts))
                 for b in range(args.num_batches)) for a in (assignment, rand)]
    print(f"per-rank cost of a batch: at most {worst[0]:.2f}x the mean over ranks "
          f"(random batches: {worst[1]:.2f}x)")
    if args.balance_batches:
        from pyg_dist.loader.cohesive.balance import save_batch_parts
        loads = save_batch_parts(args.root, data, graph, batch_of, part_of, args.num_parts,
                                 book.meta["graph_hash"])
        print(f"balanced batch parts: per-rank cost of a batch at most "
              f"{max(imbalance(load) for load in loads):.2f}x the mean over ranks")


def cmd_info(args: argparse.Namespace) -> None:
    from pyg_dist.partition import PartitionBook
    book = PartitionBook.load(args.root)
    m = book.meta
    print(f"{args.root}: {m['num_nodes']:,} nodes, {m['num_edges']:,} edges, "
          f"{m['num_features']} features, {m['num_classes']} classes, "
          f"{m['num_parts']} parts, graph {m['graph_hash']}")
    print(book.summary())


def _positive(kind, name: str):
    r"""An argparse type: a number of :obj:`kind` that is finite and > 0."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be a finite number > 0 "
                                             f"(got '{text}')")
        return value
    return parse


def cmd_train(args: argparse.Namespace) -> None:
    summary = run_training(args.root, _config(args), args.out, args.nproc, args.timeout)
    if int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=1))
        if args.out and not args.no_plots:
            from pyg_dist.plots import plot_run
            print(f"plots: {', '.join(plot_run(args.out))}")


def cmd_plot(args: argparse.Namespace) -> None:
    from pyg_dist.plots import plot_run
    print("\n".join(plot_run(args.out)))


def cmd_predict(args: argparse.Namespace) -> None:
    from pyg_dist.inference import predict
    from pyg_dist.train import load_model
    model = load_model(args.model_dir)
    _run_ranks(functools.partial(predict, progress=True), (model, args.root, args.out),
               args.root, None, args.timeout)
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"wrote per-rank predictions (n_id, pred) to {args.out}/pred_*.pt")


def cmd_demo(args: argparse.Namespace) -> None:
    from pyg_dist.demo import demo
    demo(args.workdir, nproc=args.nproc, epochs=args.epochs, num_nodes=args.num_nodes)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="pyg-dist", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("partition", help="partition a dataset into per-rank files")
    _add_dataset_args(p)
    p.add_argument("--num-parts", type=_positive(int, "--num-parts"), required=True)
    p.add_argument("--method", default="metis", choices=["metis", "random", "block"])
    p.add_argument("--block-hops", type=int, default=2,
                   help="--method block: hops of the neighbourhood blocks (ByteGNN)")
    p.add_argument("--objective", default="vol", choices=["vol", "cut"])
    p.add_argument("--root", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inductive", action="store_true",
                   help="also write the parts of the train nodes' subgraph "
                        "(for train --inductive)")
    p.add_argument("--num-batches", type=int, default=0,
                   help="also split the training nodes into this many CM-GCN cohesive "
                        "mini-batches (for train --loader cohesive)")
    p.add_argument("--balance-batches", action="store_true",
                   help="also split each batch's computational graph over the ranks by "
                        "cost (CM-GCN balanced workloads; copies input features)")
    p.add_argument("--batch-layers", type=int, default=3,
                   help="model depth K the batches' cost model assumes")
    p.set_defaults(fn=cmd_partition)

    p = sub.add_parser("info", help="show the statistics of a partition directory")
    p.add_argument("root")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("train", help="full-graph partition-parallel training")
    p.add_argument("--root", required=True, help="partition directory")
    p.add_argument("--out", default=None, help="results folder: metrics.jsonl, "
                   "summary.json, the model, PNG plots and checkpoints")
    p.add_argument("--no-plots", action="store_true", help="no PNG plots in --out")
    _add_train_args(p)
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("plot", help="(re)draw the PNG plots of a results folder")
    p.add_argument("out", help="the --out folder of a training run")
    p.set_defaults(fn=cmd_plot)

    p = sub.add_parser("predict", help="distributed full-graph inference of a trained model")
    p.add_argument("--root", required=True, help="partition directory")
    p.add_argument("--model-dir", required=True, help="the --out directory of a training run")
    p.add_argument("--out", required=True, help="directory for pred_{rank}.pt")
    p.add_argument("--timeout", type=_positive(float, "--timeout"), default=DEFAULT_TIMEOUT)
    p.set_defaults(fn=cmd_predict)

    p = sub.add_parser("demo", help="partition the default graph, train with 4 ranks "
                                    "and compare with single-process PyG")
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--nproc", type=_positive(int, "--nproc"), default=4)
    p.add_argument("--epochs", type=_positive(int, "--epochs"), default=30)
    p.add_argument("--num-nodes", type=_positive(int, "--num-nodes"), default=None)
    p.set_defaults(fn=cmd_demo)

    args = parser.parse_args(argv)
    try:
        args.fn(args)
    except (ValueError, RuntimeError, FileNotFoundError, NotImplementedError) as e:
        print(f"pyg-dist {args.command}: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
