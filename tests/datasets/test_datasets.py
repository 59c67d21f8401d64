import torch
from torch_geometric.utils import is_undirected

from pyg_dist.datasets import load_default, synthetic_communities

SMALL = dict(num_nodes=5000, num_communities=20, num_features=16)


def test_deterministic():
    a, b = synthetic_communities(**SMALL, seed=1), synthetic_communities(
        **SMALL, seed=1)
    c = synthetic_communities(**SMALL, seed=2)
    for key in a.keys():
        assert torch.equal(a[key], b[key]), key
    assert not torch.equal(a.x, c.x)  # a different seed changes the data


def test_shapes_and_graph():
    data = synthetic_communities(**SMALL)
    N, (row, col) = 5000, data.edge_index
    assert data.x.shape == (N, 16) and data.x.dtype == torch.float32
    assert data.y.shape == (N, ) and data.y.dtype == torch.int64
    assert int(data.y.max()) < 10 and len(data.y.unique()) > 1
    assert data.edge_index.dtype == torch.int64
    assert 15 * N <= data.num_edges <= 20 * N  # avg_degree ~20
    assert not bool((row == col).any())  # no self-loops
    assert is_undirected(data.edge_index, num_nodes=N)
    key = row * N + col  # coalesced: strictly increasing (sorted, no dups)
    assert bool((key[1:] > key[:-1]).all())


def test_masks():
    data = synthetic_communities(**SMALL)
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask])
    assert masks.dtype == torch.bool
    assert bool((masks.sum(0) == 1).all())  # disjoint and covering
    assert masks.sum(1).tolist() == [1500, 1000, 2500]


def test_structure():
    data = synthetic_communities(**SMALL)
    row, col = data.edge_index
    intra = (data.community[row] == data.community[col]).float().mean()
    homophily = (data.y[row] == data.y[col]).float().mean()
    assert 0.75 < intra < 0.85
    assert homophily > 0.7
    # Non-intra edges mostly link ring neighbours (|offset| <= 2).
    dist = (data.community[row] - data.community[col]).abs()
    dist = torch.minimum(dist, 20 - dist)
    assert (dist <= 2).float().mean() > 0.97


def test_cache_round_trip(tmp_path):
    data = load_default(root=str(tmp_path), seed=3, **SMALL)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == '.pt'
    again = load_default(root=str(tmp_path), seed=3, **SMALL)
    for key in data.keys():
        assert torch.equal(data[key], again[key]), key
    # A different seed must not reuse the cached file.
    other = load_default(root=str(tmp_path), seed=4, **SMALL)
    assert len(list(tmp_path.iterdir())) == 2
    assert not torch.equal(other.x, data.x)


def test_env_root(tmp_path, monkeypatch):
    monkeypatch.setenv('PYG_DIST_DATA', str(tmp_path))
    load_default(**SMALL)
    assert len(list(tmp_path.glob('*.pt'))) == 1
