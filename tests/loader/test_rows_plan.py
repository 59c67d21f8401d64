"""The neighbour loader's first layer projected by the rows' owners
(pyg_dist.loader.neighbor.rows_plan): the seeds' outputs and the weight
gradients summed over the ranks equal a plain PyG model's on the pulled
batch, whether an owner projects its whole partition or the rows read."""
import json

import pytest
import torch
import torch.distributed as dist
from torch_geometric.nn import GCN, GraphConv, GraphSAGE
from torch_geometric.nn.models.basic_gnn import BasicGNN

import pyg_dist
from pyg_dist.config import TrainConfig
from pyg_dist.datasets import synthetic_communities
from pyg_dist.loader import PartitionNeighborLoader
from pyg_dist.loader.neighbor import projects_on_owners
from pyg_dist.nn.conv.sage_conv import project_first
from pyg_dist.nn.trim import trimmed
from pyg_dist.train import load_model
from tests.loader.neighbor_fast_workers import train_run
from tests.numeric import assert_fp32_close, assert_params_close, assert_scalar_close

FEATURES = 40


class GraphConvGNN(BasicGNN):
    supports_edge_weight, supports_edge_attr, supports_norm_batch = True, False, True

    def init_conv(self, in_channels, out_channels, **kwargs):
        return GraphConv(in_channels, out_channels, aggr="mean", **kwargs)


MODELS = {
    "GraphSAGE": lambda: project_first(GraphSAGE(FEATURES, 8, 3, 5)),
    "GraphSAGE-sum-normalize": lambda: project_first(
        GraphSAGE(FEATURES, 6, 3, 5, aggr="sum", normalize=True)),
    "GraphSAGE-no-root": lambda: project_first(GraphSAGE(FEATURES, 12, 3, 5,
                                                         root_weight=False)),
    "GraphConv": lambda: GraphConvGNN(FEATURES, 8, 3, 5),
}


def _summed_grads(model) -> dict:
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    for grad in grads.values():
        dist.all_reduce(grad)
    return grads


def both_ways(root: str, batch_size: int):
    r"""Per model and step: the seeds' outputs and the summed gradients of a
    plain model on the pulled batch, and of the owner-projected batch."""
    data = pyg_dist.DistData.load(root, dist.get_rank())
    out = {}
    for name, build in MODELS.items():
        torch.manual_seed(0)
        model = build()
        assert projects_on_owners(model, FEATURES), name
        loaders = [PartitionNeighborLoader(data, [4, 3, 2], batch_size, seed=1),
                   PartitionNeighborLoader(data, [4, 3, 2], batch_size, seed=1, model=model)]
        assert [loader.owners_project for loader in loaders] == [False, True]
        try:
            for step, (pulled, projected) in enumerate(zip(*loaders)):
                assert projected.x.size(1) == 0 and pulled.x.size(1) == FEATURES
                assert torch.equal(pulled.global_id, projected.global_id)
                runs = []
                for batch in (pulled, projected):
                    model.zero_grad()
                    with trimmed(model, batch.adj_t, batch.num_sampled_nodes,
                                 batch.rows_plan) if batch is projected else torch.enable_grad():
                        seeds = model(batch.x, batch.adj_t)[:batch.batch_size]
                    # a fixed random direction: with normalize=True the seeds'
                    # rows have unit norm, and a norm-based loss has no gradient
                    probe = torch.randn(seeds.shape, generator=torch.Generator().manual_seed(step))
                    (seeds * probe).sum().backward()
                    runs.append((seeds.detach(), _summed_grads(model)))
                out[name, step] = (runs, projected.rows_plan.own is None)
                if step == 2:
                    break
        finally:
            for loader in loaders:
                loader.close()
    return out


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    graph = synthetic_communities(num_nodes=300, num_classes=5, num_features=FEATURES,
                                  num_communities=8, avg_degree=8, seed=3)
    root = str(tmp_path_factory.mktemp("parts"))
    pyg_dist.partition_graph(graph, 2, root=root)
    return root


# 2 seeds read a part of each partition (owners gather those rows); 200 most of it.
@pytest.mark.parametrize("batch_size,whole", [(2, False), (200, True)])
def test_owner_projected_first_layer_equals_the_pulled_batch(parts, batch_size, whole):
    for rank in pyg_dist.spawn(both_ways, 2, (parts, batch_size), timeout=180):
        for (name, step), (((full, full_grads), (cut, cut_grads)), projected_whole) in \
                rank.items():
            what = f"{name}, batch {step}"
            assert projected_whole == whole, what
            assert_fp32_close(cut, full, msg=f"{what}: seeds' outputs")
            assert_params_close(cut_grads, full_grads, msg=f"{what}: summed grads")


def test_which_first_layers_the_owners_project():
    assert projects_on_owners(GraphSAGE(40, 8, 2, 3), 40)  # 2 x (8 + 8) < 40
    assert not projects_on_owners(GraphSAGE(30, 8, 2, 3), 30)  # the rows would not narrow
    assert not projects_on_owners(GraphSAGE(40, 8, 2, 3, aggr="max"), 40)  # not linear
    assert not projects_on_owners(GraphSAGE(40, 8, 2, 3, project=True), 40)
    assert not projects_on_owners(GCN(40, 8, 2, 3), 40)
    assert not projects_on_owners(GraphSAGE(40, 8, 2, 3, jk="cat"), 40)  # not trimmed
    assert not projects_on_owners(None, 40)
    kept = GraphSAGE(40, 8, 2, 3)
    kept.convs[0].project_first = False  # PyG's order, everywhere
    assert not projects_on_owners(kept, 40)


def test_training_projects_on_the_owners_with_the_pulled_results(parts, tmp_path):
    r"""``train()`` with the neighbour loader projects the first layer on
    the owners when it can: the losses and the final parameters are those
    of the pulled batches (a one-row feature cache, which serves the same
    rows, keeps the pull), and fewer feature bytes travel."""
    runs = {}
    for name, cache in (("projected", {}),
                        ("pulled", {"feature_cache": "degree", "feature_cache_capacity": "1"})):
        config = TrainConfig(model="sage", num_layers=2, hidden=4, epochs=2, progress=False,
                             loader="neighbor", **cache,
                             loader_args={"fanout": [4, 3], "batch_size": 16})
        out = str(tmp_path / name)
        pyg_dist.spawn(train_run, 2, (parts, config, out), timeout=180)
        rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
        runs[name] = (rows, load_model(out).state_dict())
    (rows, state), (pulled_rows, pulled_state) = runs["projected"], runs["pulled"]
    for row, pulled in zip(rows, pulled_rows):
        assert_scalar_close(row["loss"], pulled["loss"])
        # 2 x 4 projected floats a row, forward; 40 raw ones
        assert row["feature_bytes"] < pulled["feature_bytes"] / 2
    assert_params_close(state, pulled_state, msg="parameters after training")
