"""Labels are checked where they enter a partitioning and again before
training: a graph without labels, float labels, a negative class id on a
labelled node or an outlier label are refused in one line naming the
labels, before any work; unlabelled nodes outside every mask are fine."""
import os
import os.path as osp

import numpy as np
import pytest
import torch

import pyg_dist
from pyg_dist.labels import LabelError, label_classes

NUM_NODES, CLASSES = 240, 4


def _graph_folder(path: str, y=None, drop_y: bool = False) -> str:
    r"""A small graph folder (``src``, ``dst``, ``x``, ``y``, masks) written
    as a user would, with labels :obj:`y` (default: 4 classes)."""
    rng = np.random.default_rng(0)
    os.makedirs(path)
    src = rng.integers(0, NUM_NODES, 2000)
    dst = rng.integers(0, NUM_NODES, 2000)
    np.save(osp.join(path, "src.npy"), src)
    np.save(osp.join(path, "dst.npy"), dst)
    np.save(osp.join(path, "x.npy"), rng.standard_normal((NUM_NODES, 8)).astype(np.float32))
    if not drop_y:
        np.save(osp.join(path, "y.npy"), np.arange(NUM_NODES) % CLASSES if y is None else y)
    split = np.arange(NUM_NODES) % 10
    for name, keep in (("train_mask", split < 6), ("val_mask", split == 6),
                       ("test_mask", split == 7)):  # 8, 9: in no mask
        np.save(osp.join(path, name + ".npy"), keep)
    return path


def test_a_folder_without_labels_partitions_and_train_refuses_it(cli, tmp_path):
    folder = _graph_folder(str(tmp_path / "graph"), drop_y=True)
    root = str(tmp_path / "parts")
    cli("partition", "--from", folder, "--num-parts", "2", "--root", root,
        "--method", "random")
    done = cli("train", "--root", root, "--epochs", "1", "--no-progress", "--no-plots",
               check=False)
    err = done.stderr.strip()
    assert done.returncode == 1 and len(err.splitlines()) == 1, err
    assert "no labels" in err and "meta.json" in err and done.stdout == ""


@pytest.mark.parametrize("case", ["float", "negative", "outlier", "multi-hot"])
def test_labels_training_cannot_use_are_refused_at_partition_time(cli, tmp_path, case):
    y = (np.arange(NUM_NODES) % CLASSES).astype(np.int64)
    if case == "float":
        y = y.astype(np.float32)
    elif case == "negative":
        y[0] = -1  # node 0 is a training node
    elif case == "outlier":
        y[3] = 1000
    else:
        y = np.eye(CLASSES, dtype=np.float32)[y] * 2
    folder = _graph_folder(str(tmp_path / "graph"), y)
    root = str(tmp_path / "parts")
    done = cli("partition", "--from", folder, "--num-parts", "2", "--root", root,
               "--method", "random", check=False)
    err = done.stderr.strip()
    assert done.returncode == 1 and len(err.splitlines()) == 1, err
    assert "y.npy" in err and not osp.exists(osp.join(root, "meta.json"))
    assert {"float": "dtype float32", "negative": "train_mask has label -1",
            "outlier": "outlier", "multi-hot": "0 and 1"}[case] in err


def test_a_declared_label_space_and_unlabelled_nodes_are_kept(cli, tmp_path):
    y = (np.arange(NUM_NODES) % CLASSES).astype(np.int64)
    y[np.arange(NUM_NODES) % 10 >= 8] = -1  # in no mask: unlabelled, as OGB marks them
    y[3] = 1000
    folder = _graph_folder(str(tmp_path / "graph"), y)
    root = str(tmp_path / "parts")
    cli("partition", "--from", folder, "--num-parts", "2", "--root", root, "--method",
        "random", "--num-classes", "1001")
    assert pyg_dist.PartitionBook.load(root).meta["num_classes"] == 1001
    done = cli("partition", "--from", folder, "--num-parts", "2", "--root", root,
               "--method", "random", "--num-classes", "1000", check=False)
    assert done.returncode == 1 and "label 1000" in done.stderr, done.stderr


def test_labels_in_memory_are_checked_before_partitioning(graph, tmp_path):
    data = graph.clone()
    data.y = data.y.float()
    with pytest.raises(LabelError, match="dtype float32"):
        pyg_dist.partition_graph(data, 2, root=str(tmp_path / "parts"))
    assert not osp.exists(tmp_path / "parts")
    masks = {"train_mask": torch.tensor([True, False, True])}
    assert label_classes(torch.tensor([2, -1, 0]), masks, "y") == 3
    assert pyg_dist.partition_graph(graph, 2, num_classes=12).meta["num_classes"] == 12
