"""The models of the sequential-exchange tests, and the functions their
spawned ranks run."""
import torch
import torch.distributed as dist
from torch_geometric.nn import (MLP, GATConv, GATv2Conv, GCNConv, GINConv, GINEConv,
                                GraphConv, SAGEConv, TransformerConv)

import pyg_dist
from pyg_dist.utils.aggregate import kept

HIDDEN, OUT, EDGE_DIM = 8, 5, 3
STEPS = 2  # SGD steps: the second runs on changed weights


class TwoLayers(torch.nn.Module):
    r"""conv → ReLU → conv: the second layer's input has a gradient, so its
    halo rows' gradients travel back."""

    def __init__(self, first: torch.nn.Module, second: torch.nn.Module) -> None:
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x, edge_index, edge_attr=None):
        extra = () if edge_attr is None else (edge_attr, )
        return self.second(self.first(x, edge_index, *extra).relu(), edge_index, *extra)


def _gin(i: int, o: int) -> GINConv:
    return GINConv(MLP([i, HIDDEN, o]), train_eps=True)


# name -> (builder given the input width, whether it takes edge_attr)
LAYERS = {
    "GCNConv": (lambda f: TwoLayers(GCNConv(f, HIDDEN), GCNConv(HIDDEN, OUT)), False),
    "GCNConv(max)": (lambda f: TwoLayers(GCNConv(f, HIDDEN, aggr="max"),
                                         GCNConv(HIDDEN, OUT, aggr="max")), False),
    "SAGEConv(mean)": (lambda f: TwoLayers(SAGEConv(f, HIDDEN), SAGEConv(HIDDEN, OUT)), False),
    "SAGEConv(max)": (lambda f: TwoLayers(SAGEConv(f, HIDDEN, aggr="max"),
                                          SAGEConv(HIDDEN, OUT, aggr="max")), False),
    "SAGEConv(sum)": (lambda f: TwoLayers(SAGEConv(f, HIDDEN, aggr="sum"),
                                          SAGEConv(HIDDEN, OUT, aggr="sum")), False),
    "GINConv": (lambda f: TwoLayers(_gin(f, HIDDEN), _gin(HIDDEN, OUT)), False),
    "GINEConv": (lambda f: TwoLayers(GINEConv(MLP([f, HIDDEN, HIDDEN]), edge_dim=EDGE_DIM),
                                     GINEConv(MLP([HIDDEN, HIDDEN, OUT]), edge_dim=EDGE_DIM)),
                 True),
    "GraphConv(min)": (lambda f: TwoLayers(GraphConv(f, HIDDEN, aggr="min"),
                                           GraphConv(HIDDEN, OUT, aggr="min")), False),
    "GATConv": (lambda f: TwoLayers(GATConv(f, HIDDEN, heads=2),
                                    GATConv(2 * HIDDEN, OUT, heads=2, concat=False)), False),
    "GATConv(edge_dim)": (lambda f: TwoLayers(
        GATConv(f, HIDDEN, heads=2, edge_dim=EDGE_DIM),
        GATConv(2 * HIDDEN, OUT, edge_dim=EDGE_DIM)), True),
    "GATv2Conv": (lambda f: TwoLayers(GATv2Conv(f, HIDDEN, heads=2, edge_dim=EDGE_DIM),
                                      GATv2Conv(2 * HIDDEN, OUT, edge_dim=EDGE_DIM)), True),
    "TransformerConv": (lambda f: TwoLayers(
        TransformerConv(f, HIDDEN, heads=2, edge_dim=EDGE_DIM),
        TransformerConv(2 * HIDDEN, OUT, edge_dim=EDGE_DIM)), True),
}


def forms(name: str):
    r"""Edge features travel with ``edge_index`` only."""
    return ("edge_index", ) if LAYERS[name][1] else ("edge_index", "adj_t")


