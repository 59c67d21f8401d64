r"""The files of a training run besides its partitions' tensors: what it
checks in its input folder (labelled training nodes, the train nodes'
subgraph of an inductive run), its out folder (claimed, an old run there
replaced only on request), its checkpoints (resumed only by the same run)
and the trained model it leaves (``model.json`` and ``model.pt``, rebuilt by
:func:`load_model`). Both training and the preflight that checks a run
before its ranks start use them."""
import json
import os
import os.path as osp
import shutil
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from pyg_dist.checkpoint import Checkpointer
from pyg_dist.config import TrainConfig, build_model, upgrade
from pyg_dist.integrity import CorruptFileError, load_checked, read_json
from pyg_dist.loader import LOADERS, loader_options
from pyg_dist.partition.book import read_meta


def require_labelled_training_nodes(root: str, meta: Dict[str, Any]) -> None:
    r"""Refuses a partitioning (``meta.json`` :obj:`meta` of :obj:`root`)
    without training nodes (its loss would be 0 and its model untrained)
    or without labels (partitioned from a graph without ``y``: its labels
    were checked at partition time where it had them)."""
    path = osp.join(root, 'meta.json')
    if sum(s.get("num_train", 0) for s in meta.get("parts", [])) == 0:
        raise ValueError(f"'{path}': the graph has no training node (its train_mask is "
                         f"empty): nothing to train on")
    classes = meta.get("num_classes")
    if classes is None:
        raise ValueError(f"'{path}': the graph has no labels (its folder had no y.npy, or "
                         f"its Data no y): training needs them; add them and partition "
                         f"again")
    if not isinstance(classes, int) or classes < 1:
        raise ValueError(f"'{path}' is corrupt: its num_classes is {classes!r}, not a "
                         f"count of classes")


# What a run writes into its out_dir (and --overwrite removes).
RUN_FILES = ("metrics.jsonl", "summary.json", "model.pt", "model.json", "checkpoint",
             "curves.png", "time_breakdown.png", "memory.png")


def claim_out_dir(out_dir: Optional[str], config: TrainConfig) -> List[str]:
    r"""Refuses an :obj:`out_dir` that holds a run unless the config
    resumes it or overwrites it; returns the old run's files that
    overwriting removes (:func:`remove_old_run`, once the new run has
    read its inputs)."""
    if out_dir is None or not osp.isdir(out_dir):
        return []
    found = [f for f in RUN_FILES if osp.exists(osp.join(out_dir, f))]
    if not found or config.resume:
        return []
    if not config.overwrite:
        raise FileExistsError(f"'{out_dir}' holds a run ({', '.join(found)}): pass --resume "
                              f"to continue it or --overwrite to replace it")
    return found


def remove_old_run(out_dir: Optional[str], names: List[str]) -> None:
    r"""Rank 0 removes the files :func:`claim_out_dir` found, after a
    barrier: every rank has read and checked its inputs (a run refused for
    a bad file leaves the old run whole), and none has written yet."""
    if dist.get_world_size() > 1:
        dist.barrier()
    if dist.get_rank() == 0:
        for name in names:
            path = osp.join(out_dir, name)
            shutil.rmtree(path) if osp.isdir(path) else os.remove(path)


def train_graph_root(root: str) -> str:
    r"""Where :func:`~pyg_dist.partition_graph` with ``inductive=True``
    wrote the partitions of the train nodes' subgraph."""
    path = osp.join(root, "train_graph")
    if not osp.exists(osp.join(path, "meta.json")):
        raise FileNotFoundError(f"'{root}' has no partitions of the train-node subgraph "
                                f"for inductive training: re-partition with --inductive")
    return path


# Fields that may change between a run and its resumption.
_RUN_CONTROL = ("epochs", "progress", "eval_every", "checkpoint_every", "checkpoint_dir",
                "resume", "overwrite")


def checkpointer(root: str, config: TrainConfig, out_dir: Optional[str],
                 world: int) -> Optional[Checkpointer]:
    r"""The run's :class:`~pyg_dist.checkpoint.Checkpointer` (``None``
    without checkpoints); a checkpoint is resumed only by a run with the
    same world size, graph and hyper-parameters (the epochs may grow)."""
    if not config.checkpoint_every and not config.resume:
        return None
    directory = config.checkpoint_dir or (osp.join(out_dir, "checkpoint") if out_dir else None)
    if directory is None:
        raise ValueError("checkpoints need a directory: give out_dir (--out) or "
                         "checkpoint_dir (--checkpoint-dir)")
    meta = read_meta(root)
    return Checkpointer(directory, config.checkpoint_every,
                        {"world_size": world, "graph_hash": meta["graph_hash"],
                         "partitioning_id": meta.get("partitioning_id"),
                         **_identity(config.to_dict())},
                        upgrade=_identity)


def _identity(values: Dict[str, Any]) -> Dict[str, Any]:
    r"""What a resumed run must share with its checkpoint: the config
    without run control (a loader's options that do not change results
    included), as JSON reads it."""
    run = {k: v for k, v in upgrade(values).items() if k not in _RUN_CONTROL}
    if "loader_args" in run and run.get("loader") in LOADERS:
        control = {o.name for o in loader_options(run["loader"]) if o.run_control}
        run["loader_args"] = {k: v for k, v in run["loader_args"].items()
                              if k not in control}
    return json.loads(json.dumps(run))


def model_spec(out_dir: str) -> Dict[str, Any]:
    r"""``model.json`` of the training run in :obj:`out_dir`: the config,
    the widths and the description of ``model.pt``; refused in one line
    naming the file if it is missing, unreadable or incomplete."""
    path = osp.join(out_dir, "model.json")
    if not osp.exists(path):
        raise FileNotFoundError(f"'{path}' does not exist: '{out_dir}' holds no trained "
                                f"model (the --out folder of a finished training run)")
    spec = read_json(path)
    if not isinstance(spec, dict) or not isinstance(spec.get("config"), dict) or not all(
            isinstance(spec.get(k), int) for k in ("in_channels", "out_channels")):
        raise CorruptFileError(f"'{path}' is corrupt: it lacks config, in_channels or "
                               f"out_channels")
    described = spec.get("files", {}).get("model.pt") if isinstance(
        spec.get("files"), dict) else None
    if not isinstance(described, dict) or not all(
            isinstance(described.get(k), int) for k in ("bytes", "sum64")):
        raise CorruptFileError(f"'{path}' records no checksum of model.pt: model.pt cannot "
                               f"be checked (train again to write both)")
    return spec


def load_model(out_dir: str) -> torch.nn.Module:
    r"""Rebuilds a trained model as a plain PyG model (any number of
    partitions, or none); distribute it again for distributed inference.
    ``model.pt`` is refused unless its size and checksum are those
    ``model.json`` records."""
    spec = model_spec(out_dir)
    model = build_model(TrainConfig.from_dict(spec["config"]), spec["in_channels"],
                        spec["out_channels"])
    path = osp.join(out_dir, "model.pt")
    state = load_checked(path, spec["files"]["model.pt"])
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CorruptFileError(f"'{path}' does not fit the model '{out_dir}/model.json' "
                               f"describes ({first})") from e
    return model
