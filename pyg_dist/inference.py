r"""Distributed full-graph inference: every rank predicts its own nodes."""
import copy
import os
import os.path as osp
import re
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm import tqdm

from pyg_dist.data import DistData
from pyg_dist.distributed import device as default_device
from pyg_dist.distributed import init, max_over_ranks
from pyg_dist.integrity import CorruptFileError, load_checked, read_json, save_checked, save_json
from pyg_dist.nn import distribute
from pyg_dist.nn.spec import is_layer
from pyg_dist.partition.book import read_meta

MANIFEST = "predictions.json"


@torch.no_grad()
def predict(model: torch.nn.Module, root: str, out_dir: Optional[str] = None,
            gather: bool = False, logits: bool = False, progress: bool = False,
            source: Optional[Dict[str, Any]] = None,
            overwrite: bool = False) -> Optional[Tensor]:
    r"""Runs the trained plain PyG :obj:`model` on the whole graph, one
    partition of :obj:`root` per rank of the current process group (a world
    of one is created if none exists); no rank holds more than its partition.

    Predictions are class ids (argmax), multi-hot for multi-label models
    (positive logits), or the raw outputs with :obj:`logits`.

    * :obj:`out_dir`: each rank writes ``pred_{rank}.pt`` holding ``n_id``
      (original node ids) and ``pred`` (one row per id), then rank 0
      writes ``predictions.json``: the size and checksum of each of these
      files, the partitioning they came from and the model's class with
      :obj:`source` (e.g. where the model was read from);
      :func:`load_predictions` reads them back checked. A folder that holds
      earlier predictions is refused (:class:`FileExistsError`, on every
      rank, before any rank writes) unless :obj:`overwrite`, which removes
      them first.
    * :obj:`gather`: rank 0 returns the predictions of all nodes indexed by
      original id (other ranks return ``None``); only predictions travel.

    The model is copied and distributed, so it stays a plain model; the
    result is exact (equal to single-process PyG on the whole graph).
    :obj:`progress` shows rank 0's layers as they finish."""
    init()
    rank = dist.get_rank()
    if out_dir is not None:
        claim_predictions_dir(out_dir, overwrite)
    device = default_device()
    data = DistData.load(root, rank).to(device)
    twin = distribute(copy.deepcopy(model).to(device), data)
    twin.eval()
    layers = [m for m in twin.modules() if is_layer(m)]
    bar = tqdm(total=len(layers), desc="predict", unit="layer",
               disable=not progress or rank != 0)
    hooks = [m.register_forward_hook(_advancing(bar)) for m in layers]
    out = twin(data.x, data.adj_t)
    for hook in hooks:
        hook.remove()
    bar.close()
    twin.dist_context.finish()
    multilabel = data.y is not None and data.y.dim() > 1
    pred = out if logits else (out > 0) if multilabel else out.argmax(-1)
    n_id = data.n_id[:data.num_inner]
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        name = f"pred_{rank}.pt"
        described = save_checked({"n_id": n_id.cpu(), "pred": pred.cpu()},
                                 osp.join(out_dir, name))
        files = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object((name, described), files, dst=0)
        if rank == 0:  # the manifest last: it names only complete files of this call
            meta = read_meta(root)
            save_json({"files": dict(files),
                       "partitioning": {"root": osp.abspath(root), **{
                           k: meta.get(k) for k in ("graph_hash", "partitioning_id",
                                                    "num_parts", "num_nodes")}},
                       "model": {"class": type(model).__name__, **(source or {})}},
                      osp.join(out_dir, MANIFEST))
    if not gather:
        return None
    parts = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object((n_id.cpu(), pred.cpu()), parts, dst=0)
    if rank != 0:
        return None
    result = pred.new_empty((data.num_global_nodes, ) + tuple(pred.shape[1:]),
                            device="cpu")
    for ids, rows in parts:
        result[ids] = rows
    return result


def _advancing(bar: tqdm):
    r"""A forward hook that advances :obj:`bar` and returns ``None``: a hook
    that returns a value replaces the layer's output, and tqdm's
    :meth:`update` returns ``True`` whenever it redraws."""
    def hook(*_) -> None:
        bar.update()
    return hook


def prediction_files(out_dir: str) -> List[str]:
    r"""The files of earlier predictions in :obj:`out_dir` (``pred_{r}.pt``
    and the manifest), which a new prediction there would mix with its own."""
    if not osp.isdir(out_dir):
        return []
    return sorted(name for name in os.listdir(out_dir)
                  if name == MANIFEST or re.fullmatch(r"pred_\d+\.pt(\.tmp)?", name))


def claim_predictions_dir(out_dir: str, overwrite: bool) -> None:
    r"""Refuses :obj:`out_dir` if it holds earlier predictions, unless
    :obj:`overwrite`: then the first process of each node removes them
    (every node may have its own folder). A collective: no rank writes
    before every rank has looked."""
    found = prediction_files(out_dir)
    if found and overwrite and int(os.environ.get("LOCAL_RANK", 0)) == 0:
        for name in found:
            try:
                os.remove(osp.join(out_dir, name))
            except FileNotFoundError:  # another node's process, on a shared folder
                pass
    refused = torch.tensor([float(bool(found) and not overwrite)], device=default_device())
    if max_over_ranks(refused).item():
        where = ", ".join(found) if found else "on another rank's node"
        raise FileExistsError(f"'{out_dir}' holds predictions ({where}): pass --overwrite "
                              f"(overwrite=True) to replace them")


def load_predictions(out_dir: str) -> Tuple[Tensor, Tensor]:
    r"""``(n_id, pred)`` of every node :func:`predict` wrote to
    :obj:`out_dir` (the files ``predictions.json`` lists, each checked
    against its size and checksum), in the order of its ranks."""
    path = osp.join(out_dir, MANIFEST)
    if not osp.exists(path):
        raise FileNotFoundError(f"'{path}' does not exist: '{out_dir}' holds no complete "
                                f"predictions")
    manifest = read_json(path)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise CorruptFileError(f"'{path}' is corrupt: it lists no prediction file")
    n_ids, preds = [], []
    for name, described in files.items():  # in rank order, as predict wrote them
        if not isinstance(described, dict) or set(described) != {"bytes", "sum64"}:
            raise CorruptFileError(f"'{path}' is corrupt: no size and checksum of '{name}'")
        item = load_checked(osp.join(out_dir, name), described)
        n_ids.append(item["n_id"])
        preds.append(item["pred"])
    return torch.cat(n_ids), torch.cat(preds)
