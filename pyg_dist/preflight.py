r"""Everything the launcher can check before it starts a rank.

:func:`check_training` (``pyg-dist train``, :func:`~pyg_dist.launch.run_training`)
and :func:`check_prediction` (``pyg-dist predict``) look at what a run will
read and write before any rank exists: ``meta.json``; every part file the
run reads (and ``train_graph/``'s for inductive training, ``batches.pt``
and the balanced batch parts for the cohesive loader) against the size
and checksum ``meta.json`` records; the world size against the number of
parts; that the output folders can be created and written; for a resumed
run ``latest.json`` (the run's identity) and every rank's checkpoint file
against its sidecar; that the graph has training nodes; for a prediction
the model's files and its input width. Every problem is one line naming
the file or flag and what is wrong; all of them are raised together as one
:class:`PreflightError`.

Files are read and checksummed (:func:`~pyg_dist.integrity.verify`), not
unpickled (but ``batches.pt``, small, whose batches are checked too), so
the checks cost about one read of the files. Under ``torchrun`` each rank
runs them for its own files before it joins the group.
"""
import os
import os.path as osp
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from pyg_dist.distributed import under_torchrun
from pyg_dist.integrity import verify
from pyg_dist.partition.book import (META_FILE, described, edges_file, features_file, part_file,
                                     read_meta)


class PreflightError(RuntimeError):
    r"""What keeps a run from starting, found before any rank started:
    one line per problem (:attr:`problems`)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class _Problems(List[str]):
    def check(self, fn: Callable, *args: Any) -> Any:
        r"""``fn(*args)``; an error it raises is recorded as one line
        (``None`` is returned)."""
        try:
            return fn(*args)
        except (OSError, RuntimeError, ValueError) as e:
            lines = str(e).splitlines()
            self.append(lines[0] if lines else type(e).__name__)
            return None

    def add(self, problem: Optional[str]) -> None:
        if problem is not None:
            self.append(problem)

    def raise_any(self) -> None:
        if self:
            raise PreflightError(self)


def launched_ranks(num_parts: int, nproc: Optional[int] = None) -> Tuple[int, List[int]]:
    r"""The world size a launch will have and the ranks whose files this
    process checks: under ``torchrun`` its world and its own rank, else
    :obj:`nproc` (default: one per part) and every part."""
    if under_torchrun():
        return int(os.environ["WORLD_SIZE"]), [int(os.environ["RANK"])]
    return nproc or num_parts, list(range(num_parts))


def check_parts(root: str, meta: Dict[str, Any], ranks: Sequence[int],
                problems: _Problems) -> None:
    r"""The part files of :obj:`ranks` in :obj:`root` hold the bytes its
    ``meta.json`` (:obj:`meta`) describes."""
    for rank in ranks:
        if 0 <= rank < meta["num_parts"]:
            check_file(root, meta, osp.basename(part_file(root, rank)), problems)
            for name in (features_file(rank), edges_file(rank)):
                if name in meta["files"]:  # kept apart by partition --from
                    check_file(root, meta, name, problems)


def check_batch_parts(root: str, meta: Dict[str, Any], ranks: Sequence[int],
                      problems: _Problems) -> None:
    r"""The balanced batch parts (``batch_parts/{b}/part_{r}.pt``) of
    :obj:`ranks`, if :obj:`root` has them, hold the bytes ``meta.json``
    describes."""
    from pyg_dist.loader.cohesive.balance import BATCH_PARTS_DIR, batch_part_file
    folder = osp.join(root, BATCH_PARTS_DIR)
    on_disk = [b for b in os.listdir(folder) if b.isdigit()] if osp.isdir(folder) else []
    listed = [name.split("/")[1] for name in meta["files"]
              if name.startswith(BATCH_PARTS_DIR + "/")]  # a removed folder too
    for batch in sorted({int(b) for b in on_disk + listed}):
        for rank in ranks:
            check_file(root, meta, osp.relpath(batch_part_file(root, batch, rank), root),
                       problems)


def check_world(root: str, meta: Dict[str, Any], world: int, problems: _Problems) -> None:
    num_parts = meta["num_parts"]
    if world != num_parts:
        problems.append(f"'{root}' holds {num_parts} partitions but {world} ranks would "
                        f"start: launch {num_parts} (--nproc {num_parts}) or re-partition "
                        f"with --num-parts {world}")


def check_file(root: str, meta: Dict[str, Any], name: str, problems: _Problems) -> None:
    r"""File :obj:`name` of :obj:`root` exists and holds the bytes
    ``meta.json`` (:obj:`meta`) describes."""
    path = osp.join(root, name)
    if check_exists(path, osp.join(root, META_FILE), problems):
        expected = problems.check(described, root, meta, name)
        if expected is not None:
            problems.check(verify, path, expected)


def check_exists(path: str, index: str, problems: _Problems) -> bool:
    r"""Whether :obj:`path`, which the file :obj:`index` describes, exists
    (recorded as a problem where it does not)."""
    if osp.lexists(path):
        return True
    problems.append(f"'{path}' is missing ('{index}' describes it)")
    return False


def writable_dir(flag: str, path: str) -> Optional[str]:
    r"""Why :obj:`path` cannot be a folder this process writes into (one
    line naming :obj:`flag`), or ``None``; creates nothing."""
    if osp.exists(path):
        if not osp.isdir(path):
            return f"{flag} '{path}' is a file, not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{flag} '{path}' is not writable"
        return None
    parent = osp.dirname(osp.abspath(path))
    while not osp.exists(parent):  # the nearest existing folder is where it is created
        parent = osp.dirname(parent)
    if not osp.isdir(parent):
        return f"cannot create {flag} '{path}': '{parent}' is a file, not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create {flag} '{path}': '{parent}' is not writable"
    return None


def physical_memory() -> Optional[int]:
    r"""Bytes of this machine's memory (``None`` where it cannot be read)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # not POSIX
        return None


