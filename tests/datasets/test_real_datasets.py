"""The OGB and PyG loaders run offline on tiny datasets laid out on disk as
their own download would leave them."""
import gzip
import json
import os
import os.path as osp

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from pyg_dist.datasets import DatasetNotFound, evaluate, load
from tests.conftest import small_graph
from tests.numeric import assert_fp32_close


def _csv_gz(path, rows):
    with gzip.open(path, "wt") as f:
        for row in np.atleast_2d(rows).reshape(len(rows), -1):
            f.write(",".join(str(v) for v in row) + "\n")


def write_ogbn_arxiv(root, graph):
    r"""``root/ogbn_arxiv`` as OGB's arxiv.zip unpacks: raw CSVs, the time
    split and the release marker."""
    folder = osp.join(root, "ogbn_arxiv")
    raw, split = osp.join(folder, "raw"), osp.join(folder, "split", "time")
    os.makedirs(raw), os.makedirs(split)
    n = graph.num_nodes
    directed = graph.edge_index[:, graph.edge_index[0] < graph.edge_index[1]]
    _csv_gz(osp.join(raw, "edge.csv.gz"), directed.t().numpy())
    _csv_gz(osp.join(raw, "node-feat.csv.gz"), graph.x.numpy())
    _csv_gz(osp.join(raw, "node-label.csv.gz"), graph.y.view(-1, 1).numpy())
    _csv_gz(osp.join(raw, "node_year.csv.gz"), np.full((n, 1), 2020))
    _csv_gz(osp.join(raw, "num-node-list.csv.gz"), np.array([[n]]))
    _csv_gz(osp.join(raw, "num-edge-list.csv.gz"), np.array([[directed.size(1)]]))
    for key, part in (("train", "train"), ("val", "valid"), ("test", "test")):
        _csv_gz(osp.join(split, f"{part}.csv.gz"),
                graph[f"{key}_mask"].nonzero().numpy())
    open(osp.join(folder, "RELEASE_v1.txt"), "w").close()
    return directed


def write_graphsaint(folder, graph, multilabel):
    r"""``folder/raw`` in GraphSAINT's format (Flickr, Yelp, AmazonProducts)."""
    raw = osp.join(folder, "raw")
    os.makedirs(raw)
    n = graph.num_nodes
    adj = sp.csr_matrix((np.ones(graph.num_edges), graph.edge_index.numpy()), shape=(n, n))
    np.savez(osp.join(raw, "adj_full.npz"), data=adj.data, indices=adj.indices,
             indptr=adj.indptr, shape=adj.shape)
    np.save(osp.join(raw, "feats.npy"), graph.x.numpy())
    labels = (torch.nn.functional.one_hot(graph.y, 5) | torch.roll(
        torch.nn.functional.one_hot(graph.y, 5), 1, 1)) if multilabel else graph.y
    with open(osp.join(raw, "class_map.json"), "w") as f:
        json.dump({str(i): labels[i].tolist() for i in range(n)}, f)
    with open(osp.join(raw, "role.json"), "w") as f:
        json.dump({k: graph[f"{m}_mask"].nonzero().view(-1).tolist()
                   for k, m in (("tr", "train"), ("va", "val"), ("te", "test"))}, f)
    return labels


def write_reddit(folder, graph):
    raw = osp.join(folder, "raw")
    os.makedirs(raw)
    types = 1 * graph.train_mask + 2 * graph.val_mask + 3 * graph.test_mask
    np.savez(osp.join(raw, "reddit_data.npz"), feature=graph.x.numpy(),
             label=graph.y.numpy(), node_types=types.numpy())
    n = graph.num_nodes
    sp.save_npz(osp.join(raw, "reddit_graph.npz"), sp.coo_matrix(
        (np.ones(graph.num_edges), graph.edge_index.numpy()), shape=(n, n)))


def _edges(edge_index):
    return set(map(tuple, edge_index.t().tolist()))


def test_ogbn_arxiv_through_ogb(tmp_path):
    graph = small_graph(60)
    write_ogbn_arxiv(str(tmp_path), graph)
    data = load("ogbn-arxiv", str(tmp_path))
    assert_fp32_close(data.x, graph.x)
    assert torch.equal(data.y, graph.y)
    assert _edges(data.edge_index) == _edges(graph.edge_index)  # symmetrised again
    for m in ("train", "val", "test"):
        assert torch.equal(data[f"{m}_mask"], graph[f"{m}_mask"])
    out = torch.nn.functional.one_hot(graph.y, 5).float()
    assert evaluate("ogbn-arxiv", graph.y, out) == 1.0  # OGB's Evaluator
    again = load("ogbn-arxiv", str(tmp_path))  # from ogb's processed file
    assert torch.equal(again.edge_index, data.edge_index)


@pytest.mark.parametrize("name,multilabel", [("flickr", False), ("yelp", True),
                                             ("amazon-products", True)])
def test_graphsaint_datasets_through_pyg(tmp_path, name, multilabel):
    graph = small_graph(50)
    labels = write_graphsaint(str(tmp_path / name), graph, multilabel)
    data = load(name, str(tmp_path))
    assert_fp32_close(data.x, graph.x)
    assert _edges(data.edge_index) == _edges(graph.edge_index)
    assert torch.equal(data.train_mask, graph.train_mask)
    if multilabel:
        assert data.y.dtype == torch.float and torch.equal(data.y, labels.float())
        assert evaluate(name, data.y, data.y * 2 - 1) == 1.0  # micro-F1
        assert evaluate(name, data.y, -torch.ones_like(data.y)) == 0.0
    else:
        assert torch.equal(data.y, graph.y)


def test_reddit_through_pyg(tmp_path):
    graph = small_graph(50)
    write_reddit(str(tmp_path / "reddit"), graph)
    data = load("reddit", str(tmp_path))
    assert torch.equal(data.y, graph.y) and torch.equal(data.test_mask, graph.test_mask)
    assert _edges(data.edge_index) == _edges(graph.edge_index)


@pytest.mark.parametrize("name,where", [("ogbn-products", "ogbn_products"),
                                        ("reddit", os.path.join("reddit", "raw")),
                                        ("yelp", os.path.join("yelp", "raw"))])
def test_missing_dataset_says_where_files_go(tmp_path, name, where):
    with pytest.raises(DatasetNotFound, match="cannot be downloaded here") as info:
        load(name, str(tmp_path))
    assert str(tmp_path / where) in str(info.value)


def test_unknown_dataset(tmp_path):
    with pytest.raises(ValueError, match="Unknown dataset 'cora'"):
        load("cora", str(tmp_path))
