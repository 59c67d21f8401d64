r"""Generated graphs in the regime of the distributed-GNN papers.

Reddit (BNS-GCN Table 1, PSC-GCN Table I: average degree ~490, 602
features, 41 classes) and ogbn-products are power-law graphs whose METIS
parts have as many boundary (halo) nodes as inner nodes or more, so the halo
exchange dominates a partition-parallel epoch. The default graph
(:func:`~pyg_dist.datasets.synthetic_communities`) is cleanly partitionable
(halo 20-40% of a part). The two generators here are not, and are built
offline and deterministically:

* :func:`rmat`: Graph500's R-MAT / Kronecker power-law graph with labels
  that depend on a node's neighbourhood.
* :func:`reddit_shaped`: a degree-corrected stochastic block model with
  Reddit's 602 features and 41 classes ("subreddits"), homophilous but with
  enough edges between classes that every METIS part sees most of the graph.

At the defaults, :func:`rmat` has 65,536 nodes and 1.8M directed edges
(halo/inner 0.98-1.54 per part at 4 METIS parts) and :func:`reddit_shaped`
20,000 nodes and 2M directed edges (2.6-2.8); each takes about a second to
generate, and a 2-layer GraphSAGE epoch on one CPU thread under a second.
All randomness of a graph comes from one :class:`numpy.random.Generator`
seeded with ``seed``, and every step is vectorised.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_dist.datasets.cache import load_generated
from pyg_dist.utils.sparse import distinct, valid_sparse

_TENSOR_KEYS = ('x', 'y', 'edge_index', 'train_mask', 'val_mask', 'test_mask')


def rmat(
    scale: int = 16,
    edge_factor: int = 16,
    a: float = 0.57,
    b: float = 0.19,
    c: float = 0.19,
    num_features: int = 100,
    num_classes: int = 16,
    smoothing: float = 0.9,
    feature_noise: float = 0.5,
    split: Tuple[float, float] = (0.3, 0.2),
    seed: int = 0,
) -> Data:
    r"""An R-MAT (recursive matrix, Kronecker) power-law graph with Graph500's
    parameters and a node classification task that needs the neighbourhood.

    **Graph.** :math:`N = 2^s` nodes (``scale`` :math:`s`) and
    :math:`M = e N` generated edges (``edge_factor`` :math:`e`). Every edge
    picks one quadrant of the adjacency matrix per level of the recursion,
    with probabilities :math:`(a, b, c, d = 1 - a - b - c)` for
    (top-left, top-right, bottom-left, bottom-right); level :math:`\ell`
    fixes bit :math:`\ell` of the source and target ids:

    .. math::
        \Pr[s_\ell = 1] = c + d, \qquad
        \Pr[t_\ell = 1 \mid s_\ell] =
        \begin{cases} b / (a + b) & s_\ell = 0 \\
                      d / (c + d) & s_\ell = 1. \end{cases}

    All :math:`M` edges draw a level's bits at once. As in Graph500, node ids
    are then randomly permuted (so that id order carries no locality), and
    the graph is symmetrised with self-loops and duplicates removed. With
    Graph500's :math:`(0.57, 0.19, 0.19, 0.05)`, degrees are heavy-tailed
    (a few hubs, many leaves) and a fraction of the nodes stays isolated
    (Graph500 keeps them, and so does this graph).

    **Labels.** These parameters give R-MAT almost no community structure: a
    target bit is 0 with probability :math:`a/(a+b) = 0.75` or
    :math:`c/(c+d) = 0.79`, nearly independent of the source bit. Homophilous
    labels with balanced classes (smoothing a class field, label
    propagation) therefore either keep few same-class edges or collapse into
    a few classes around the hubs. Instead, the label is one lazy
    random-walk step of a random field that the features show: every node
    draws :math:`\mathbf{z}_i \sim \mathcal{N}(\mathbf{0}, \mathbf{I}_C)`,

    .. math::
        y_i = \arg\max_c \Big((1 - \alpha)\, \mathbf{z}_i + \frac{\alpha}
            {|\mathcal{N}(i)|} \sum_{j \in \mathcal{N}(i)} \mathbf{z}_j
            \Big)_c, \qquad
        \mathbf{x}_i = \mathbf{M}^{\top} \mathbf{z}_i
            + \sigma \boldsymbol{\epsilon}_i,

    with :math:`\alpha` (``smoothing``; an isolated node's label is
    :math:`\arg\max_c z_{ic}`), centroids
    :math:`\mathbf{M} \in \mathbb{R}^{C \times F}`,
    :math:`\mathbf{M}_{cf} \sim \mathcal{N}(0, 1/C)` (each feature of
    :math:`\mathbf{M}^{\top}\mathbf{z}_i` has unit variance),
    :math:`\boldsymbol{\epsilon}_i \sim \mathcal{N}(\mathbf{0},
    \mathbf{I}_F)` and noise scale :math:`\sigma` (``feature_noise``). The
    classes are balanced in expectation (the field is exchangeable over
    classes). A per-node MLP sees only :math:`\mathbf{z}_i`, which has weight
    :math:`1 - \alpha` in the label; GraphSAGE's root and mean terms,
    :math:`\mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2 \,
    \mathrm{mean}_{j \in \mathcal{N}(i)} \mathbf{x}_j`, compute the
    smoothed field exactly (up to the noise), so it is far better.

    Args:
        scale (int): :math:`\log_2` of the number of nodes.
        edge_factor (int): Generated edges per node (before symmetrising
            and removing duplicates).
        a (float): Probability of the top-left quadrant.
        b (float): Probability of the top-right quadrant.
        c (float): Probability of the bottom-left quadrant.
        num_features (int): Feature dimension :math:`F` (at least
            :obj:`num_classes`, so the features determine :math:`\mathbf{z}`).
        num_classes (int): Number of classes :math:`C`.
        smoothing (float): Weight :math:`\alpha` of the neighbours' mean
            field in the label.
        feature_noise (float): Noise scale :math:`\sigma`.
        split (Tuple[float, float]): Train and validation fractions; the
            rest is test.
        seed (int): Random seed; equal seeds give identical tensors.

    Returns:
        :class:`~torch_geometric.data.Data` with ``x`` (float32 ``[N, F]``),
        ``y`` (int64 ``[N]``), coalesced undirected ``edge_index`` without
        self-loops and boolean, disjoint ``train_mask`` / ``val_mask`` /
        ``test_mask``.
    """
    d = 1.0 - a - b - c
    assert min(a, b, c, d) >= 0, "a, b, c and 1 - a - b - c must be >= 0"
    assert num_features >= num_classes and 0 <= smoothing <= 1
    N, M = 1 << scale, edge_factor << scale
    rng = np.random.default_rng(seed)

    src = np.zeros(M, dtype=np.int64)
    dst = np.zeros(M, dtype=np.int64)
    # Conditional quadrant probabilities: the source bit first, then the
    # target bit given it.
    p_src, p_dst = c + d, np.array([b / (a + b), d / (c + d)])
    for level in range(scale):
        s_bit = rng.random(M) < p_src
        t_bit = rng.random(M) < p_dst[s_bit.astype(np.int64)]
        src |= s_bit.astype(np.int64) << level
        dst |= t_bit.astype(np.int64) << level
    # Graph500 permutes the ids: otherwise low ids would be the hubs, and
    # any split by id range would see the degree order.
    perm = rng.permutation(N)
    edge_index = _undirected(perm[src], perm[dst], N)
    del src, dst

    z = rng.standard_normal((N, num_classes))
    deg = np.bincount(edge_index[0], minlength=N)[:, None]
    field = (1.0 - smoothing) * z + smoothing * _neighbour_sum(
        edge_index, z) / np.maximum(deg, 1)
    y = field.argmax(1)

    centroid = rng.standard_normal((num_classes, num_features)) / np.sqrt(
        num_classes)
    x = (z @ centroid).astype(np.float32) + np.float32(
        feature_noise) * rng.standard_normal((N, num_features),
                                             dtype=np.float32)
    return Data(x=torch.from_numpy(x), y=torch.from_numpy(y),
                edge_index=torch.from_numpy(edge_index),
                **_masks(rng, N, split))


def reddit_shaped(
    num_nodes: int = 20_000,
    avg_degree: int = 100,
    num_features: int = 602,
    num_classes: int = 41,
    homophily: float = 0.7,
    degree_spread: float = 1.0,
    feature_noise: float = 0.5,
    label_noise: float = 0.04,
    split: Tuple[float, float] = (0.66, 0.10),
    seed: int = 0,
) -> Data:
    r"""A Reddit-shaped degree-corrected stochastic block model (DC-SBM):
    homophilous classes, heavy-tailed degrees and no clean partition.

    **Graph.** Node :math:`i` gets a class ("subreddit") :math:`y_i` out of
    :math:`C` (class shares drawn once and unequal, as on Reddit: lognormal
    with :math:`\sigma = 0.5`) and a degree propensity
    :math:`\theta_i \sim \mathrm{LogNormal}(0, \sigma_\theta^2)`
    (``degree_spread``). An edge picks its source with probability
    :math:`\propto \theta_i` and its target with probability :math:`h`
    (``homophily``) :math:`\propto \theta_j` inside the source's class,
    otherwise :math:`\propto \theta_j` over all nodes. Edges are drawn until
    :math:`N d / 2` distinct node pairs (no self-loops) exist, exactly
    :math:`N d / 2` of them are kept at random and the graph is symmetrised:
    the average degree is exactly :math:`d` and node :math:`i`'s is
    :math:`\approx d\, \theta_i / \bar\theta`. Node ids are randomly
    permuted.

    Any :math:`k`-way split sends a fraction of at least about
    :math:`(1 - h)(1 - 1/k)` of every node's edges to other parts (METIS can
    at best keep classes together), i.e. tens of edges per node at
    :math:`d \geq 100`: nearly every node outside a part is in its halo, so
    the halo outnumbers the inner nodes of every part at 4 parts (at the
    defaults, 2.6-2.8 times), as on Reddit. A class needs room for its
    inside edges: with :math:`N / C` not well above :math:`h d`, its node
    pairs run out and fewer edges stay inside (at the defaults,
    :math:`N / C \approx 490` and 63% of the edges stay inside a class).

    **Features.** A class centroid buried in noise, as in
    :func:`~pyg_dist.datasets.synthetic_communities`:

    .. math::
        \mathbf{x}_i = \boldsymbol{\mu}_{y_i} + \sigma \boldsymbol{\epsilon}_i,
        \qquad \boldsymbol{\mu}_c \sim \mathcal{N}(\mathbf{0},
        \mathbf{I}_F / F), \;
        \boldsymbol{\epsilon}_i \sim \mathcal{N}(\mathbf{0}, \mathbf{I}_F),

    with :math:`\sigma` (``feature_noise``) large enough that a per-node MLP
    is weak, while the mean over :math:`\sim d` neighbours, most of them in
    the node's class, shrinks the noise by :math:`\sim \sqrt{d}`
    (GraphSAGE is far better).

    Args:
        num_nodes (int): Number of nodes :math:`N`.
        avg_degree (int): Average degree :math:`d`.
        num_features (int): Feature dimension :math:`F` (Reddit: 602).
        num_classes (int): Number of classes :math:`C` (Reddit: 41).
        homophily (float): Probability :math:`h` that an edge stays in its
            source's class.
        degree_spread (float): :math:`\sigma_\theta` of the lognormal degree
            propensities.
        feature_noise (float): Noise scale :math:`\sigma` per feature (the
            centroids have norm :math:`\approx 1`).
        label_noise (float): Fraction of nodes whose label is then redrawn
            uniformly (their features and edges keep their class), which
            caps the reachable accuracy at :math:`1 - \ell (1 - 1/C)` for
            :math:`\ell` = ``label_noise``.
        split (Tuple[float, float]): Train and validation fractions (Reddit:
            66% / 10%); the rest is test.
        seed (int): Random seed; equal seeds give identical tensors.

    Returns:
        :class:`~torch_geometric.data.Data` as :func:`rmat` returns it.
    """
    assert 0 <= homophily <= 1
    assert 0 < avg_degree <= (num_nodes - 1) // 2, "graph would be too dense"
    N, C = num_nodes, num_classes
    rng = np.random.default_rng(seed)

    # Nodes sorted by class while drawing edges, so that "inside class c" is
    # the contiguous id range start[c]:start[c + 1].
    share = rng.lognormal(0.0, 0.5, C)
    y = np.sort(rng.choice(C, N, p=share / share.sum()))
    start = np.searchsorted(y, np.arange(C + 1))
    theta = rng.lognormal(0.0, degree_spread, N)
    cum = np.concatenate([[0.0], np.cumsum(theta)])

    # Draw edges until N d / 2 distinct node pairs exist, then keep exactly
    # that many at random: the average degree is d, not d minus the
    # duplicates that the hubs of a class draw.
    target = N * avg_degree // 2
    pairs = np.zeros(0, dtype=np.int64)
    while pairs.size < target:
        # ~15% of the draws repeat a pair (hubs inside a class) at the
        # defaults: overshoot so that one round usually suffices.
        count = int(1.25 * (target - pairs.size)) + 1024
        # Sampling proportional to theta: invert the cumulative sum.
        src = np.searchsorted(cum, rng.random(count) * cum[-1],
                              side='right') - 1
        lo, hi = cum[start[y[src]]], cum[start[y[src] + 1]]
        inside = rng.random(count) < homophily
        lo[~inside], hi[~inside] = 0.0, cum[-1]
        dst = np.searchsorted(cum, lo + rng.random(count) * (hi - lo),
                              side='right') - 1
        # Float rounding at the top end must not give the id N.
        dst = np.clip(dst, 0, N - 1)
        pairs = distinct(np.concatenate([pairs, _pairs(src, dst, N)]))
    pairs = rng.permutation(pairs)[:target]

    # Random ids: METIS does not care, but contiguous or block splits would
    # otherwise find the classes for free.
    perm = rng.permutation(N)
    edge_index = _undirected(perm[pairs // N], perm[pairs % N], N)
    y_perm = np.empty_like(y)
    y_perm[perm] = y

    centroid = rng.standard_normal((C, num_features), dtype=np.float32)
    centroid /= np.float32(np.sqrt(num_features))
    x = centroid[y_perm] + np.float32(feature_noise) * rng.standard_normal(
        (N, num_features), dtype=np.float32)
    # Mislabelled nodes cap the accuracy near Reddit's (GraphSAGE: ~95-97%),
    # so that methods can be told apart by it.
    flip = rng.random(N) < label_noise
    y_perm[flip] = rng.integers(0, C, int(flip.sum()))
    return Data(x=torch.from_numpy(x), y=torch.from_numpy(y_perm),
                edge_index=torch.from_numpy(edge_index),
                **_masks(rng, N, split))


def load_rmat(root: Optional[str] = None, seed: int = 0,
              **kwargs: Any) -> Data:
    r"""Returns the :func:`rmat` graph, generating it once and caching it
    under :obj:`root` (as :func:`~pyg_dist.datasets.load_default` does).

    Args:
        root (str, optional): Cache directory. Defaults to ``$PYG_DIST_DATA``
            or ``~/.cache/pyg_dist``.
        seed (int): Random seed.
        **kwargs: Overrides for :func:`rmat` (e.g. a smaller ``scale``);
            they are part of the cache file name.
    """
    return load_generated(rmat, root, ('scale', 'scale'), _TENSOR_KEYS,
                          seed=seed, **kwargs)


def load_reddit_shaped(root: Optional[str] = None, seed: int = 0,
                       **kwargs: Any) -> Data:
    r"""Returns the :func:`reddit_shaped` graph, generating it once and
    caching it under :obj:`root` (as :func:`~pyg_dist.datasets.load_default`
    does).

    Args:
        root (str, optional): Cache directory. Defaults to ``$PYG_DIST_DATA``
            or ``~/.cache/pyg_dist``.
        seed (int): Random seed.
        **kwargs: Overrides for :func:`reddit_shaped` (e.g. a smaller
            ``num_nodes``); they are part of the cache file name.
    """
    return load_generated(reddit_shaped, root, ('n', 'num_nodes'),
                          _TENSOR_KEYS, seed=seed, **kwargs)


def _pairs(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    r"""The sorted, distinct node pairs :math:`\{i, j\}`, :math:`i < j`, of
    the edges ``src -> dst``, as keys :math:`i N + j`."""
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    return distinct((lo * num_nodes + hi)[lo != hi])


def _undirected(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    r"""The coalesced ``[2, E]`` symmetrisation of the edges ``src -> dst``
    without self-loops or duplicates."""
    key = _pairs(src, dst, num_nodes)
    row, col = key // num_nodes, key % num_nodes
    # Sorting the flat key `row * N + col` of both directions coalesces.
    key = np.concatenate([key, col * num_nodes + row])
    key.sort()
    return np.stack([key // num_nodes, key % num_nodes])


def _neighbour_sum(edge_index: np.ndarray, value: np.ndarray) -> np.ndarray:
    r""":math:`\sum_{j \in \mathcal{N}(i)} \mathbf{v}_j` for every node
    :math:`i` of the coalesced :obj:`edge_index`."""
    N = value.shape[0]
    rowptr = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(np.bincount(edge_index[0], minlength=N), out=rowptr[1:])
    col = torch.from_numpy(edge_index[1])
    with valid_sparse():  # a CSR of the coalesced edge_index
        adj = torch.sparse_csr_tensor(
            torch.from_numpy(rowptr), col,
            torch.ones(col.numel(), dtype=torch.float64), (N, N))
        # A CSR product sums each row in order, on any number of threads,
        # so the labels are deterministic (and no [E, C] gather is made).
        return (adj @ torch.from_numpy(value)).numpy()


def _masks(rng: np.random.Generator, num_nodes: int,
           split: Tuple[float, float]) -> dict:
    r"""Random, disjoint ``train_mask`` / ``val_mask`` / ``test_mask`` with
    the fractions :obj:`split` (train, val; the rest is test)."""
    perm = torch.from_numpy(rng.permutation(num_nodes))
    n_train, n_val = int(split[0] * num_nodes), int(split[1] * num_nodes)
    masks: List[Tensor] = []
    for idx in (perm[:n_train], perm[n_train:n_train + n_val],
                perm[n_train + n_val:]):
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[idx] = True
        masks.append(mask)
    return dict(train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
