"""Per-layer trimming of the neighbour loader's batches (pyg_dist.nn.trim):
each layer computes only the rows the next one reads, and the seeds' outputs
and the weight gradients equal the untrimmed model's."""
import pytest
import torch
import torch.distributed as dist
from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE

import pyg_dist
from pyg_dist.loader import PartitionNeighborLoader
from pyg_dist.nn.conv.sage_conv import project_first
from pyg_dist.nn.trim import layer_sizes, trimmed, trims
from tests.numeric import assert_fp32_close, assert_params_close

MODELS = {
    "GraphSAGE": lambda f: GraphSAGE(f, 16, 3, 5),
    "GraphSAGE-sum-projected": lambda f: project_first(GraphSAGE(f, 6, 3, 5, aggr="sum")),
    "GCN": lambda f: GCN(f, 16, 3, 5),
    "GIN": lambda f: GIN(f, 16, 3, 5),
    "GAT": lambda f: GAT(f, 8, 3, 5, heads=2),
    "GraphSAGE-layernorm": lambda f: GraphSAGE(f, 16, 3, 5, norm=torch.nn.LayerNorm(16)),
}


def both_ways(root: str):
    r"""Per model and batch: the seeds' rows and the gradients, untrimmed
    and trimmed, and the rows each layer computed when trimmed."""
    data = pyg_dist.DistData.load(root, dist.get_rank())
    loader = PartitionNeighborLoader(data, [4, 3, 2], batch_size=25)
    out = {}
    try:
        for step, batch in enumerate(loader):
            for name, build in MODELS.items():
                torch.manual_seed(0)
                model = build(data.num_features)
                assert trims(model), name
                graph = batch.edge_index if name == "GAT" else batch.adj_t
                runs = []
                for trim in (False, True):
                    model.zero_grad()
                    rows = []
                    hooks = [conv.register_forward_hook(
                        lambda m, a, o: rows.append(o.size(0))) for conv in model.convs]
                    with trimmed(model, batch.adj_t, batch.num_sampled_nodes) if trim \
                            else torch.enable_grad():
                        seeds = model(batch.x, graph)[:batch.batch_size]
                    for hook in hooks:
                        hook.remove()
                    seeds.square().sum().backward()
                    runs.append((seeds.detach(), {k: p.grad.clone()
                                                  for k, p in model.named_parameters()},
                                 rows))
                out[step, name] = (runs, layer_sizes(batch.num_sampled_nodes, 3),
                                   batch.batch_size)
            if step == 1:
                break
    finally:
        loader.close()
    return out


@pytest.fixture(scope="module")
def results(graph, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("parts"))
    pyg_dist.partition_graph(graph, 2, root=root)
    return pyg_dist.spawn(both_ways, 2, (root, ), timeout=120)


def test_trimmed_layers_equal_the_untrimmed_model(results):
    for rank in results:
        for (step, name), (runs, sizes, batch_size) in rank.items():
            (full, full_grads, full_rows), (cut, cut_grads, cut_rows) = runs
            what = f"{name}, batch {step}"
            assert_fp32_close(cut, full, msg=f"{what}: seeds' outputs")
            assert_params_close(cut_grads, full_grads, msg=f"{what}: grad")
            assert full_rows == [sizes[0]] * 3  # untrimmed: every row, every layer
            assert cut_rows == sizes[1:] and cut_rows[-1] == batch_size
            assert cut_rows[0] < sizes[0]  # the first layer left the last hop out


def test_what_is_trimmed():
    assert trims(GraphSAGE(4, 8, 2, 3)) and trims(GCN(4, 8, 2, 3)) and trims(GAT(4, 8, 2, 3))
    assert not trims(GraphSAGE(4, 8, 2, 3, norm="batch_norm"))  # batch statistics
    assert not trims(GraphSAGE(4, 8, 2, 3, norm="layer_norm"))  # PyG's: over the graph
    assert not trims(GraphSAGE(4, 8, 2, 3, jk="cat"))  # reads every layer's rows
    assert not trims(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match="2 hops for a model of 3 layers"):
        layer_sizes([5, 4, 3], 3)
