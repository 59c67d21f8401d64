"""Functions that run inside spawned ranks for tests/nn/test_async_layers.py."""
import torch
import torch.distributed as dist
from torch_geometric.nn import GCN, GIN, GraphConv, GraphSAGE
from torch_geometric.nn.models.basic_gnn import BasicGNN

import pyg_dist
from tests.models import linear_loss

HIDDEN, OUT = 8, 5


class GraphConvGNN(BasicGNN):
    r"""A BasicGNN of GraphConv layers (PyG ships none)."""
    supports_edge_weight, supports_edge_attr, supports_norm_batch = False, False, False

    def init_conv(self, in_channels, out_channels, **kwargs):
        return GraphConv(in_channels, out_channels, aggr="mean", **kwargs)


def build(name: str, in_channels: int, layers: int = 3) -> torch.nn.Module:
    cls = {"GraphSAGE": GraphSAGE, "GCN": GCN, "GIN": GIN, "GraphConv": GraphConvGNN}[name]
    return cls(in_channels, HIDDEN, layers, OUT)


def _grads(model) -> dict:
    r"""The gradients summed over the ranks (in place: as training steps on them)."""
    for p in model.parameters():
        dist.all_reduce(p.grad)
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def _pyg_order(model: torch.nn.Module) -> torch.nn.Module:
    r"""Layers that aggregate before projecting, as the per-node schedule
    does (see DistSAGEConv): both passes then move the same rows."""
    for conv in model.modules():
        if hasattr(conv, "project_first"):
            conv.project_first = False
    return model


def nodes_pass(root: str, name: str, overlap, layers: int = 3, steps: int = 2,
               trace: bool = False):
    r"""``steps`` training steps of model :obj:`name` distributed with
    :obj:`overlap` (weights change between steps: Adam): per step the
    outputs keyed by original id and the summed gradients; the last step's
    trace, stage sizes and stats."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    model = pyg_dist.nn.distribute(build(name, part.num_features, layers), part,
                                   overlap=overlap)
    _pyg_order(model)
    runner = model.dist_engine if model.dist_engine.name == "nodes" else None
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    n_id = part.n_id[:part.num_inner]
    out = {"n_id": n_id, "steps": []}
    for step in range(steps):
        optimizer.zero_grad()
        model.comm_stats.reset()
        if runner is not None:
            runner.trace = [] if trace else None
        y = model(part.x, part.adj_t)
        linear_loss(y, n_id).backward()
        grads = _grads(model)
        out["steps"].append((y.detach(), grads))
        optimizer.step()
    stats = model.comm_stats
    out["time"] = dict(stats.time)
    out["counts"] = dict(stats.counts)
    out["bytes"] = (dict(stats.bytes_sent), dict(stats.bytes_recv))
    if runner is not None:
        out["trace"], runner.trace = runner.trace, None  # the last step's
        schedule = runner.schedule(part.adj_t, part.x.dtype)
        out["rows_per_stage"] = schedule.rows_per_stage()
    model.eval()
    with torch.no_grad():
        out["eval"] = model(part.x, part.adj_t)
    return out


def nodes_passes(root: str, names, overlap):
    r""":func:`nodes_pass` for every model of :obj:`names` (one world),
    with the trace of the last step."""
    return {name: nodes_pass(root, name, overlap, trace=True) for name in names}


def compressed(root: str, overlap):
    r"""A GraphSAGE exchanging bf16 rows and gradients: outputs, summed
    gradients, bytes; and the error of a second backward (retain_graph)."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    model = _pyg_order(pyg_dist.nn.distribute(build("GraphSAGE", part.num_features), part,
                                              overlap=overlap, exchange_dtype="bf16"))
    loss = model(part.x, part.adj_t).pow(2).sum()
    loss.backward(retain_graph=True)
    out = {"grads": _grads(model), "bytes": model.comm_stats.total_bytes_sent,
           "out": model(part.x, part.adj_t).detach()}
    try:
        loss.backward()
        out["twice"] = None
    except RuntimeError as e:
        out["twice"] = str(e)
    return out


def other_passes(root: str, overlap):
    r""":func:`input_gradient`, :func:`compressed` and :func:`batch_pass` for
    GraphSAGE and GCN."""
    return {"input": input_gradient(root, overlap), "bf16": compressed(root, overlap),
            **{name: batch_pass(root, overlap, name) for name in ("GraphSAGE", "GCN")}}


def input_gradient(root: str, overlap):
    r"""A GraphSAGE whose input requires a gradient: the input's gradient
    (its halo rows' gradients return through exchange 1)."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    model = _pyg_order(pyg_dist.nn.distribute(build("GraphSAGE", part.num_features), part,
                                              overlap=overlap))
    x = part.x.clone().requires_grad_()
    linear_loss(model(x, part.adj_t), part.n_id[:part.num_inner]).backward()
    return part.n_id[:part.num_inner], x.grad


def batch_pass(root: str, overlap, name: str = "GraphSAGE"):
    r"""A cohesive batch (per-layer plans on shrinking prefixes) and a BNS
    plan: outputs, gradients and bytes with :obj:`overlap`."""
    from pyg_dist.loader import batch_subgraph
    from pyg_dist.sampler import build_sampler
    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    model = _pyg_order(pyg_dist.nn.distribute(build(name, part.num_features), part,
                                              overlap=overlap))
    ctx, stats = model.dist_context, model.comm_stats
    targets = torch.zeros(part.num_inner, dtype=torch.bool)
    targets[::5] = True
    batch = batch_subgraph(part, targets, ctx.num_layers)
    bns = build_sampler("bns", part, seed=1, p=0.5)
    cases = {"batch": (batch.plans, part.x[batch.data.inner_id], batch.data.adj_t),
             "bns": (bns.plan(0), part.x, part.adj_t)}
    out = {}
    for case, (plans, x, adj) in cases.items():
        model.zero_grad()
        stats.reset()
        with ctx.use(plans):
            y = model(x, adj)
        y.pow(2).sum().backward()
        out[case] = (y.detach(), _grads(model), stats.total_bytes_recv,
                     stats.counts["async_layers"])
    return out


def train_run(root: str, config, out_dir: str):
    from pyg_dist.train import train
    return train(root, config, out_dir)