def model_parameters(config, in_channels: int, out_channels: int) -> Optional[int]:
    r"""The parameters of the model :obj:`config` builds, counted on models
    of at most 3 layers built on the meta device (no memory, no random
    numbers drawn): every layer between the first and the last has as many.
    ``None`` where such a model cannot be built (the ranks report why)."""
    import torch
    from pyg_dist.config import MODELS
    kwargs = {"heads": config.heads} if config.model == "gat" else {}

    def count(layers: int) -> int:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = MODELS[config.model](in_channels, config.hidden, layers, out_channels,
                                         **kwargs)
        return sum(p.numel() for p in model.parameters())
    try:
        if config.num_layers <= 3:
            return count(config.num_layers)
        two = count(2)
        return two + (config.num_layers - 2) * (count(3) - two)
    except Exception:  # noqa: BLE001  e.g. GAT's hidden not divisible by its heads
        return None


# Bytes a training rank keeps per parameter: the weight, its gradient and
# Adam's two moments (float32).
PARAMETER_BYTES = 16
# Bytes a full-graph epoch keeps per inner row and hidden channel of every
# layer after the first, at least: the layer's float32 input, which the
# backward pass needs for the weight gradient (measured, 2 parts of 2,000
# nodes, 200 layers, hidden 64, dropout 0: 2.2 times this above the
# baseline for gcn, 2.8 for sage; more with dropout, far more for gat).
ACTIVATION_BYTES = 4


def memory_problem(meta: Dict[str, Any], config, world: int) -> Optional[str]:
    r"""Why training :obj:`config` on the parts of ``meta.json``
    (:obj:`meta`) with :obj:`world` ranks cannot fit this machine's memory,
    or ``None``. What the ranks on this machine (all of them, or
    ``LOCAL_WORLD_SIZE`` under torchrun) keep at least, from the model's
    parameters (:data:`PARAMETER_BYTES` each) and, for full-graph epochs on
    the CPU, the activations (:data:`ACTIVATION_BYTES` per inner row and
    hidden channel of every layer but the first), against the physical
    memory: a model that cannot fit is refused in seconds, not after
    minutes of set-up and an out-of-memory kill."""
    import torch
    from pyg_dist.loader import LOADERS
    have = physical_memory()
    params = model_parameters(config, meta["num_features"], meta["num_classes"])
    if have is None or params is None:
        return None
    inner = [part.get("num_inner", 0) for part in meta.get("parts", [])] or [0]
    if under_torchrun():  # which parts this node's ranks train is not known yet
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        rows = ranks * min(inner)
    else:
        ranks, rows = world, sum(inner[:world])
    gpu = (under_torchrun() or world == 1) and torch.cuda.is_available()
    full_graph = getattr(LOADERS.get(config.loader), "full_graph", False)
    activations = (rows * config.hidden * (config.num_layers - 1) * ACTIVATION_BYTES
                   if full_graph and not gpu and not config.inductive else 0)
    # On a GPU the host holds only the weights, as each rank builds its model.
    need = ranks * params * (4 if gpu else PARAMETER_BYTES) + activations
    if need <= have:
        return None
    what = (f"{ranks} rank{'s' if ranks > 1 else ''} x {params:,} parameters x "
            + ("4 B (weights, built on the host)" if gpu else
               f"{PARAMETER_BYTES} B (weights, gradients, Adam's moments)"))
    if activations:
        what += (f" + {rows:,} rows x {config.hidden} hidden x {config.num_layers - 1:,} "
                 f"layers x {ACTIVATION_BYTES} B (activations)")
    return (f"--layers {config.num_layers:,} --hidden {config.hidden:,} ({config.model}): "
            f"training needs at least {_size(need)} of memory on this machine, which has "
            f"{_size(have)} ({what}): use fewer --layers or a smaller --hidden")


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:,.1f} TiB"


