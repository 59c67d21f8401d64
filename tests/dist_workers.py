"""Functions that run inside spawned ranks (importable, as spawn requires)."""
import os
import time

import torch
import torch.distributed as dist

import pyg_dist
from tests.models import MODELS, build_model


def linear_loss(out: torch.Tensor, n_id: torch.Tensor) -> torch.Tensor:
    r"""A loss that is a sum over nodes with fixed per-node weights, so the
    distributed total is the sum of the ranks' parts."""
    gen = torch.Generator().manual_seed(123)
    weight = torch.randn(int(n_id.max()) + 10_000, out.size(1), generator=gen)
    return (out * weight[n_id]).sum() / 100.0


def forward_backward_all(root: str, seed: int):
    r"""Every model of tests/models.py, through edge_index and adj_t: inner
    outputs keyed by original id, the global loss and the summed gradients."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    results = {}
    for name in MODELS:
        for form in ("edge_index", "adj_t"):
            torch.manual_seed(seed)
            model = build_model(name, part.num_features)
            pyg_dist.nn.distribute(model, part)
            out = model(part.x, part[form])
            loss = linear_loss(out, part.n_id[:part.num_inner])
            loss.backward()
            total = loss.detach().clone()
            dist.all_reduce(total)
            grads = {k: p.grad.clone() for k, p in model.named_parameters()}
            for g in grads.values():
                dist.all_reduce(g)
            results[name, form] = {"n_id": part.n_id[:part.num_inner],
                                   "out": out.detach(), "loss": float(total),
                                   "grads": grads}
    return results


def die_mid_epoch(root: str, victim: int):
    r"""Trains; the victim rank exits abruptly after its first forward."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    model = pyg_dist.nn.distribute(build_model("GraphSAGE", part.num_features), part)
    for step in range(100):
        out = model(part.x, part.adj_t)
        if step == 1 and dist.get_rank() == victim:
            os._exit(3)
        out.sum().backward()
    return time.time()


def wrong_world_size(root: str):
    pyg_dist.DistData.load(root, dist.get_rank())
