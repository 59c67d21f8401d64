"""``pyg-dist``: partition, inspect and train from the command line."""
import argparse
import json
import math
import os
import os.path as osp
import re
import sys
import tempfile
import warnings
from typing import List, Optional

from pyg_dist.distributed import DEFAULT_TIMEOUT, SpawnError


def _add_train_args(p: argparse.ArgumentParser) -> None:
    from pyg_dist.comm import EXCHANGES
    from pyg_dist.comm.compress import CODECS
    from pyg_dist.config import MODELS, TrainConfig
    from pyg_dist.utils.allocator import MALLOC_MODES
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
    p.add_argument("--eval-every", type=int, default=d.eval_every,
                   help="evaluate every N epochs and after the last (0: never, e.g. for a "
                        "graph whose whole-graph inference exceeds the machine)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    p.add_argument("--nproc", type=_positive(int, "--nproc"), default=None,
                   help="spawn this many local ranks (default: one per partition; "
                        "ignored under torchrun)")
    p.add_argument("--timeout", type=_positive(float, "--timeout"), default=DEFAULT_TIMEOUT,
                   help="seconds a rank waits for a peer before failing")
    p.add_argument("--malloc", choices=list(MALLOC_MODES), default=d.malloc,
                   help="the ranks' allocator. reuse (default): glibc keeps what a step "
                        "frees for the next (no page faults for it); system: glibc and "
                        "torch as they are; compact: resident memory follows live memory "
                        "(chunks from 256 KiB mapped alone, huge pages from 2 MiB), for "
                        "page faults every step (docs/cli.md, Memory)")
    p.add_argument("--exchange-dtype", choices=list(CODECS), default=d.exchange_dtype,
                   help="how halo rows and gradients travel (int8: per-row scale)")
    p.add_argument("--exchange", choices=list(EXCHANGES), default=d.exchange,
                   help="halo: each rank sends its peers the rows they need (default); "
                        "broadcast: every rank's whole block goes to every rank (CAGNET "
                        "1-D; with --cache historical, SANCUS's skip-broadcast; full "
                        "loader and sampler only); sequential: one peer's rows at a time, "
                        "re-fetched in the backward pass (SAR: memory per rank falls with "
                        "the ranks; full loader, exact cache)")
    p.add_argument("--memory-budget", type=size_in_bytes, default=None, metavar="SIZE",
                   help="with --exchange sequential: the halo rows layers may receive at "
                        "once, in bytes (K, M, G: KiB, MiB, GiB); a layer whose rows fit "
                        "in what is left receives its whole halo at once (faster), the "
                        "others one peer's rows at a time (summary.json: "
                        "layer_aggregation)")
    p.add_argument("--clip-grad", type=_positive(float, "--clip-grad"), default=None,
                   metavar="TH", help="clip each rank's local gradient to norm sqrt(P)*TH "
                                      "before the all-reduce (SANCUS)")
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
    _add_component_args(p)


def _components():
    r"""``(kind, flag, registry, options of a name, default)`` of the three
    registered components whose flags the CLI builds."""
    from pyg_dist.cache import CACHES, cache_options
    from pyg_dist.loader import LOADERS, loader_options
    from pyg_dist.sampler import SAMPLERS, sampler_options
    return (("sampler", SAMPLERS, sampler_options, "full"),
            ("cache", CACHES, cache_options, None),
            ("loader", LOADERS, loader_options, "full"))


HELP = {
    "sampler": "which halo rows each training iteration fetches (evaluation always "
               "uses all)",
    "cache": "how fresh halo rows are: exact (default), pipeline (PipeGCN/PSC: tau-stale, "
             "overlapped) or historical (SANCUS); given a cache's flags, that cache",
    "loader": "full-graph epochs, CM-GCN cohesive mini-batches (needs partition "
              "--num-batches) or DistDGL neighbour-sampled mini-batches",
}