def build(name: str, in_channels: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return LAYERS[name][0](in_channels)


def train_steps(model: torch.nn.Module, name: str, x, adj, edge_attr, n_id, reduce=None):
    r""":data:`STEPS` SGD steps of a fixed linear loss; per step the output
    and the weight gradients (summed over ranks by :obj:`reduce`)."""
    from tests.models import linear_loss
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        out = model(x, adj, edge_attr) if LAYERS[name][1] else model(x, adj)
        linear_loss(out, n_id).backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        if reduce is not None:
            for g in grads.values():
                reduce(g)
        steps.append((out.detach(), grads))
        if reduce is not None:  # every rank steps on the summed gradient
            for k, p in model.named_parameters():
                p.grad.copy_(grads[k])
        optimizer.step()
    return steps


def every_layer(roots):
    r"""Every layer of :data:`LAYERS` and form, under the sequential
    exchange, on each partition of :obj:`roots`; plus the bytes a GraphSAGE
    pass moves under both exchanges."""
    import pyg_dist
    results = {}
    for root in roots:
        part = pyg_dist.DistData.load(root, dist.get_rank())
        n_id = part.n_id[:part.num_inner]
        results[root, "n_id"] = n_id
        for name in LAYERS:
            for form in forms(name):
                model = pyg_dist.nn.distribute(build(name, part.num_features), part,
                                               exchange="sequential")
                results[root, name, form] = train_steps(model, name, part.x, part[form],
                                                        part.edge_attr, n_id, dist.all_reduce)
    return results


def bytes_and_composition(root: str):
    r"""One pass of a 2-layer GraphSAGE under both exchanges (bytes per
    key), under bf16 rows, with the next peer's rows fetched ahead
    (``overlap=True``; GAT and GIN, two steps), and under a BNS plan
    (against the halo exchange on the same plan)."""
    import pyg_dist
    from pyg_dist.sampler import build_sampler
    from tests.models import linear_loss
    part = pyg_dist.DistData.load(root, dist.get_rank())
    n_id = part.n_id[:part.num_inner]
    out = {"num_halo": part.num_halo, "num_send": part.send_index.numel()}
    for exchange in ("halo", "sequential"):
        for dtype in ("fp32", "bf16"):
            model = pyg_dist.nn.distribute(build("SAGEConv(mean)", part.num_features), part,
                                           exchange=exchange, exchange_dtype=dtype)
            (y, grads), = train_steps(model, "SAGEConv(mean)", part.x, part.adj_t, None,
                                      n_id, dist.all_reduce)[:1]
            out[exchange, dtype] = (y, grads, dict(model.comm_stats.bytes_sent),
                                    dict(model.comm_stats.bytes_recv))
        for name in ("GATConv", "GINConv"):  # the next peer's rows fetched ahead
            model = pyg_dist.nn.distribute(build(name, part.num_features), part,
                                           exchange=exchange, overlap=True)
            out[exchange, "overlap", name] = train_steps(model, name, part.x, part.edge_index,
                                                         None, n_id, dist.all_reduce)
            out[exchange, "sent", name] = dict(model.comm_stats.bytes_sent)
        for aggr, keep in (("mean", 0.5), ("max", 0.5), ("mean", 0.0)):  # 0: nothing travels
            model = pyg_dist.nn.distribute(build(f"SAGEConv({aggr})", part.num_features),
                                           part, exchange=exchange)
            sampler = build_sampler("bns", part, seed=3, p=keep)
            with model.dist_context.use(sampler.plan(0)):
                y = model(part.x, part.adj_t)
                linear_loss(y, n_id).backward()
            grads = {k: p.grad.clone() for k, p in model.named_parameters()}
            for g in grads.values():
                dist.all_reduce(g)
            out[exchange, "bns", aggr, keep] = (y.detach(), grads)
    return out


def refusals(root: str):
    r"""What the sequential exchange refuses, each before any work."""
    import pyg_dist
    from torch_geometric.nn import APPNP, GraphSAGE, MessagePassing, PNAConv
    from pyg_dist.cache import FeatureCache, PipelineCache
    part = pyg_dist.DistData.load(root, dist.get_rank())
    f = part.num_features
    attempts = {
        "PNAConv": lambda: pyg_dist.nn.distribute(
            PNAConv(f, 4, ["mean", "max"], ["identity"], torch.ones(3)), part,
            exchange="sequential"),
        "APPNP": lambda: pyg_dist.nn.distribute(APPNP(2, 0.1), part, exchange="sequential"),
        "SAGEConv(std)": lambda: pyg_dist.nn.distribute(SAGEConv(f, 4, aggr="std"), part,
                                                         exchange="sequential"),
        "pipeline": lambda: pyg_dist.nn.distribute(SAGEConv(f, 4), part, exchange="sequential",
                                                   cache=PipelineCache(1)),
        "overlap": lambda: pyg_dist.nn.distribute(GraphSAGE(f, 4, 2), part,
                                                  exchange="sequential", overlap="nodes"),
        "feature_cache": lambda: pyg_dist.nn.distribute(
            SAGEConv(f, 4), part, exchange="sequential",
            feature_cache=FeatureCache("degree", "10%")),
    }
    class Biased(MessagePassing):  # a user's layer whose update must run once
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def update(self, aggr_out):
            return aggr_out + 1

    attempts["Biased"] = lambda: pyg_dist.nn.distribute(Biased(), part, exchange="sequential")
    attention = pyg_dist.nn.distribute(TransformerConv(f, 4), part, exchange="sequential")
    attempts["attention weights"] = lambda: attention(part.x, part.edge_index,
                                                      return_attention_weights=True)
    out = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            out[name] = None
        except (NotImplementedError, ValueError) as e:
            out[name] = (type(e).__name__, str(e))
    return out


def layer_input_freed(root: str):
    r"""Whether the second layer's input of a 2-layer model is freed once
    backward ran, while the loss (and so the step's graph) is still held,
    under each exchange; GraphSAGE (mean)."""
    import weakref

    import pyg_dist
    from tests.models import linear_loss
    freed = {}
    for exchange in ("halo", "sequential"):
        part = pyg_dist.DistData.load(root, dist.get_rank())  # its graph, transpose-free
        n_id = part.n_id[:part.num_inner]
        model = pyg_dist.nn.distribute(build("SAGEConv(mean)", part.num_features), part,
                                       exchange=exchange)
        seen = []
        model.second.register_forward_pre_hook(
            lambda module, args: seen.append(weakref.ref(args[0])))
        loss = linear_loss(model(part.x, part.edge_index), n_id)
        graph = model.dist_context.plan.adjacency("mean", True)
        transposed = kept(graph, "mean") is not None
        loss.backward()
        freed[exchange] = (seen[0]() is None, transposed)
        del loss
    return freed


def linear_forward_allocations(root: str):
    r"""How many new buffers of its aggregation's output size a linear
    layer's sequential forward allocates (GraphSAGE's mean, no gradient, a
    hidden layer's input), and whether a round's rows sent or received are
    as many as the inner rows (buffers of that size too: the count would be
    ambiguous)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch_geometric.nn import SAGEConv

    import pyg_dist

    class NewBuffers(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.nbytes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                     if isinstance(t, torch.Tensor) and t.layout == torch.strided}
            self.nbytes += [t.untyped_storage().nbytes() for t in tree_leaves(out)
                            if isinstance(t, torch.Tensor) and t.layout == torch.strided
                            and t.untyped_storage().data_ptr() not in given]
            return out

    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    # 3 -> 8: aggregates, then projects
    model = pyg_dist.nn.distribute(SAGEConv(3, 8), part, exchange="sequential")
    hidden = torch.randn(part.num_inner, 3)  # not the input features: no precomputation
    model(hidden, part.edge_index)  # the plan, its pieces: built once
    with torch.no_grad(), NewBuffers() as mode:
        model(hidden, part.edge_index)
    plan = model.dist_context.plan
    return (mode.nbytes.count(hidden.numel() * 4),
            part.num_inner in set(plan.recv_counts) | set(plan.send_counts))


def precomputed_first_layer(root: str):
    r"""Layers aggregated piece by piece in one training step of a
    GraphSAGE with its first layer precomputed (the precomputation's pass
    included), under the sequential exchange."""
    from torch_geometric.nn import GraphSAGE
    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    model = pyg_dist.nn.distribute(GraphSAGE(part.num_features, HIDDEN, 2, OUT), part,
                                   exchange="sequential", precompute_layer0=True)
    model(part.x, part.adj_t).sum().backward()
    return model.comm_stats.counts["sequential_layers"], model.dist_engine.name


#: The models of budgeted(), and the form of the graph each is given.
BUDGETED = {"GCNConv": "adj_t", "SAGEConv(mean)": "edge_index", "GATConv": "edge_index"}


def budgeted(root: str):
    r"""Two SGD steps of GCN, SAGE and GAT models under the sequential
    exchange with memory budgets that let no layer, only the first (GCN's,
    whose rows are :data:`HIDDEN` wide), only the second (:data:`OUT` wide)
    or every layer receive its whole halo at once: per budget the steps,
    each layer's choice and the layers aggregated piece by piece."""
    import pyg_dist
    part = pyg_dist.DistData.load(root, dist.get_rank())
    n_id = part.n_id[:part.num_inner]
    halo = torch.tensor([part.num_halo])
    dist.all_reduce(halo, op=dist.ReduceOp.MAX)
    row = int(halo) * 4  # bytes of one float column of the largest halo
    rank = dist.get_rank()
    budgets = {"none": 0, "first": HIDDEN * row, "second": OUT * row, "all": 10 ** 12,
               # ranks given different budgets take the smallest, none where one has none
               "one rank none": None if rank == 0 else 10 ** 12,
               "one rank 0": 0 if rank == 1 else 10 ** 12}
    out = {"n_id": n_id}
    for name, form in BUDGETED.items():
        for label, budget in budgets.items():
            if name != "GCNConv" and label not in ("none", "all"):
                continue
            model = pyg_dist.nn.distribute(build(name, part.num_features), part,
                                           exchange="sequential", memory_budget=budget)
            steps = train_steps(model, name, part.x, part[form], part.edge_attr, n_id,
                                dist.all_reduce)
            out[name, label] = (steps, model.dist_engine.choices(),
                                model.comm_stats.counts.get("sequential_layers", 0))
    return out
