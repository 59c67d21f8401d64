"""Functions that run inside spawned ranks for tests/nn/test_exactness.py."""
import torch
import torch.distributed as dist
import pyg_dist
from tests.models import MODELS, build_model, linear_loss, summed_grads


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
            grads = summed_grads(model)
            results[name, form] = {"n_id": part.n_id[:part.num_inner],
                                   "out": out.detach(), "loss": float(total),
                                   "grads": grads}
    return results