def _add_component_args(p: argparse.ArgumentParser) -> None:
    r"""``--sampler``, ``--cache``, ``--loader`` and one flag per option of
    every registered sampler, cache and loader (a new one needs no CLI
    change), plus the layer options and the feature cache."""
    from pyg_dist.cache.feature import POLICIES
    for kind, registry, options_of, default in _components():
        g = p.add_argument_group(f"{kind}s")
        g.add_argument(f"--{kind}", choices=list(registry), default=default, help=HELP[kind])
        seen: dict = {}
        for name in registry:
            for option in options_of(name):
                seen.setdefault(option.flags, (option, []))[1].append(name)
        for flags, (option, users) in seen.items():
            default_text = ",".join(map(str, option.default)) if isinstance(
                option.default, list) else option.default
            text = (f"{'/'.join(users)}" + (f": {option.help}" if option.help else "")
                    + ("" if option.switch is not None else f" (default {default_text})"))
            dest = f"{kind}.{option.name}"
            if option.switch is not None:
                g.add_argument(*flags, dest=dest, action="store_const", const=option.switch,
                               default=None, help=text)
            else:
                g.add_argument(*flags, dest=dest, type=_parsed(option.type), default=None,
                               help=text, metavar=option.name.upper(), **({"nargs": "?", "const": option.const}
                                             if option.const is not None else {}))
    g = p.add_argument_group("layers")
    g.add_argument("--precompute-layer0", action="store_true",
                   help="aggregate the raw features of layer 0 once (no layer-0 exchange)")
    g.add_argument("--overlap", nargs="?", const="layers", default=None,
                   choices=["layers", "nodes"],
                   help="CM-GCN asynchronous computation (exact): 'layers' (the default "
                        "of a bare --overlap) aggregates each layer's interior nodes while "
                        "its halo rows travel; 'nodes' computes every node of every layer "
                        "as soon as its inputs arrived, forward and backward (gcn, sage, "
                        "gin; exact cache)")
    g.add_argument("--feature-cache", choices=POLICIES, default=None,
                   help="keep input features of halo nodes (PSC-GCN: inclusion; "
                        "--loader neighbor: degree, the hottest remote rows)")
    g.add_argument("--feature-cache-capacity", default=None,
                   help="--feature-cache: rows, a share of halo rows (default 25%%) or a "
                        "size (8MB)")


