r"""The datasets of the papers (OGB and PyG), read from disk by their own
loaders; nothing is downloaded, so a missing dataset says where its files go.
The generated graphs (the default one and two in the papers' regime) are
registered here too."""
import os.path as osp
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from pyg_dist.datasets.cache import default_root
from pyg_dist.datasets.regime import load_reddit_shaped, load_rmat
from pyg_dist.datasets.synthetic import load_default

_OGB = {  # name -> (symmetrise, download url)
    "ogbn-arxiv": (True, "http://snap.stanford.edu/ogb/data/nodeproppred/arxiv.zip"),
    "ogbn-products": (False, "http://snap.stanford.edu/ogb/data/nodeproppred/products.zip"),
    "ogbn-papers100M": (True, "http://snap.stanford.edu/ogb/data/nodeproppred/"
                              "papers100M-bin.zip"),
}
_SAINT_FILES = ["adj_full.npz", "feats.npy", "class_map.json", "role.json"]
_PYG = {  # name -> (class name, raw files, where they come from)
    "reddit": ("Reddit", ["reddit_data.npz", "reddit_graph.npz"],
               "https://data.dgl.ai/dataset/reddit.zip (unzipped)"),
    "flickr": ("Flickr", _SAINT_FILES, "GraphSAINT's Google Drive folder"),
    "yelp": ("Yelp", _SAINT_FILES, "GraphSAINT's Google Drive folder"),
    "amazon-products": ("AmazonProducts", _SAINT_FILES, "GraphSAINT's Google Drive folder"),
}
GENERATED: Dict[str, Callable[..., Data]] = {  # name -> caching generator
    "default": load_default,
    "rmat": load_rmat,
    "reddit-shaped": load_reddit_shaped,
}
DATASETS: List[str] = [*GENERATED, *_OGB, *_PYG]


class DatasetNotFound(FileNotFoundError):
    r"""A dataset is not on disk (and this package never downloads)."""


def load(name: str, root: Optional[str] = None, **kwargs: Any) -> Data:
    r"""The dataset :obj:`name` (one of :data:`DATASETS`) as one PyG ``Data``
    with ``x``, ``y``, ``edge_index`` and ``train_mask`` / ``val_mask`` /
    ``test_mask``, read from :obj:`root` (default ``$PYG_DIST_DATA`` or
    ``~/.cache/pyg_dist``) by the dataset's own loader:

    * ``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M``: the ``ogb``
      package's ``PygNodePropPredDataset`` under ``root`` (its folder layout,
      e.g. ``root/ogbn_arxiv/``), masks from its ``get_idx_split()``; the
      citation graphs are symmetrised, as in the papers; nodes without a
      label (papers100M) get ``y = -1`` and no mask.
    * ``reddit``, ``flickr``, ``yelp``, ``amazon-products``: PyG's classes
      under ``root/<name>/`` (``raw/`` holds the downloaded files). Yelp and
      AmazonProducts are multi-label: ``y`` is a float ``[N, C]`` multi-hot
      matrix (train with BCE, evaluate micro-F1: :func:`evaluate`).
    * ``default``, ``rmat``, ``reddit-shaped``: generated offline and cached
      under ``root`` (:func:`load_default`, :func:`load_rmat`,
      :func:`load_reddit_shaped`); :obj:`kwargs` (e.g. ``seed``,
      ``num_nodes``) go to their generator.

    A dataset that is neither processed nor downloaded raises
    :class:`DatasetNotFound` naming the files and the folder they go in.
    """
    root = default_root(root or None)
    if name in GENERATED:
        return GENERATED[name](root, **kwargs)
    if kwargs and (name in _OGB or name in _PYG):
        raise TypeError(f"Dataset '{name}' is read from disk and takes no generator "
                        f"arguments (got {', '.join(sorted(kwargs))})")
    if name in _OGB:
        return _load_ogb(name, root)
    if name in _PYG:
        return _load_pyg(name, root)
    raise ValueError(f"Unknown dataset '{name}' (choose from {', '.join(DATASETS)})")


