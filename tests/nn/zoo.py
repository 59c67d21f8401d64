r"""PyG's layer zoo as the enumeration test builds it: every conv of
``torch_geometric.nn.conv.__all__``, every norm of ``torch_geometric.nn.norm``
and the BasicGNN models, with default arguments plus the options that change
the maths, run on one homogeneous graph (12 features, 3 edge features)."""
import torch
from torch.nn import Linear, Sequential, ReLU
import torch_geometric.nn as gnn
from torch_geometric.utils import to_torch_csr_tensor

F, C, E = 12, 6, 3  # input features, output channels, edge features


def _mlp(i=F, o=C):
    return Sequential(Linear(i, 8), ReLU(), Linear(8, o))


class ConvThenNorm(torch.nn.Module):
    r"""A GCN layer followed by a norm: how norms appear in models."""

    def __init__(self, norm: torch.nn.Module, width: int = C) -> None:
        super().__init__()
        self.conv = gnn.GCNConv(F, width)
        self.norm = norm

    def forward(self, x, edge_index):
        return self.norm(self.conv(x, edge_index).relu())


# name -> (builder, what its forward needs beyond (x, edge_index)):
# "edge_attr": per-edge features; "x0": the initial features (x is F wide);
# "pos": node positions (the first three features).
CONVS = {
    "SimpleConv": (lambda: gnn.SimpleConv(), ()),
    "GCNConv": (lambda: gnn.GCNConv(F, C), ()),
    "GCNConv(improved)": (lambda: gnn.GCNConv(F, C, improved=True), ()),
    "GCNConv(normalize=False)": (lambda: gnn.GCNConv(F, C, normalize=False), ()),
    "GCNConv(add_self_loops=False)": (lambda: gnn.GCNConv(F, C, add_self_loops=False), ()),
    "ChebConv": (lambda: gnn.ChebConv(F, C, K=3), ()),
    "ChebConv(rw)": (lambda: gnn.ChebConv(F, C, K=2, normalization="rw"), ()),
    "SAGEConv": (lambda: gnn.SAGEConv(F, C), ()),
    "SAGEConv(max)": (lambda: gnn.SAGEConv(F, C, aggr="max"), ()),
    "SAGEConv(lstm)": (lambda: gnn.SAGEConv(F, C, aggr="lstm"), ()),
    "SAGEConv(project)": (lambda: gnn.SAGEConv(F, C, project=True), ()),
    "GraphConv": (lambda: gnn.GraphConv(F, C), ()),
    "GraphConv(mean)": (lambda: gnn.GraphConv(F, C, aggr="mean"), ()),
    "GatedGraphConv": (lambda: gnn.GatedGraphConv(16, 2), ()),
    "ResGatedGraphConv": (lambda: gnn.ResGatedGraphConv(F, C), ()),
    "GATConv": (lambda: gnn.GATConv(F, C, heads=2), ()),
    "GATConv(edge_dim)": (lambda: gnn.GATConv(F, C, heads=2, edge_dim=E), ("edge_attr", )),
    "GATv2Conv": (lambda: gnn.GATv2Conv(F, C, heads=2), ()),
    "TransformerConv": (lambda: gnn.TransformerConv(F, C, heads=2), ()),
    "AGNNConv": (lambda: gnn.AGNNConv(), ()),
    "TAGConv": (lambda: gnn.TAGConv(F, C), ()),
    "GINConv": (lambda: gnn.GINConv(_mlp()), ()),
    "GINEConv": (lambda: gnn.GINEConv(_mlp(), edge_dim=E), ("edge_attr", )),
    "ARMAConv": (lambda: gnn.ARMAConv(F, C), ()),
    "SGConv": (lambda: gnn.SGConv(F, C, K=2), ()),
    "SSGConv": (lambda: gnn.SSGConv(F, C, alpha=0.1), ()),
    "APPNP": (lambda: gnn.APPNP(K=3, alpha=0.1), ()),
    "MFConv": (lambda: gnn.MFConv(F, C), ()),
    "NNConv": (lambda: gnn.NNConv(F, C, Sequential(Linear(E, F * C))), ("edge_attr", )),
    "CGConv": (lambda: gnn.CGConv(F, dim=E), ("edge_attr", )),
    "EdgeConv": (lambda: gnn.EdgeConv(_mlp(2 * F)), ()),
    "FeaStConv": (lambda: gnn.FeaStConv(F, C), ()),
    "LEConv": (lambda: gnn.LEConv(F, C), ()),
    "PNAConv": (lambda: gnn.PNAConv(F, C, ["mean", "max"], ["identity", "amplification"],
                                    deg=torch.tensor([0, 4, 8, 4, 2])), ()),
    "ClusterGCNConv": (lambda: gnn.ClusterGCNConv(F, C), ()),
    "GENConv": (lambda: gnn.GENConv(F, C), ()),
    "GENConv(msg_norm)": (lambda: gnn.GENConv(F, C, msg_norm=True, learn_msg_scale=True), ()),
    "GCN2Conv": (lambda: gnn.GCN2Conv(F, alpha=0.1), ("x0", )),
    "WLConvContinuous": (lambda: gnn.WLConvContinuous(), ()),
    "FiLMConv": (lambda: gnn.FiLMConv(F, C), ()),
    "SuperGATConv": (lambda: gnn.SuperGATConv(F, C), ()),
    "FAConv": (lambda: gnn.FAConv(F), ("x0", )),
    "EGConv": (lambda: gnn.EGConv(F, 16), ()),
    "PDNConv": (lambda: gnn.PDNConv(F, C, edge_dim=E, hidden_channels=8), ("edge_attr", )),
    "GeneralConv": (lambda: gnn.GeneralConv(F, C), ()),
    "LGConv": (lambda: gnn.LGConv(), ()),
    "AntiSymmetricConv": (lambda: gnn.AntiSymmetricConv(F), ()),
    "DirGNNConv": (lambda: gnn.DirGNNConv(gnn.SAGEConv(F, C)), ()),
    "MixHopConv": (lambda: gnn.MixHopConv(F, C), ()),
    "GPSConv": (lambda: gnn.GPSConv(F, gnn.GCNConv(F, F), heads=2), ()),
    "PointTransformerConv": (lambda: gnn.PointTransformerConv(F, C), ("pos", )),
}