def _parsed(parse):
    r"""An argparse type from :obj:`parse`, its error message kept."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _component_args(args: argparse.Namespace, argv: List[str]) -> dict:
    r"""The chosen sampler, cache and loader with their parameters from
    the flags; a flag the chosen one does not take is refused. The cache
    follows from its flags when ``--cache`` is not given (``--staleness 2``:
    pipeline). Deprecated flags warn."""
    out = {}
    for kind, registry, options_of, default in _components():
        given = {}  # name -> {param: value} of every component whose flags were given
        for name in registry:
            for option in options_of(name):
                value = getattr(args, f"{kind}.{option.name}")
                if value is not None:
                    given.setdefault(name, {})[option.name] = value
                for old in option.deprecated:
                    if any(a == old or a.startswith(old + "=") for a in argv):
                        warnings.warn(f"pyg_dist: {old} is deprecated; use {option.flags[0]}",
                                      DeprecationWarning, stacklevel=2)
        chosen = getattr(args, kind) or (next(iter(given)) if len(given) == 1
                                         else next(iter(registry)))
        takes = {o.name for o in options_of(chosen)}
        unused = sorted({o.flags[0] for name, values in given.items()
                         for o in options_of(name) if o.name in values} -
                        {o.flags[0] for o in options_of(chosen)})
        if unused:
            raise SystemExit(f"pyg-dist train: error: {', '.join(unused)} do(es) not apply "
                             f"to --{kind} {chosen}")
        out[kind] = chosen
        out[f"{kind}_args"] = {k: v for k, v in given.get(chosen, {}).items() if k in takes}
    return out


def _config(args: argparse.Namespace, argv: List[str]):
    from pyg_dist.config import TrainConfig
    if args.feature_cache_capacity is not None and args.feature_cache is None:
        raise SystemExit("pyg-dist train: error: --feature-cache-capacity sizes a feature "
                         "cache: give --feature-cache too")
    return TrainConfig(model=args.model, num_layers=args.num_layers, hidden=args.hidden,
                       heads=args.heads, dropout=args.dropout, lr=args.lr,
                       weight_decay=args.weight_decay, epochs=args.epochs,
                       seed=args.seed, eval_every=args.eval_every,
                       progress=not args.no_progress,
                       **_component_args(args, argv),
                       precompute_layer0=args.precompute_layer0,
                       exchange_dtype=args.exchange_dtype, malloc=args.malloc,
                       exchange=args.exchange, clip_grad=args.clip_grad,
                       memory_budget=args.memory_budget,
                       feature_cache=args.feature_cache,
                       feature_cache_capacity=(args.feature_cache_capacity
                                               or TrainConfig.feature_cache_capacity),
                       overlap={None: False, "layers": True}.get(args.overlap, args.overlap),
                       inductive=args.inductive,
                       checkpoint_every=args.checkpoint_every,
                       checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                       overwrite=args.overwrite)


def _load_dataset(args: argparse.Namespace):
    from pyg_dist.datasets import GENERATED, load
    if args.dataset not in GENERATED:
        return load(args.dataset, args.data_dir)
    if args.num_nodes and args.dataset == "rmat":
        raise SystemExit("pyg-dist partition: error: --num-nodes does not apply to rmat "
                         "(it has 2**scale nodes)")
    return load(args.dataset, args.data_dir, seed=args.data_seed,
                **({"num_nodes": args.num_nodes} if args.num_nodes else {}))


def _add_dataset_args(p: argparse.ArgumentParser) -> None:
    from pyg_dist.datasets import DATASETS
    p.add_argument("--dataset", default="default", choices=DATASETS,
                   help="'default': the embedded synthetic community graph; 'rmat', "
                        "'reddit-shaped': generated graphs in the papers' regime; the "
                        "others are read from --data-dir (see docs/data.md)")
    p.add_argument("--data-dir", default=None, help="dataset directory (default "
                   "$PYG_DIST_DATA or ~/.cache/pyg_dist)")
    p.add_argument("--data-seed", type=int, default=None,
                   help="seed of the generated default, rmat or reddit-shaped graph "
                        "(default 0)")
    p.add_argument("--num-nodes", type=_positive(int, "--num-nodes"), default=None,
                   help="size of the generated default or reddit-shaped graph")


def _check_writable_dir(command: str, flag: str, path: str) -> None:
    r"""Refuses, in one line, a directory argument that is a file or that
    cannot be created or written (before any work); creates it."""
    from pyg_dist.preflight import writable_dir
    problem = writable_dir(flag, path)
    if problem is None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:  # what permissions do not tell: a full or read-only disk
            problem = f"cannot create {flag} '{path}': {e.strerror}"
    if problem is not None:
        raise SystemExit(f"pyg-dist {command}: error: {problem}")


def _partition_folder(args: argparse.Namespace) -> None:
    r"""``partition --from DIR``: the out-of-core path, for graph folders
    and OGB's binary raw layout."""
    from pyg_dist.datasets.ogb_disk import is_ogb_raw, ogb_to_graph_dir
    from pyg_dist.partition.from_disk import PARTITIONER_DEGREE, partition_folder
    _check_writable_dir("partition", "--root", args.root)
    folder = args.from_dir
    if is_ogb_raw(folder):
        converted = osp.join(folder, "pyg_dist_graph")
        if not osp.exists(osp.join(converted, "graph.json")):
            ogb_to_graph_dir(folder, converted, progress=True)
        folder = converted
    degree = PARTITIONER_DEGREE if args.partitioner_degree is None else args.partitioner_degree
    book = partition_folder(folder, args.num_parts, args.root, args.method or "kaminpar",
                            args.objective or "vol", seed=args.seed or 0, progress=True,
                            num_classes=args.num_classes, partitioner_degree=degree or None,
                            balance=args.balance)
    print(book.summary())
    print(f"wrote {args.num_parts} partitions to {args.root}")