def _load_ogb(name: str, root: str) -> Data:
    from ogb.nodeproppred import PygNodePropPredDataset
    symmetrise, url = _OGB[name]
    folder = osp.join(root, name.replace("-", "_"))
    processed = osp.join(folder, "processed", "geometric_data_processed.pt")
    if not osp.isdir(osp.join(folder, "raw")) and not osp.exists(processed):
        raise DatasetNotFound(
            f"Dataset '{name}' is not in '{folder}' and cannot be downloaded here: "
            f"unzip {url} into '{root}' (it creates '{folder}/' with raw/ and split/)")
    with _trusted_pyg_pickles():  # ogb's own torch.load of its processed file
        dataset = PygNodePropPredDataset(name, root)
        split = dataset.get_idx_split()
    graph = dataset[0]
    y = graph.y.view(-1)
    y = torch.where(torch.isnan(y), -1, y).long() if y.is_floating_point() else y.long()
    edge_index = to_undirected(graph.edge_index, num_nodes=graph.num_nodes) \
        if symmetrise else graph.edge_index
    data = Data(x=graph.x.float(), y=y, edge_index=edge_index, num_nodes=graph.num_nodes)
    for key, part in (("train", "train"), ("val", "valid"), ("test", "test")):
        mask = torch.zeros(graph.num_nodes, dtype=torch.bool)
        mask[split[part]] = True
        data[f"{key}_mask"] = mask
    return data


def _load_pyg(name: str, root: str) -> Data:
    import torch_geometric.datasets as pyg_datasets
    cls_name, files, source = _PYG[name]
    folder = osp.join(root, name)
    raw = osp.join(folder, "raw")
    missing = [f for f in files if not osp.exists(osp.join(raw, f))]
    if missing and not osp.exists(osp.join(folder, "processed", "data.pt")):
        raise DatasetNotFound(
            f"Dataset '{name}' is not in '{folder}' and cannot be downloaded here: "
            f"put {', '.join(missing)} (from {source}) into '{raw}/'")
    with _trusted_pyg_pickles():  # so PyG never falls back to a full unpickle
        graph = getattr(pyg_datasets, cls_name)(folder)[0]
    data = Data(x=graph.x, y=graph.y, edge_index=graph.edge_index,
                train_mask=graph.train_mask, val_mask=graph.val_mask,
                test_mask=graph.test_mask)
    if data.y.dim() > 1:  # multi-label: BCE targets
        data.y = data.y.float()
    return data


class _trusted_pyg_pickles:
    r"""Lets ``torch.load(weights_only=True)`` (torch's default) read the
    PyG objects in processed dataset files (ogb's and PyG's): only PyG's
    data classes and NumPy integer scalars (ogb's binary datasets, e.g.
    papers100M, store ``num_nodes`` as one) are allowed, never arbitrary
    code."""

    def __enter__(self):
        import numpy as np
        from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
        from torch_geometric.data.storage import GlobalStorage
        self.context = torch.serialization.safe_globals(
            [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage,
             np._core.multiarray.scalar, np.dtype, np.dtypes.Int64DType])
        return self.context.__enter__()

    def __exit__(self, *exc):
        return self.context.__exit__(*exc)


def evaluate(name: str, y_true: Tensor, out: Tensor) -> float:
    r"""The papers' metric of dataset :obj:`name` for model outputs
    :obj:`out` (logits) against :obj:`y_true`: OGB's ``Evaluator`` accuracy
    for ``ogbn-*``, micro-F1 for the multi-label datasets (a label is
    predicted when its logit is positive), accuracy otherwise."""
    if name in _OGB:
        from ogb.nodeproppred import Evaluator
        return float(Evaluator(name).eval({
            "y_true": y_true.view(-1, 1).cpu(),
            "y_pred": out.argmax(-1, keepdim=True).cpu()})["acc"])
    if y_true.dim() > 1:
        return micro_f1(*f1_counts(out, y_true))
    return float((out.argmax(-1) == y_true).double().mean()) if y_true.numel() else 0.0


def f1_counts(out: Tensor, y_true: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    r"""True positives, false positives and false negatives of multi-label
    logits :obj:`out` (positive logit: label predicted) over all labels."""
    pred, true = out > 0, y_true > 0.5
    return (pred & true).sum(), (pred & ~true).sum(), (~pred & true).sum()


def micro_f1(tp, fp, fn) -> float:
    tp, fp, fn = float(tp), float(fp), float(fn)
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0
