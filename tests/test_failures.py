"""A dead or mismatched rank makes every other rank fail fast, never hang."""
import re
import time

import pytest
import torch
from torch_geometric.nn import ARMAConv, SuperGATConv

import pyg_dist
from tests.dist_workers import die_mid_epoch, wrong_world_size


def test_dead_rank_makes_others_raise_within_timeout(graph, tmp_path):
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        pyg_dist.spawn(die_mid_epoch, 2, (str(tmp_path), 1), timeout=10)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "rank 1 died (exit code 3)" in message
    # the survivor raised its own error (its collective failed); it was not
    # merely terminated after hanging
    assert "rank 0: " in message and "did not finish" not in message
    assert elapsed < 10 + 15


def test_world_size_mismatch_is_refused(graph, tmp_path):
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    with pytest.raises(RuntimeError, match="holds 2 partitions but the world size is 3"):
        pyg_dist.spawn(wrong_world_size, 3, (str(tmp_path), ), timeout=10)


@pytest.mark.parametrize("layer", [ARMAConv(4, 4), SuperGATConv(4, 4)])
def test_unsupported_layer_named(graph, tmp_path, layer):
    pyg_dist.partition_graph(graph, 1, root=str(tmp_path))
    pyg_dist.init()
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    model = torch.nn.ModuleDict({"conv": layer})
    with pytest.raises(NotImplementedError, match=re.escape(f"'conv' ({type(layer).__name__})")):
        pyg_dist.nn.distribute(model, part)


def test_wrong_rows_named(graph, tmp_path):
    from torch_geometric.nn import SAGEConv
    pyg_dist.partition_graph(graph, 1, root=str(tmp_path))
    pyg_dist.init()
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    conv = pyg_dist.nn.distribute(SAGEConv(part.num_features, 4), part)
    with pytest.raises(ValueError, match="owns 240 inner nodes"):
        conv(torch.randn(7, part.num_features), part.edge_index)