# Convs of __all__ that do not take a homogeneous (x, edge_index) graph.
NOT_APPLICABLE = {
    "MessagePassing": "the base class",
    "CuGraphSAGEConv": "needs pylibcugraphops (GPU)",
    "CuGraphGATConv": "needs pylibcugraphops (GPU)",
    "CuGraphRGCNConv": "needs pylibcugraphops (GPU)",
    "FusedGATConv": "needs dgNN (GPU) and CSR/CSC inputs",
    "GravNetConv": "builds its own k-NN graph from the features (no edge_index)",
    "DynamicEdgeConv": "builds its own k-NN graph from the features (no edge_index)",
    "XConv": "point clouds (pos, no edge_index)",
    "PointNetConv": "point clouds (needs pos)",
    "PPFConv": "point clouds (needs pos and normals)",
    "PointGNNConv": "point clouds (needs pos)",
    "GMMConv": "needs pseudo-coordinates per edge",
    "SplineConv": "needs torch-spline-conv and pseudo-coordinates",
    "RGCNConv": "relational (edge_type)",
    "FastRGCNConv": "relational (edge_type)",
    "RGATConv": "relational (edge_type)",
    "HEATConv": "heterogeneous (node_type, edge_type)",
    "HGTConv": "heterogeneous (dicts)",
    "HANConv": "heterogeneous (dicts)",
    "HeteroConv": "heterogeneous (dicts)",
    "SignedConv": "signed graphs (positive and negative edge_index)",
    "HypergraphConv": "hypergraphs (hyperedge_index)",
    "DNAConv": "takes every layer's history, x of shape [N, L, C]",
    "WLConv": "colour refinement on integer labels (no gradients)",
    "PANConv": "needs torch-sparse",
    "MeshCNNConv": "meshes (edge features on mesh edges)",
}

NORMS = {
    "torch.nn.BatchNorm1d": lambda: torch.nn.BatchNorm1d(C),
    "BatchNorm": lambda: gnn.BatchNorm(C),
    "InstanceNorm": lambda: gnn.InstanceNorm(C),
    "LayerNorm": lambda: gnn.LayerNorm(C),
    "LayerNorm(node)": lambda: gnn.LayerNorm(C, mode="node"),
    "GraphNorm": lambda: gnn.GraphNorm(C),
    "GraphSizeNorm": lambda: gnn.GraphSizeNorm(),
    "PairNorm": lambda: gnn.PairNorm(),
    "MeanSubtractionNorm": lambda: gnn.MeanSubtractionNorm(),
    "DiffGroupNorm": lambda: gnn.DiffGroupNorm(C, groups=2),
    "torch.nn.LayerNorm": lambda: torch.nn.LayerNorm(C),
}

NORMS_NOT_APPLICABLE = {
    "HeteroBatchNorm": "heterogeneous (type_vec)",
    "HeteroLayerNorm": "heterogeneous (type_vec)",
    "MessageNorm": "normalises messages inside a layer: tried as GENConv(msg_norm)",
}