def _check_partition_flags(args: argparse.Namespace) -> None:
    r"""Refuses, in one line and before any work, a flag that another
    makes meaningless (it would be ignored): every such flag is refused,
    not ignored. The flags whose defaults are ``None`` are those given."""
    from pyg_dist.datasets import GENERATED
    if args.from_dir is not None:
        given = [flag for flag, on in (("--dataset", args.dataset != "default"),
                                       ("--data-dir", args.data_dir is not None),
                                       ("--data-seed", args.data_seed is not None),
                                       ("--num-nodes", args.num_nodes is not None),
                                       ("--inductive", args.inductive),
                                       ("--num-batches", args.num_batches is not None)) if on]
        if given:
            raise SystemExit(f"pyg-dist partition: error: {given[0]} does not apply to --from "
                             f"(the graph comes from the folder; batches and inductive parts "
                             f"need it in memory)")
        if args.method == "block":
            raise SystemExit("pyg-dist partition: error: --method block needs the graph in "
                             "memory; with --from use kaminpar, metis or random")
    elif args.dataset not in GENERATED:
        for flag, on in (("--data-seed", args.data_seed is not None),
                         ("--num-nodes", args.num_nodes is not None)):
            if on:
                raise SystemExit(f"pyg-dist partition: error: {flag} does not apply to "
                                 f"--dataset {args.dataset} (it is read from disk; {flag} "
                                 f"is for the generated {', '.join(GENERATED)})")
    method = args.method or ("kaminpar" if args.from_dir is not None else "metis")
    for flag, on, why in (
            ("--objective", args.objective is not None and method != "metis",
             f"does not apply to --method {method} (only --method metis takes one)"),
            ("--balance", args.balance is not None and method in ("random", "block"),
             f"does not apply to --method {method} (it balances what METIS and KaMinPar "
             f"partition)"),
            ("--block-hops", args.block_hops is not None and method != "block",
             f"does not apply to --method {method} (it sizes --method block's blocks)"),
            ("--partitioner-degree", args.partitioner_degree is not None
             and args.from_dir is None, "needs --from (it bounds KaMinPar's input there)"),
            ("--partitioner-degree", args.partitioner_degree is not None
             and method != "kaminpar", f"does not apply to --method {method} (it bounds "
                                       f"KaMinPar's input)"),
            ("--seed", args.seed is not None and method == "block" and not args.num_batches,
             "does not apply to --method block without --num-batches (blocks are not "
             "drawn at random)"),
            ("--batch-layers", args.batch_layers is not None and not args.num_batches,
             "needs --num-batches"),
            ("--balance-batches", args.balance_batches and not args.num_batches,
             "needs --num-batches"),
            ("--cost-constants", args.cost_constants is not None and not args.num_batches,
             "needs --num-batches"),
            ("--batch-hidden/--hidden", args.batch_hidden is not None and not args.num_batches,
             "needs --num-batches"),
            ("--batch-model/--model", args.batch_model is not None and not args.num_batches,
             "needs --num-batches"),
            ("--balance-rule", args.balance_rule is not None and not args.balance_batches,
             "needs --balance-batches")):
        if on:
            raise SystemExit(f"pyg-dist partition: error: {flag} {why}")


def _check_batch_count(data, args: argparse.Namespace) -> None:
    r"""Refuses, before partitioning, a ``--num-batches`` outside what
    :func:`~pyg_dist.loader.cohesive.prepare.write_batches` takes: at most
    one batch per training node."""
    train = getattr(data, "train_mask", None)
    count = 0 if train is None else int(train.sum())
    if args.num_batches > count:
        raise SystemExit(f"pyg-dist partition: error: --num-batches {args.num_batches} "
                         f"exceeds the graph's {count:,} training nodes (each batch needs "
                         f"one)")


def cmd_partition(args: argparse.Namespace) -> None:
    from pyg_dist.partition.staging import Interrupted, NoSpaceError, signals_interrupt
    _check_partition_flags(args)
    if args.cost_constants is not None:  # a bad file is refused before any work
        from pyg_dist.loader import CostModel
        args.cost = CostModel.load(args.cost_constants)
    created = not osp.exists(args.root)
    try:
        with signals_interrupt():
            if args.from_dir is not None:
                _partition_folder(args)
            else:
                _partition_in_memory(args)
    except BaseException as e:
        if created and osp.isdir(args.root) and not os.listdir(args.root):
            os.rmdir(args.root)  # a root this run created and left empty goes too
        if isinstance(e, Interrupted):
            done = (f"the new partition in '{e.after_swap}' was complete" if e.after_swap
                    else f"nothing was written; '{args.root}' is left as it was")
            print(f"pyg-dist partition: interrupted ({e}): {done}", file=sys.stderr)
            sys.exit(128 + e.signum)
        if isinstance(e, NoSpaceError):
            raise SystemExit(f"pyg-dist partition: error: {e}") from None
        raise


