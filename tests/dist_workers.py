"""Functions that run inside spawned ranks (importable, as spawn requires)."""
import torch
import torch.distributed as dist

import pyg_dist
from tests.models import build_model


def forward_backward(root: str, name: str, seed: int, use_adj_t: bool):
    r"""One forward/backward of a distributed model; returns the inner
    outputs keyed by original node id, the loss and the weight gradients."""
    rank = dist.get_rank()
    part = pyg_dist.DistData.load(root, rank)
    torch.manual_seed(seed)
    model = build_model(name, part.num_features)
    pyg_dist.nn.distribute(model, part)
    out = model(part.x, part.adj_t if use_adj_t else part.edge_index)
    loss_local = (out ** 2).sum() * 0.5 + out.sum()  # node-wise sum: exact total
    loss = loss_local.detach().clone()
    dist.all_reduce(loss)
    loss_local.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    for g in grads.values():
        dist.all_reduce(g)
    return {"n_id": part.n_id[:part.num_inner], "out": out.detach(),
            "loss": float(loss), "grads": grads}
