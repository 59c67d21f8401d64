"""Functions that run inside spawned ranks for tests/loader/test_cohesive.py."""
import torch
import torch.distributed as dist
import pyg_dist
from pyg_dist.sampler import build_sampler
from tests.models import summed_grads


def cohesive_batch_checks(root: str, batch_of: torch.Tensor, balanced: bool = False):
    r"""Per mini-batch of the cohesive loader: the batch nodes' outputs, the
    summed weight gradients of a loss over them, and the halo bytes."""
    from tests.models import linear_loss
    from tests.models import build_model
    from pyg_dist.loader import CohesiveBatchLoader
    part = pyg_dist.DistData.load(root, dist.get_rank())
    out = {}
    for name in ("GraphSAGE", "GCN", "GAT"):
        torch.manual_seed(0)
        model = pyg_dist.nn.distribute(build_model(name, part.num_features), part)
        ctx, stats = model.dist_context, model.comm_stats
        loader = CohesiveBatchLoader(part, batch_of, num_layers=ctx.num_layers,
                                     seed=3, balanced_root=root if balanced else None)
        for batch in loader:
            model.zero_grad()
            stats.reset()
            with ctx.use(batch.plans):
                y = model(batch.x, batch.data.adj_t)
            targets = batch.targets[:y.size(0)]  # the batch's rows come first
            n_id = batch.data.n_id[:y.size(0)][targets]
            linear_loss(y[targets], n_id).backward()
            grads = summed_grads(model)
            out[name, batch.index] = {"n_id": n_id, "out": y[targets].detach(),
                                      "grads": grads, "bytes": stats.total_bytes_recv,
                                      "computed": batch.data.n_id[:batch.data.num_inner]}
        stats.reset()
        model(part.x, part.adj_t).sum().backward()
        out[name, "full_bytes"] = stats.total_bytes_recv
        out[name, "order"] = [loader.order() for _ in range(1)]
    return out


def batch_sampling_checks(root: str, draws: int = 200):
    r"""BNS (p = 0.5) on a batch's halo: the mean of a one-layer GCN's batch
    outputs over many draws against the exact batch output, and the rows
    each draw receives."""
    from torch_geometric.nn import GCNConv
    from pyg_dist.loader import batch_subgraph
    from pyg_dist.loader.cohesive.batch_plan import sample_layers
    part = pyg_dist.DistData.load(root, dist.get_rank())
    targets = torch.zeros(part.num_inner, dtype=torch.bool)
    targets[::3] = True
    torch.manual_seed(0)
    model = pyg_dist.nn.distribute(GCNConv(part.num_features, 4), part)
    ctx = model.dist_context
    graph = batch_subgraph(part, targets, 1)
    x = part.x[graph.data.inner_id]
    with torch.no_grad():
        with ctx.use(graph.plans):
            exact = model(x, graph.data.adj_t)[graph.targets]
        bns = build_sampler("bns", graph.data, seed=5, p=0.5)
        total, rows, extra = torch.zeros_like(exact), 0, 0
        for t in range(draws):
            plans = sample_layers(graph.plans, bns.plan(t))
            needed = set(graph.plans[0].recv_rows().tolist())
            extra += len(set(plans[0].recv_rows().tolist()) - needed)
            rows += plans[0].num_recv
            with ctx.use(plans):
                total += model(x, graph.data.adj_t)[graph.targets]
    return {"error": float((total / draws - exact).abs().max()),
            "scale": float(exact.abs().max()), "rows": rows / draws,
            "needed": graph.plans[0].num_recv, "extra": extra}


def gathered_batches(root: str, cost=None):
    r"""The loader's own batching (``num_batches=``) minimising :obj:`cost`,
    and its coverage; and the cost model a loader measures for a model of
    width 32 when given none."""
    from pyg_dist.loader import CohesiveBatchLoader
    part = pyg_dist.DistData.load(root, dist.get_rank())
    loader = CohesiveBatchLoader(part, num_batches=4, num_layers=2, seed=1, cost=cost)
    seen = torch.cat([part.n_id[:part.num_inner][loader.batch_of == b] for b in range(4)])
    measured = CohesiveBatchLoader(part, num_batches=4, num_layers=2, hidden=32,
                                   model="gcn").cost
    return {"batch_of": loader.batch_of, "n_id": part.n_id[:part.num_inner], "seen": seen,
            "cost": loader.cost.to_dict(), "measured": measured.to_dict()}
