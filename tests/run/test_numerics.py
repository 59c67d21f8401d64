"""What training reports where its numbers stop being numbers: an fp16
exchange that overflows is named in the error, an empty validation mask
has no accuracy (null), never 0.0."""
import json
import os.path as osp

import pytest
import torch

import pyg_dist
from pyg_dist.train import TrainConfig, train


def test_an_overflowing_fp16_exchange_is_named(graph, tmp_path):
    data = graph.clone()
    data.x = data.x * 1e6  # halo rows above fp16's largest value, 65504
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(data, 2, root=root)
    config = TrainConfig(hidden=8, epochs=1, progress=False, exchange_dtype="fp16")
    with pytest.raises(RuntimeError, match="--exchange-dtype fp16 carries values up to 65504"):
        pyg_dist.spawn(train, 2, (root, config), timeout=60)


def test_an_empty_validation_mask_has_no_accuracy(graph, tmp_path):
    data = graph.clone()
    data.val_mask = torch.zeros_like(data.val_mask)
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(data, 1, root=root)
    summary = train(root, TrainConfig(hidden=8, epochs=2, progress=False), out)
    rows = [json.loads(line) for line in open(osp.join(out, "metrics.jsonl"))]
    assert [r["val_acc"] for r in rows] == [None, None]
    assert all(r["train_acc"] is not None and r["test_acc"] is not None for r in rows)
    assert summary["val_acc"] is None and summary["best_val_acc"] is None