def check_training(root: str, config, out_dir: Optional[str] = None,
                   nproc: Optional[int] = None) -> None:
    r"""Raises :class:`PreflightError` listing every problem that would
    stop training :obj:`config` (a :class:`~pyg_dist.config.TrainConfig`)
    on the partitions in :obj:`root` into :obj:`out_dir` with :obj:`nproc`
    local ranks (see the module)."""
    from pyg_dist.loader.cohesive.loader import load_batches
    from pyg_dist.run_files import (claim_out_dir, require_labelled_training_nodes,
                                    train_graph_root)
    problems = _Problems()
    meta = problems.check(read_meta, root)
    if meta is not None:
        world, ranks = launched_ranks(meta["num_parts"], nproc)
        check_world(root, meta, world, problems)
        check_parts(root, meta, ranks, problems)
        if config.inductive:
            sub = problems.check(train_graph_root, root)
            sub_meta = problems.check(read_meta, sub) if sub is not None else None
            if sub_meta is not None:
                check_parts(sub, sub_meta, ranks, problems)
        if config.loader == "cohesive":
            problems.check(load_batches, root)  # small: its contents are checked too
            check_batch_parts(root, meta, ranks, problems)
        problems.check(require_labelled_training_nodes, root, meta)
        problems.add(memory_problem(meta, config, world))
        if config.resume:
            _check_resume(root, config, out_dir, world, ranks, problems)
    if out_dir is not None:
        problems.add(writable_dir("--out", out_dir))
    if config.checkpoint_every:  # explicit, or inside --out (written as its run starts)
        folder = config.checkpoint_dir or (osp.join(out_dir, "checkpoint") if out_dir else None)
        if folder is not None and (config.checkpoint_dir or osp.exists(folder)):
            problems.add(writable_dir("--checkpoint-dir", folder))
    if config.checkpoint_every and not config.resume and meta is not None:
        from pyg_dist.run_files import checkpointer
        problems.check(checkpointer, root, config, out_dir, 1)  # a folder to write to
    problems.check(claim_out_dir, out_dir, config)
    problems.raise_any()


def _check_resume(root: str, config, out_dir: Optional[str], world: int,
                  ranks: Sequence[int], problems: _Problems) -> None:
    r"""``latest.json`` matches this run (world size, graph, partitioning,
    hyper-parameters), the epochs go beyond it, and each rank's
    checkpoint file matches its sidecar."""
    from pyg_dist.run_files import checkpointer
    checkpoints = problems.check(checkpointer, root, config, out_dir, world)
    latest = problems.check(checkpoints.latest) if checkpoints is not None else None
    if latest is None:
        return
    if config.epochs < latest["epoch"]:
        problems.append(f"the checkpoint in '{checkpoints.directory}' is at epoch "
                        f"{latest['epoch']}: --epochs {config.epochs} would train nothing "
                        f"(give more epochs)")
    for rank in ranks:
        problems.check(checkpoints.verify, latest, rank)


def check_prediction(root: str, model_dir: str, out_dir: Optional[str],
                     overwrite: bool = False) -> Dict[str, Any]:
    r"""Raises :class:`PreflightError` listing every problem that would
    stop predicting with the model trained into :obj:`model_dir` on the
    partitions in :obj:`root` into :obj:`out_dir`: the partition's files and
    world size, ``model.json`` and ``model.pt`` (verified), the model's
    input width against the graph's features, and :obj:`out_dir` (writable,
    and holding no earlier predictions unless :obj:`overwrite`). Returns
    ``model.json``."""
    from pyg_dist.inference import prediction_files
    from pyg_dist.run_files import model_spec
    problems = _Problems()
    meta = problems.check(read_meta, root)
    if meta is not None:
        world, ranks = launched_ranks(meta["num_parts"])
        check_world(root, meta, world, problems)
        check_parts(root, meta, ranks, problems)
    spec = problems.check(model_spec, model_dir)
    if spec is not None:
        path = osp.join(model_dir, "model.pt")
        if check_exists(path, osp.join(model_dir, "model.json"), problems):
            problems.check(verify, path, spec["files"]["model.pt"])
        if meta is not None and spec["in_channels"] != meta["num_features"]:
            problems.append(f"the model in '{model_dir}' takes {spec['in_channels']} input "
                            f"features, the graph in '{root}' has {meta['num_features']}: "
                            f"it was trained on another graph")
    if out_dir is not None:
        problems.add(writable_dir("--out", out_dir))
        found = problems.check(prediction_files, out_dir)
        if found and not overwrite:
            problems.append(f"--out '{out_dir}' holds predictions ({', '.join(found)}): pass "
                            f"--overwrite to replace them")
    problems.raise_any()
    return spec