def _partition_in_memory(args: argparse.Namespace) -> None:
    r"""``partition`` of a dataset loaded in memory, with its cohesive
    batches: all written beside the partition already in ``--root`` and
    swapped in together once complete."""
    from pyg_dist.partition import partition_graph
    from pyg_dist.partition.staging import staged
    _check_writable_dir("partition", "--root", args.root)
    if args.data_seed is None:
        args.data_seed = 0
    data = _load_dataset(args)
    if args.num_batches:
        _check_batch_count(data, args)
    with staged(args.root) as stage:
        book = partition_graph(data, args.num_parts, method=args.method or "metis",
                               block_hops=2 if args.block_hops is None else args.block_hops,
                               objective=args.objective or "vol", root=stage,
                               seed=args.seed or 0, inductive=args.inductive, progress=True,
                               num_classes=args.num_classes, balance=args.balance)
        reported = _write_batches(data, args, book, stage) if args.num_batches else None
    print(book.summary())
    print(f"wrote {args.num_parts} partitions to {args.root}")
    if reported:
        print(reported)


def _write_batches(data, args: argparse.Namespace, book, stage: str) -> str:
    r"""CM-GCN's cohesive mini-batches of the training nodes, saved next to
    the partitions (staged in :obj:`stage`) for ``pyg-dist train --loader
    cohesive``; returns the report to print once they are in ``--root``."""
    from pyg_dist.config import TrainConfig
    from pyg_dist.distributed import rank_threads
    from pyg_dist.loader import CostModel
    from pyg_dist.loader.cohesive.prepare import write_batches
    d = TrainConfig()
    report = write_batches(data, stage, book, args.num_batches, args.batch_layers or 3,
                           hidden=args.batch_hidden or d.hidden, seed=args.seed or 0,
                           balance=args.balance_batches, cost=getattr(args, "cost", None),
                           model=args.batch_model or d.model,
                           balance_rule=args.balance_rule or "owner",
                           threads=rank_threads(args.num_parts))
    cost = CostModel.from_dict(report["cost"])
    path = osp.join(args.root, osp.relpath(report["path"], stage))
    lines = [f"cost model{' from ' + args.cost_constants if args.cost_constants else ''}: "
             f"{cost.describe()}",
             f"wrote {args.num_batches} cohesive batches to {path}: "
             f"J(P) = {report['j']:.4g} s modelled, "
             f"{100 * (1 - report['j'] / report['j_random']):.1f}% below random batches",
             f"per-rank cost of a batch: at most {report['imbalance']:.2f}x the mean over "
             f"ranks (random batches: {report['imbalance_random']:.2f}x)"]
    if args.balance_batches:
        lines.append(f"balanced batch parts ({report['balance_rule']} rule): per-rank cost "
                     f"of a batch at most {report['imbalance_balanced']:.2f}x the mean over "
                     f"ranks")
    return "\n".join(lines)


def cmd_rmat(args: argparse.Namespace) -> None:
    from pyg_dist.datasets.rmat_disk import write_rmat
    from pyg_dist.partition.staging import Interrupted, signals_interrupt
    from pyg_dist.preflight import writable_dir
    # Before any work: a file, a folder that holds anything (a graph or not)
    # or one that cannot be created or written.
    problem = writable_dir("--out", args.out)
    if problem is None and osp.isdir(args.out) and os.listdir(args.out):
        problem = (f"--out '{args.out}' is not empty: write the graph into a new or an "
                   f"empty folder")
    if problem is not None:
        raise SystemExit(f"pyg-dist rmat: error: {problem}")
    try:
        with signals_interrupt():  # a signal removes the files written (write_rmat)
            info = write_rmat(args.out, args.scale, edge_factor=args.edge_factor,
                              num_features=args.num_features, num_classes=args.num_classes,
                              seed=args.seed, progress=True)
    except Interrupted as e:
        print(f"pyg-dist rmat: interrupted ({e}): the files written to '{args.out}' were "
              f"removed", file=sys.stderr)
        sys.exit(128 + e.signum)
    except OSError as e:  # a full or read-only disk; the files written are removed
        raise SystemExit(f"pyg-dist rmat: error: {e.strerror or e}"
                         + (f": '{e.filename}'" if e.filename else "")) from None
    print(f"wrote {info['num_nodes']:,} nodes, {info['num_edges']:,} edges and "
          f"{info['num_features']} features to {args.out} (pyg-dist partition --from "
          f"{args.out})")


