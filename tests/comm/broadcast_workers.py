"""Functions that run inside spawned ranks for the broadcast-exchange and
local-clipping tests."""
import torch
import torch.distributed as dist

import pyg_dist
from pyg_dist.comm.stats import CommStats
from tests.models import linear_loss, summed_grads
from tests.models import MODELS, build_model


def both_exchanges(root: str, seed: int = 0):
    r"""Every model of tests/models.py through the halo and the broadcast
    exchange: inner outputs, the global loss, the summed weight gradients
    and the bytes per key."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    results = {"n_id": part.n_id[:part.num_inner], "num_inner": part.num_inner,
               "sizes": part.partptr.diff().tolist(), "num_halo": part.num_halo}
    for name in MODELS:
        for exchange in ("halo", "broadcast"):
            torch.manual_seed(seed)
            model = pyg_dist.nn.distribute(build_model(name, part.num_features), part,
                                           exchange=exchange)
            out = model(part.x, part.adj_t)
            loss = linear_loss(out, part.n_id[:part.num_inner])
            loss.backward()
            total = loss.detach().clone()
            dist.all_reduce(total)
            grads = summed_grads(model)
            stats = model.comm_stats
            results[name, exchange] = {"out": out.detach(), "loss": float(total),
                                       "grads": grads, "sent": dict(stats.bytes_sent),
                                       "recv": dict(stats.bytes_recv)}
    for exchange in ("halo", "broadcast"):  # rows and gradients travel as bf16
        torch.manual_seed(seed)
        model = pyg_dist.nn.distribute(build_model("GraphSAGE", part.num_features), part,
                                       exchange=exchange, exchange_dtype="bf16")
        for conv in model.convs:  # the same rows on both exchanges: the layers' inputs
            conv.project_first = False
        out = model(part.x, part.adj_t)
        linear_loss(out, part.n_id[:part.num_inner]).backward()
        grads = summed_grads(model)
        results["bf16", exchange] = {"out": out.detach(), "grads": grads,
                                     "sent": dict(model.comm_stats.bytes_sent)}
    return results


def train_rank(root: str, config, out: str):
    from pyg_dist.train import train
    return train(root, config, out)


def refusals(root: str):
    r"""What the broadcast exchange refuses inside a world: a sampled plan
    at the first fetch, and the caches and options it does not run with
    when the model is distributed."""
    from torch_geometric.nn import SAGEConv
    from pyg_dist.cache import FeatureCache, PipelineCache
    from pyg_dist.sampler import build_sampler
    part = pyg_dist.DistData.load(root, dist.get_rank())
    out = {}
    for name, kwargs in (("pipeline", dict(cache=PipelineCache(1))),
                         ("overlap", dict(overlap=True)),
                         ("feature_cache", dict(feature_cache=FeatureCache("degree", "10%")))):
        try:
            pyg_dist.nn.distribute(SAGEConv(part.num_features, 4), part, exchange="broadcast",
                                   **kwargs)
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    layer = pyg_dist.nn.distribute(SAGEConv(part.num_features, 4), part, exchange="broadcast")
    bns = build_sampler("bns", part, seed=0, p=0.5)
    try:
        with layer.dist_context.use(bns.plan(0)):
            layer(part.x, part.adj_t)
        out["sampled"] = None
    except ValueError as e:
        out["sampled"] = str(e)
    return out


def local_clipping(root: str):
    r"""One training step's gradient all-reduce with SANCUS's local
    clipping, the threshold chosen between the ranks' local gradient norms
    (so one rank is clipped and one is not): this rank's local gradient
    before clipping and the all-reduced gradient after."""
    from torch_geometric.nn import GraphSAGE
    from pyg_dist.train import _step
    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    model = pyg_dist.nn.distribute(GraphSAGE(part.num_features, 8, 2, 4), part)
    params = list(model.parameters())
    out = model(part.x, part.adj_t)
    # Rank r's loss weighs its rows by r + 1: the local norms differ.
    loss = linear_loss(out, part.n_id[:part.num_inner]) * (dist.get_rank() + 1)
    loss.backward()
    local = {k: p.grad.clone() for k, p in model.named_parameters()}
    norm = torch.stack([g.norm() for g in local.values()]).norm().reshape(1)
    norms = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(norms, norm)
    world = dist.get_world_size()
    clip = float(torch.cat(norms).mean()) / world ** 0.5  # between the two norms
    optimizer = torch.optim.SGD(params, lr=0.0)
    _step(params, optimizer, loss.detach(), 1, world, CommStats(), clip)
    return {"local": local, "norm": float(norm), "clip": clip,
            "reduced": {k: p.grad.clone() for k, p in model.named_parameters()}}
