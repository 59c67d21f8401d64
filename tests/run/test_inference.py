"""Distributed inference predicts every node once, by original id, exactly."""
import os.path as osp

import torch
from torch_geometric.nn import GraphSAGE

import pyg_dist


def _predict(model, root, out_dir):
    return pyg_dist.predict(model, root, out_dir=out_dir, gather=True)


def test_predict_equals_pyg_by_original_id(graph, tmp_path):
    root, out_dir = str(tmp_path / "parts"), str(tmp_path / "pred")
    pyg_dist.partition_graph(graph, 2, root=root)
    torch.manual_seed(0)
    model = GraphSAGE(graph.num_features, 16, 2, 5)
    gathered, nothing = pyg_dist.spawn(_predict, 2, (model, root, out_dir))
    expected = model(graph.x, graph.edge_index).argmax(-1)
    assert nothing is None and torch.equal(gathered, expected)
    files = [torch.load(osp.join(out_dir, f"pred_{r}.pt"), weights_only=True)
             for r in range(2)]
    ids = torch.cat([f["n_id"] for f in files])
    assert torch.equal(ids.sort().values, torch.arange(graph.num_nodes))
    for f in files:
        assert torch.equal(f["pred"], expected[f["n_id"]])
    assert all(p.grad is None for p in model.parameters())  # the model stays plain
    assert not hasattr(model, "dist_context")


def _predict_redrawing(model, root):
    from functools import partialmethod

    from tqdm import tqdm
    # A bar that redraws at every layer, as one does wherever a layer takes
    # longer than its refresh interval (or with TQDM_MININTERVAL=0).
    tqdm.__init__ = partialmethod(tqdm.__init__, mininterval=0)
    return pyg_dist.predict(model, root, gather=True, progress=True)


def test_progress_bar_leaves_the_layers_outputs_alone(graph, tmp_path):
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(graph, 2, root=root)
    torch.manual_seed(0)
    model = GraphSAGE(graph.num_features, 16, 3, 5)
    gathered, _ = pyg_dist.spawn(_predict_redrawing, 2, (model, root))
    assert torch.equal(gathered, model(graph.x, graph.edge_index).argmax(-1))