MODELS = {
    "GCN": lambda: gnn.GCN(F, 8, 2, C),
    "GraphSAGE": lambda: gnn.GraphSAGE(F, 8, 2, C),
    "GraphSAGE(layer_norm)": lambda: gnn.GraphSAGE(F, 8, 2, C, norm="layer_norm"),
    "GIN": lambda: gnn.GIN(F, 8, 2, C),
    "GAT": lambda: gnn.GAT(F, 8, 2, C, heads=2),
    "PNA": lambda: gnn.PNA(F, 8, 2, C, aggregators=["mean", "max"],
                           scalers=["identity"], deg=torch.tensor([0, 4, 8, 4, 2])),
    "EdgeCNN": lambda: gnn.EdgeCNN(F, 8, 2, C),
    "GCN(jk=cat)": lambda: gnn.GCN(F, 8, 2, C, jk="cat"),
    "GCN(batch_norm)": lambda: gnn.GCN(F, 8, 2, C, norm="batch_norm"),
}


# What the enumeration test expects distribute() to refuse; everything else
# in CONVS, NORMS and MODELS must equal PyG.
REFUSED = {
    "SAGEConv(lstm)", "ARMAConv", "DirGNNConv", "GPSConv", "SuperGATConv",
}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name in CONVS:
        return CONVS[name][0]()
    if name in NORMS:
        return ConvThenNorm(NORMS[name]())
    return MODELS[name]()


def extras(name: str):
    return CONVS[name][1] if name in CONVS else ()


def all_names():
    return list(CONVS) + list(NORMS) + list(MODELS)


def zoo_graph():
    from tests.conftest import small_graph
    data = small_graph()
    gen = torch.Generator().manual_seed(5)
    data.edge_attr = torch.randn(data.num_edges, E, generator=gen)
    data.adj_t = to_torch_csr_tensor(data.edge_index.flip(0), size=(data.num_nodes, ) * 2)
    return data


def call(model: torch.nn.Module, name: str, x, adj, edge_attr):
    need = extras(name)
    if "pos" in need:
        return model(x, x[:, :3], adj)
    if "x0" in need:
        return model(x, x, adj)
    if "edge_attr" in need:
        return model(x, adj, edge_attr)
    return model(x, adj)


def forms(name: str):
    r"""Edge features travel with ``edge_index`` only."""
    return ("edge_index", ) if "edge_attr" in extras(name) else ("edge_index", "adj_t")


def _backward(loss):
    if loss.requires_grad:  # a layer without parameters has nothing to train
        loss.backward()


def reference(data, name: str):
    r"""Single-process PyG on the whole graph, in the order the ranks run:
    per form, a training pass then an evaluation pass (so running
    statistics evolve alike); outputs and the gradients of a fixed linear
    loss, keyed like :func:`zoo_checks`; forms PyG itself cannot run are
    left out."""
    from tests.models import linear_loss
    model, results = build(name), {}
    for form in forms(name):
        for training in (True, False):
            model.train(training)
            model.zero_grad()
            try:
                out = call(model, name, data.x, data[form], data.edge_attr)
            except (NotImplementedError, RuntimeError):  # PyG itself cannot
                continue  # (e.g. MFConv on a torch.sparse adj_t without torch-sparse)
            _backward(linear_loss(out, torch.arange(data.num_nodes)))
            results[form, training] = (out.detach(), {
                k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    return results


def zoo_checks(root: str, names):
    r"""Every layer of :obj:`names` distributed on this rank: outputs,
    summed gradients (train and eval mode), or the exception raised."""
    import torch.distributed as dist
    import pyg_dist
    from tests.models import linear_loss
    part = pyg_dist.DistData.load(root, dist.get_rank())
    n_id = part.n_id[:part.num_inner]
    results = {}
    for name in names:
        try:
            model = pyg_dist.nn.distribute(build(name), part)
        except Exception as e:  # noqa: BLE001 - the refusal is the result
            results[name] = ("distribute", type(e).__name__, str(e))
            continue
        for form in forms(name):
            for training in (True, False):
                try:
                    model.train(training)
                    model.zero_grad()
                    out = call(model, name, part.x, part[form], part.edge_attr)
                    _backward(linear_loss(out, n_id))
                    grads = {k: p.grad.clone() for k, p in model.named_parameters()
                             if p.grad is not None}
                    for g in grads.values():
                        dist.all_reduce(g)
                    results[name, form, training] = (n_id, out.detach(), grads)
                except Exception as e:  # noqa: BLE001
                    results[name, form, training] = ("forward", type(e).__name__,
                                                     (str(e).splitlines() or [""])[0][:200])
    return results