def cmd_calibrate(args: argparse.Namespace) -> None:
    import torch
    from pyg_dist.loader import CostModel
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise SystemExit(f"pyg-dist calibrate: error: --device '{args.device}' is not a "
                         f"device (cpu, cuda, cuda:N)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pyg-dist calibrate: error: --device cuda: no CUDA device here")
    _check_writable_dir("calibrate", "--out's folder", osp.dirname(osp.abspath(args.out)))
    if osp.isdir(args.out):
        raise SystemExit(f"pyg-dist calibrate: error: --out '{args.out}' is a directory")
    dims = [args.in_channels] + [args.hidden] * (args.layers - 1) + [args.classes]
    cost = CostModel.calibrate(dims, model=args.model, threads=args.threads,
                               device=device, degree=args.degree)
    cost.save(args.out)
    print(f"cost model: {cost.describe()}")
    print(f"wrote {args.out} (for pyg-dist partition --num-batches M --cost-constants "
          f"{args.out})")


def cmd_info(args: argparse.Namespace) -> None:
    from pyg_dist.partition import PartitionBook
    book = PartitionBook.load(args.root)
    m = book.meta
    print(f"{args.root}: {m['num_nodes']:,} nodes, {m['num_edges']:,} edges, "
          f"{m['num_features']} features, {m['num_classes']} classes, "
          f"{m['num_parts']} parts, graph {m['graph_hash']}")
    print(book.summary())


def _balance_names(text: str) -> tuple:
    r"""``--balance``: the quantities named (``none``: the nodes only)."""
    from pyg_dist.partition.balance import check_balance
    return () if text == "none" else check_balance(n for n in text.split(",") if n)


_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def size_in_bytes(text: str) -> int:
    r"""An argparse type: a size in bytes, ``"1500000"``, ``"512M"`` or
    ``"1.5G"`` (binary units; a trailing ``B`` or ``iB`` is allowed)."""
    core = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = core[-1:] if core[-1:] in _UNITS and core[-1:] else ""
    try:
        value = float(core[:len(core) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"a size in bytes, 0 or more, e.g. 512M or 1.5G "
                                         f"(got '{text}')")
    return int(value)


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


def _at_least(kind, low, name: str):
    r"""An argparse type: a number of :obj:`kind` that is finite and
    >= :obj:`low`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < low:
            what = "a finite number " if kind is float else ""
            raise argparse.ArgumentTypeError(f"{name} must be {what}>= {low} (got '{text}')")
        return value
    return parse


def _restart_with_rank_environment(args: argparse.Namespace) -> None:
    r"""Where this process trains (under torchrun, or one rank), glibc must
    read the allocator mode's environment at start-up
    (:func:`~pyg_dist.utils.allocator.rank_environment`): the command runs
    again with it, in this process (``execve``: the same pid, which
    torchrun goes on watching). Only for the program itself (``main()``
    reading ``sys.argv``), never for a caller's process."""
    from pyg_dist.launch import runs_here
    from pyg_dist.utils.allocator import rank_environment
    needed = rank_environment(args.malloc)
    argv = getattr(sys, "orig_argv", None)  # Python 3.10+: the interpreter's own
    if not needed or not args.own_process or not argv:
        return
    try:
        here = runs_here(args.root, args.nproc)
    except Exception:  # noqa: BLE001  an unreadable partition: preflight reports it
        here = False
    if here:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, argv, {**os.environ, **needed})


def cmd_train(args: argparse.Namespace) -> None:
    from pyg_dist.launch import run_training
    _restart_with_rank_environment(args)
    summary = run_training(args.root, _config(args, args.argv), args.out, args.nproc,
                           args.timeout)
    if int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=1))
        if args.out and not args.no_plots:
            from pyg_dist.plots import plot_run
            print(f"plots: {', '.join(plot_run(args.out))}")


def cmd_plot(args: argparse.Namespace) -> None:
    from pyg_dist.plots import plot_run
    print("\n".join(plot_run(args.out)))


