import inspect

import pytest
import torch
from torch_geometric.utils import is_undirected

from pyg_dist import partition_graph
from pyg_dist.datasets import DATASETS, load, reddit_shaped, rmat

RMAT = dict(scale=11, edge_factor=16, num_features=32, num_classes=4)
# Few classes at this size: 41 classes of ~50 nodes could not hold their
# ~70 inside-class edges per node, so homophily would drop to ~0.35.
REDDIT = dict(num_nodes=2000, num_classes=8, num_features=64)
GENERATORS = {'rmat': (rmat, RMAT), 'reddit-shaped': (reddit_shaped, REDDIT)}


def _make(name, **kwargs):
    generate, small = GENERATORS[name]
    return generate(**{**small, **kwargs})


@pytest.mark.parametrize('name', GENERATORS)
def test_deterministic(name):
    a, b, c = _make(name, seed=1), _make(name, seed=1), _make(name, seed=2)
    assert set(a.keys()) == {'x', 'y', 'edge_index', 'train_mask', 'val_mask',
                             'test_mask'}
    for key in a.keys():
        assert torch.equal(a[key], b[key]), key
    assert not torch.equal(a.x, c.x)
    assert not torch.equal(a.edge_index, c.edge_index)


@pytest.mark.parametrize('name', GENERATORS)
def test_shapes_and_graph(name):
    data = _make(name)
    N, F = data.num_nodes, data.x.size(1)
    assert N == (2**11 if name == 'rmat' else 2000)
    assert F == (32 if name == 'rmat' else 64)
    assert data.x.shape == (N, F) and data.x.dtype == torch.float32
    assert data.y.shape == (N, ) and data.y.dtype == torch.int64
    num_classes = 4 if name == 'rmat' else 8
    assert int(data.y.min()) >= 0 and int(data.y.max()) < num_classes
    assert len(data.y.unique()) == num_classes
    row, col = data.edge_index
    assert data.edge_index.dtype == torch.int64
    assert not bool((row == col).any())  # no self-loops
    assert is_undirected(data.edge_index, num_nodes=N)
    key = row * N + col  # coalesced: strictly increasing (sorted, no dups)
    assert bool((key[1:] > key[:-1]).all())


@pytest.mark.parametrize('name', GENERATORS)
def test_masks(name):
    data = _make(name)
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask])
    assert masks.dtype == torch.bool
    assert bool((masks.sum(0) == 1).all())  # disjoint and covering
    split = (0.3, 0.2) if name == 'rmat' else (0.66, 0.10)
    N = data.num_nodes
    assert masks.sum(1).tolist() == [
        int(split[0] * N), int(split[1] * N),
        N - int(split[0] * N) - int(split[1] * N)
    ]


def test_rmat_power_law_degrees():
    data = rmat(**RMAT)
    deg = torch.bincount(data.edge_index[0], minlength=data.num_nodes).float()
    assert deg.max() > 15 * deg.mean()  # hubs
    assert deg.median() < deg.mean()  # many leaves: right-skewed
    assert 0 < (deg == 0).float().mean() < 0.5  # Graph500 keeps isolated ids


def test_reddit_shaped_defaults_and_degree():
    defaults = {
        k: p.default
        for k, p in inspect.signature(reddit_shaped).parameters.items()
    }
    assert defaults['avg_degree'] >= 100
    assert defaults['num_features'] == 602 and defaults['num_classes'] == 41
    data = reddit_shaped(num_nodes=2000)  # the default degree holds here too
    assert data.num_edges == 2000 * defaults['avg_degree']
    assert data.x.size(1) == 602 and len(data.y.unique()) == 41
    data = reddit_shaped(**REDDIT)
    row, col = data.edge_index
    homophily = (data.y[row] == data.y[col]).float().mean()
    assert 0.5 < homophily < 0.85  # homophilous, yet many cross-class edges


def test_reddit_shaped_halo_exceeds_inner():
    book = partition_graph(reddit_shaped(**REDDIT), 4)
    ratios = [s['halo_ratio'] for s in book.stats]
    assert len(ratios) == 4 and min(ratios) >= 1.0, ratios


def _ridge_accuracy(x, y, train, test):
    one_hot = torch.nn.functional.one_hot(y).double()
    x = torch.cat([x.double(), torch.ones(x.size(0), 1, dtype=torch.double)], 1)
    eye = torch.eye(x.size(1), dtype=torch.double)
    w = torch.linalg.solve(x[train].T @ x[train] + eye, x[train].T @ one_hot[train])
    return float(((x[test] @ w).argmax(1) == y[test]).double().mean())


@pytest.mark.parametrize('name', GENERATORS)
def test_neighbourhood_is_needed(name):
    # A linear classifier on the node's features (an MLP's view) against one
    # on [x_i, mean of the neighbours' x_j] (one GraphSAGE layer's view).
    data = _make(name)
    row, col = data.edge_index
    deg = torch.bincount(row, minlength=data.num_nodes).clamp(min=1)
    mean = torch.zeros_like(data.x).index_add_(0, row, data.x[col]) / deg[:, None]
    args = (data.y, data.train_mask, data.test_mask)
    own = _ridge_accuracy(data.x, *args)
    sage = _ridge_accuracy(torch.cat([data.x, mean], 1), *args)
    assert sage > own + 0.2, (own, sage)


def test_load_caches_and_reloads(tmp_path):
    assert {'rmat', 'reddit-shaped'} <= set(DATASETS)
    data = load('reddit-shaped', str(tmp_path), **REDDIT)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].name.startswith('reddit_shaped_n2000_')
    again = load('reddit-shaped', str(tmp_path), **REDDIT)
    assert set(again.keys()) == set(data.keys())
    for key in data.keys():
        assert torch.equal(data[key], again[key]), key
    load('reddit-shaped', str(tmp_path), seed=1, **REDDIT)  # its own file
    load('rmat', str(tmp_path), **RMAT)
    assert len(list(tmp_path.glob('*.pt'))) == 3
    assert not list(tmp_path.glob('*.tmp'))
    with pytest.raises(TypeError, match='takes no generator arguments'):
        load('reddit', str(tmp_path), seed=1)


def test_cli_partition_prints_the_halo_table(tmp_path, capsys):
    from pyg_dist.cli import main
    main(['partition', '--dataset', 'reddit-shaped', '--num-nodes', '2000',
          '--num-parts', '4', '--root', str(tmp_path / 'parts'),
          '--data-dir', str(tmp_path / 'data')])
    out = capsys.readouterr().out
    assert 'halo/inner' in out and 'wrote 4 partitions' in out
    with pytest.raises(SystemExit, match='does not apply to rmat'):
        main(['partition', '--dataset', 'rmat', '--num-nodes', '2000',
              '--num-parts', '2', '--root', str(tmp_path / 'rmat')])
