"""PyG's layer zoo under distribute(): every conv of torch_geometric.nn.conv,
every norm of torch_geometric.nn.norm and the BasicGNN models either equal
single-process PyG (outputs and gradients, training and evaluation, edge_index
and adj_t, METIS on 2 ranks and random parts on 3) or are refused by name
before any work. A class PyG adds fails here until it is classified."""
import re

import pytest
import torch
import torch_geometric.nn.conv as pyg_conv
import torch_geometric.nn.norm as pyg_norm

import pyg_dist
from pyg_dist.nn.state import state_of
from pyg_dist.nn.support import refusal
from tests.nn import zoo
from tests.numeric import assert_fp32_close, assert_params_close
from tests.conftest import REPO


def _base_name(name: str) -> str:
    return name.split("(")[0].removeprefix("torch.nn.")


def test_every_pyg_class_is_classified():
    tried = {_base_name(n) for n in list(zoo.CONVS) + list(zoo.NORMS)}
    for module, not_applicable in ((pyg_conv, zoo.NOT_APPLICABLE),
                                   (pyg_norm, zoo.NORMS_NOT_APPLICABLE)):
        unclassified = set(module.__all__) - tried - set(not_applicable)
        assert not unclassified, (f"{module.__name__} has classes the layer zoo does not "
                                  f"try yet: {sorted(unclassified)} (add them to tests/nn/zoo.py)")


def _refused(model: torch.nn.Module):
    return [(path, why) for path, m in model.named_modules() if (why := refusal(m))]


@pytest.fixture(scope="module", params=[(2, "metis"), (3, "random")],
                ids=["2-metis", "3-random"])
def zoo_results(request, tmp_path_factory):
    world, method = request.param
    data = zoo.zoo_graph()
    root = str(tmp_path_factory.mktemp(f"zoo{world}"))
    pyg_dist.partition_graph(data, world, root=root, method=method)
    results = pyg_dist.spawn(zoo.zoo_checks, world, (root, zoo.all_names()), timeout=240)
    return data, results


@pytest.mark.parametrize("name", zoo.all_names())
def test_exact_or_refused_by_name(zoo_results, name):
    data, results = zoo_results
    refused = _refused(zoo.build(name))
    assert bool(refused) == (name in zoo.REFUSED), refused
    if refused:
        for r in results:
            stage, error, message = r[name]
            assert (stage, error) == ("distribute", "NotImplementedError"), r[name]
            for path, why in refused:
                assert f"'{path or type(zoo.build(name)).__name__}'" in message
                assert why in message
        return
    for (form, training), (out, grads) in zoo.reference(data, name).items():
        per_rank = [r[name, form, training] for r in results]
        assert isinstance(per_rank[0][0], torch.Tensor), per_rank[0]  # no exception
        n_id = torch.cat([r[0] for r in per_rank])
        where = f"{name} {form} {'train' if training else 'eval'}"
        assert_fp32_close(torch.cat([r[1] for r in per_rank]), out[n_id],
                          msg=f"{where}: outputs")
        assert_params_close(per_rank[0][2], grads, msg=f"{where}: gradient")


def test_supported_layers_table_is_the_manual_s():
    from pyg_dist.nn.support import markdown_table
    import os.path as osp
    page = open(osp.join(REPO, "docs", "layers.md")).read()
    assert markdown_table() in page, \
        "paste pyg_dist.nn.support.markdown_table() into docs/layers.md"


def test_a_refusal_names_every_module_and_why(graph, tmp_path):
    from torch_geometric.nn import GPSConv, GCNConv, SAGEConv
    pyg_dist.partition_graph(graph, 1, root=str(tmp_path))
    pyg_dist.init()
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    model = torch.nn.ModuleDict({"gps": GPSConv(12, GCNConv(12, 12), heads=2),
                                 "sage": SAGEConv(12, 4, aggr="lstm")})
    with pytest.raises(NotImplementedError) as info:
        pyg_dist.nn.distribute(model, part)
    message = str(info.value)
    assert re.search(r"'gps' \(GPSConv\): its global attention", message)
    assert "'gps.attn' (MultiheadAttention)" in message
    assert "'sage.aggr_module' (LSTMAggregation)" in message
    assert type(model["sage"]) is SAGEConv and state_of(model["sage"]) is None  # unconverted


def test_a_norm_given_a_batch_vector_is_refused(graph, tmp_path):
    r"""Several graphs in one partition would need per-graph statistics."""
    from torch_geometric.nn import GraphNorm
    pyg_dist.partition_graph(graph, 1, root=str(tmp_path))
    pyg_dist.init()
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    model = pyg_dist.nn.distribute(zoo.ConvThenNorm(GraphNorm(zoo.C)), part)
    hidden = model.conv(part.x, part.adj_t)
    with pytest.raises(ValueError, match="per-graph `batch` vector"):
        model.norm(hidden, torch.zeros(part.num_inner, dtype=torch.long))