def cmd_predict(args: argparse.Namespace) -> None:
    from pyg_dist.launch import run_prediction
    run_prediction(args.root, args.model_dir, args.out, args.overwrite, args.timeout)
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"wrote per-rank predictions (n_id, pred) to {args.out}/pred_*.pt, listed "
              f"with their checksums in {args.out}/predictions.json")


def cmd_demo(args: argparse.Namespace) -> None:
    from pyg_dist.demo import demo
    demo(args.workdir, nproc=args.nproc, epochs=args.epochs, num_nodes=args.num_nodes)


def _negative_values_attached(argv: List[str]) -> List[str]:
    r""":obj:`argv` with a value that starts with a minus sign joined to its
    flag (``--fanout -1,-1,-1`` → ``--fanout=-1,-1,-1``): argparse reads only
    plain negative numbers as values and takes the others for flags."""
    out: List[str] = []
    for arg in argv:
        if (out and re.fullmatch(r"-\d[\d.,e+-]*", arg) and out[-1].startswith("--")
                and "=" not in out[-1]):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Optional[List[str]] = None) -> None:
    from pyg_dist.partition.from_disk import PARTITIONER_DEGREE
    parser = argparse.ArgumentParser(prog="pyg-dist", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("partition", help="partition a dataset into per-rank files")
    _add_dataset_args(p)
    p.add_argument("--num-parts", type=_positive(int, "--num-parts"), required=True)
    p.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                   help="partition the graph folder DIR out of core (src.npy, dst.npy, x.npy, "
                        "y.npy, *_mask.npy; or OGB's binary raw layout, converted once into "
                        "DIR/pyg_dist_graph) instead of a --dataset loaded in memory")
    p.add_argument("--method", default=None, choices=["metis", "kaminpar", "random", "block"],
                   help="default: kaminpar with --from, metis otherwise")
    p.add_argument("--partitioner-degree", type=_at_least(float, 0, "--partitioner-degree"),
                   default=None, metavar="D",
                   help=f"--from with kaminpar: above D neighbours per node on average "
                        f"(default {PARTITIONER_DEGREE:g}), KaMinPar partitions a sample of "
                        f"the edges (bounding its memory) and the result is refined on "
                        f"every edge; 0: no sample")
    p.add_argument("--block-hops", type=_at_least(int, 0, "--block-hops"), default=None,
                   help="--method block: hops of the neighbourhood blocks (ByteGNN; "
                        "default 2)")
    p.add_argument("--balance", type=_parsed(_balance_names), default=None, metavar="LIST",
                   help="besides its nodes, what each part holds at most 3%% above the mean "
                        "of: a comma list of edges (its in-edges, the edges its rank "
                        "aggregates), train_mask, val_mask, test_mask; or none (default: "
                        "edges and the graph's masks; METIS and KaMinPar)")
    p.add_argument("--objective", default=None, choices=["vol", "cut"],
                   help="--method metis: what METIS minimises, the communication volume "
                        "(default) or the edge cut")
    p.add_argument("--root", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the partitioner and of the batches (default 0)")
    p.add_argument("--inductive", action="store_true",
                   help="also write the parts of the train nodes' subgraph "
                        "(for train --inductive)")
    p.add_argument("--num-classes", type=_positive(int, "--num-classes"), default=None,
                   help="the classes the labels' ids range over (default: the largest "
                        "label + 1, or a graph folder's graph.json; refused where most "
                        "ids below it have no labelled node)")
    p.add_argument("--num-batches", type=_at_least(int, 1, "--num-batches"), default=None,
                   help="also split the training nodes into this many CM-GCN cohesive "
                        "mini-batches (for train --loader cohesive; at most one per "
                        "training node)")
    p.add_argument("--balance-batches", action="store_true",
                   help="also split each batch's computational graph over the ranks by "
                        "cost (CM-GCN balanced workloads; copies input features)")
    p.add_argument("--batch-layers", type=_at_least(int, 1, "--batch-layers"), default=None,
                   help="model depth K the batches' cost model assumes (default 3)")
    from pyg_dist.config import MODELS, TrainConfig
    from pyg_dist.loader.cohesive.balance import BALANCE_RULES
    d = TrainConfig()
    p.add_argument("--batch-hidden", "--hidden", type=_positive(int, "--batch-hidden"),
                   default=None,
                   help=f"hidden width of the model the batches' cost model is measured "
                        f"for (default {d.hidden}, train's --hidden)")
    p.add_argument("--batch-model", "--model", choices=sorted(MODELS), default=None,
                   help=f"model kind the cost model is measured for (its aggregation "
                        f"and weight matrices; default {d.model}, train's --model)")
    p.add_argument("--cost-constants", default=None, metavar="FILE",
                   help="the cost model's constants from FILE (pyg-dist calibrate --out, "
                        "e.g. run on the machine that will train) instead of measuring "
                        "them here")
    p.add_argument("--balance-rule", choices=BALANCE_RULES, default=None,
                   help="--balance-batches: owner (default: nodes start on their owner, "
                        "overloaded ranks hand off their outermost nodes) or greedy "
                        "(CM-GCN: every node in BFS order to the least loaded rank)")
    p.set_defaults(fn=cmd_partition)

    p = sub.add_parser("rmat", help="write an R-MAT graph (Graph500) of 2**scale nodes to a "
                                    "graph folder, out of core (for partition --from)")
    p.add_argument("--scale", type=_positive(int, "--scale"), required=True)
    p.add_argument("--out", required=True, help="graph folder to create")
    p.add_argument("--edge-factor", type=_positive(int, "--edge-factor"), default=16)
    p.add_argument("--num-features", type=_positive(int, "--num-features"), default=128)
    p.add_argument("--num-classes", type=_positive(int, "--num-classes"), default=16)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_rmat)

    p = sub.add_parser("calibrate", help="measure CM-GCN's cost constants on this machine "
                                         "(for partition --cost-constants)")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--model", choices=sorted(MODELS), default=d.model)
    p.add_argument("--layers", type=_positive(int, "--layers"), default=d.num_layers)
    p.add_argument("--hidden", type=_positive(int, "--hidden"), default=d.hidden)
    p.add_argument("--in-channels", type=_positive(int, "--in-channels"), default=64,
                   help="input feature width (default 64: the default graph's)")
    p.add_argument("--classes", type=_positive(int, "--classes"), default=10,
                   help="output width (default 10: the default graph's)")
    p.add_argument("--degree", type=_positive(float, "--degree"), default=10.0,
                   help="mean in-degree of the timed aggregation")
    p.add_argument("--threads", type=_positive(int, "--threads"), default=None,
                   help="intra-op threads (default: torch's; use a training rank's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]: where training runs")
    p.set_defaults(fn=cmd_calibrate)

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
    p.add_argument("--out", required=True, help="directory for pred_{rank}.pt and "
                   "predictions.json")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the predictions already in --out (without it, an --out "
                        "that holds predictions is refused)")
    p.add_argument("--timeout", type=_positive(float, "--timeout"), default=DEFAULT_TIMEOUT)
    p.set_defaults(fn=cmd_predict)

    p = sub.add_parser("demo", help="partition the default graph, train with 4 ranks "
                                    "and compare with single-process PyG")
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--nproc", type=_positive(int, "--nproc"), default=4)
    p.add_argument("--epochs", type=_positive(int, "--epochs"), default=30)
    p.add_argument("--num-nodes", type=_positive(int, "--num-nodes"), default=None)
    p.set_defaults(fn=cmd_demo)

    own_process = argv is None
    argv = _negative_values_attached(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    args.argv, args.own_process = argv, own_process
    try:
        args.fn(args)
    except KeyboardInterrupt as e:  # Ctrl-C before the ranks, or a second signal
        print(f"pyg-dist {args.command}: interrupted ({str(e) or 'Ctrl-C'})", file=sys.stderr)
        sys.exit(130)
    except SpawnError as e:
        # The root cause on one line; the ranks' tracebacks (dozens of lines,
        # mostly the other ranks' lost connections) in a file it names.
        try:
            with tempfile.NamedTemporaryFile("w", prefix=f"pyg-dist-{args.command}-",
                                             suffix=".log", delete=False) as log:
                log.write(f"{e}\n")
            where = f"(tracebacks of every rank: {log.name})"
        except OSError:  # no writable temporary folder: show them here
            where = e.details
        print(f"pyg-dist {args.command}: error: {e.cause}\n{where}", file=sys.stderr)
        sys.exit(1)
    except (ValueError, RuntimeError, FileNotFoundError, NotImplementedError) as e:
        print(f"pyg-dist {args.command}: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
