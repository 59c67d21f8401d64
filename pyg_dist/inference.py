r"""Distributed full-graph inference: every rank predicts its own nodes."""
import copy
import os
import os.path as osp
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.nn import MessagePassing
from tqdm import tqdm

from pyg_dist.data import DistData
from pyg_dist.distributed import device as default_device
from pyg_dist.distributed import init
from pyg_dist.nn import distribute


@torch.no_grad()
def predict(model: torch.nn.Module, root: str, out_dir: Optional[str] = None,
            gather: bool = False, logits: bool = False,
            progress: bool = False) -> Optional[Tensor]:
    r"""Runs the trained plain PyG :obj:`model` on the whole graph, one
    partition of :obj:`root` per rank of the current process group (a world
    of one is created if none exists); no rank holds more than its partition.

    Predictions are class ids (argmax), multi-hot for multi-label models
    (positive logits), or the raw outputs with :obj:`logits`.

    * :obj:`out_dir`: each rank writes ``pred_{rank}.pt`` holding ``n_id``
      (original node ids) and ``pred`` (one row per id).
    * :obj:`gather`: rank 0 returns the predictions of all nodes indexed by
      original id (other ranks return ``None``); only predictions travel.

    The model is copied and distributed, so it stays a plain model; the
    result is exact (equal to single-process PyG on the whole graph).
    :obj:`progress` shows rank 0's layers as they finish."""
    init()
    rank = dist.get_rank()
    device = default_device()
    data = DistData.load(root, rank).to(device)
    twin = distribute(copy.deepcopy(model).to(device), data)
    twin.eval()
    layers = [m for m in twin.modules() if isinstance(m, MessagePassing)]
    bar = tqdm(total=len(layers), desc="predict", unit="layer",
               disable=not progress or rank != 0)
    hooks = [m.register_forward_hook(lambda *_: bar.update()) for m in layers]
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
        torch.save({"n_id": n_id.cpu(), "pred": pred.cpu()},
                   osp.join(out_dir, f"pred_{rank}.pt"))
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
