"""Project before aggregating (DistSAGEConv, DistGraphConv): where the
aggregation is linear and the output narrower, the owners project their rows
and the narrower rows travel; the result equals single-process PyG's over
steps whose weights change; where it would not be exact (max aggregation,
stale rows) the old order, and the raw rows' bytes, stay."""
import pytest
import torch
import torch.distributed as dist
from torch_geometric.nn import GraphConv, GraphSAGE, SAGEConv

import pyg_dist
from pyg_dist.cache import PipelineCache
from tests.models import linear_loss, summed_grads
from tests.numeric import assert_fp32_close, assert_params_close

WIDE, NARROW, OUT = 12, 4, 3  # the graph's 12 features -> 4 -> 3

CASES = {
    "sage-mean": lambda: GraphSAGE(WIDE, NARROW, 2, OUT),
    "sage-sum": lambda: GraphSAGE(WIDE, NARROW, 2, OUT, aggr="sum"),
    "graphconv": lambda: torch.nn.ModuleList([GraphConv(WIDE, NARROW),
                                              GraphConv(NARROW, OUT, aggr="mean")]),
    "sage-max": lambda: GraphSAGE(WIDE, NARROW, 2, OUT, aggr="max"),  # not linear
}
STEPS = 3


def _forward(model, x, adj):
    if isinstance(model, torch.nn.ModuleList):
        return model[1](model[0](x, adj).relu(), adj)
    return model(x, adj)


def _sgd(model, grads: dict) -> None:
    with torch.no_grad():  # the weights change between steps
        for name, p in model.named_parameters():
            p -= 0.5 * grads[name]
            p.grad = None


def run_steps(root: str, stale: bool = False):
    r"""Every case distributed, :data:`STEPS` SGD steps: outputs, summed
    gradients and the bytes of each layer's rows, per step."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    results = {"n_id": part.n_id[:part.num_inner], "num_halo": part.num_halo}
    for name, build in CASES.items():
        torch.manual_seed(0)
        model = pyg_dist.nn.distribute(build(), part,
                                       cache=PipelineCache(1) if stale else None)
        steps = []
        for _ in range(STEPS):
            model.comm_stats.reset()
            out = _forward(model, part.x, part.adj_t)
            linear_loss(out, part.n_id[:part.num_inner]).backward()
            model.dist_context.cache.step()
            grads = summed_grads(model)
            steps.append((out.detach(), grads, dict(model.comm_stats.bytes_sent)))
            _sgd(model, grads)
        model.dist_context.finish()
        results[name] = steps
    return results


@pytest.fixture(scope="module")
def parts(graph, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("parts"))
    pyg_dist.partition_graph(graph, 2, root=root)
    return root


def _reference(graph, name):
    torch.manual_seed(0)
    model = CASES[name]()
    steps = []
    for _ in range(STEPS):
        out = _forward(model, graph.x, graph.edge_index)
        linear_loss(out, torch.arange(graph.num_nodes)).backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        steps.append((out.detach(), grads))
        _sgd(model, grads)
    return steps


def test_projected_layers_match_pyg_and_send_narrower_rows(graph, parts):
    ranks = pyg_dist.spawn(run_steps, 2, (parts, ), timeout=120)
    n_id = torch.cat([r["n_id"] for r in ranks])
    for name in CASES:
        for step, (out, grads) in enumerate(_reference(graph, name)):
            got = torch.cat([r[name][step][0] for r in ranks])
            assert_fp32_close(got, out[n_id], msg=f"{name}, step {step}: outputs")
            assert_params_close(ranks[0][name][step][1], grads, msg=f"{name}, step {step}")
        # The owners sent W x_j (NARROW wide) where the aggregation is linear.
        width = WIDE if name == "sage-max" else NARROW
        assert _layer0_bytes(ranks, name) == sum(r["num_halo"] for r in ranks) * width * 4


def _layer0_bytes(ranks, name: str) -> int:
    key = "0.x" if name == "graphconv" else "convs.0.x"
    return sum(r[name][0][2][key] for r in ranks)


def test_a_stale_cache_keeps_the_raw_rows(parts):
    r"""Under PipeGCN's cache the rows travel as they are (projected rows
    would carry the weights of the iteration they were computed at)."""
    ranks = pyg_dist.spawn(run_steps, 2, (parts, True), timeout=120)
    for name in ("sage-mean", "graphconv"):
        assert _layer0_bytes(ranks, name) == sum(r["num_halo"] for r in ranks) * WIDE * 4


def test_plain_layer_projects_first_and_matches_pyg():
    r"""Outside distribute() too (the neighbour loader's plain models)."""
    from pyg_dist.nn.conv import DistSAGEConv
    from pyg_dist.nn.conv.sage_conv import project_first
    torch.manual_seed(0)
    x, edge_index = torch.randn(30, WIDE), torch.randint(0, 30, (2, 120))
    layer = SAGEConv(WIDE, NARROW)
    ours = SAGEConv(WIDE, NARROW)
    ours.load_state_dict(layer.state_dict())
    ours = project_first(ours)
    assert type(ours) is DistSAGEConv
    aggregated = []  # the width of the rows each propagate aggregates
    for conv in (ours, wide := project_first(SAGEConv(WIDE, 2 * WIDE))):
        conv.register_propagate_forward_pre_hook(
            lambda module, inputs: aggregated.append(inputs[2]["x"][0].size(-1)))
    assert_fp32_close(ours(x, edge_index), layer(x, edge_index))
    wide(x, edge_index)
    assert aggregated == [NARROW, WIDE]  # projected; a wider output: aggregated as it is
