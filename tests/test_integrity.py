"""Corrupt, truncated or foreign partition and checkpoint files are refused
with one line naming them, before any byte reaches a kernel."""
import dataclasses
import json
import os
import os.path as osp

import pytest
import torch

import pyg_dist
from pyg_dist.checkpoint import CheckpointError
from pyg_dist.integrity import CorruptFileError
from pyg_dist.train import TrainConfig, train


@pytest.fixture
def parts(graph, tmp_path):
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(graph, 2, root=root)
    return root


def _flip(path: str, offset: int, count: int = 8) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(count)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
def test_flipped_bytes_in_a_part_file_are_refused_by_name(parts, where):
    path = osp.join(parts, "part_1.pt")
    _flip(path, int(os.path.getsize(path) * where))
    with pytest.raises(CorruptFileError, match="part_1.pt' is corrupt"):
        pyg_dist.DistData.load(parts, 1, world_size=2)
    pyg_dist.DistData.load(parts, 0, world_size=2)  # the intact part still loads


def test_a_truncated_book_is_refused(parts):
    path = osp.join(parts, "book.pt")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    with pytest.raises(CorruptFileError, match="book.pt' is corrupt, truncated"):
        pyg_dist.PartitionBook.load(parts)


def test_a_part_of_another_partitioning_is_refused(graph, parts, tmp_path):
    other = str(tmp_path / "other")
    pyg_dist.partition_graph(graph, 2, root=other, method="random")
    os.replace(osp.join(other, "part_1.pt"), osp.join(parts, "part_1.pt"))
    with pytest.raises(RuntimeError, match="part_1.pt' does not match .*partitioning_id"):
        pyg_dist.DistData.load(parts, 1, world_size=2)


def test_inconsistent_tensors_never_reach_a_kernel(parts):
    r"""A file without a recorded checksum (an older partitioning) whose
    indices are wrong: refused by validation, not by a crash."""
    path = osp.join(parts, "part_1.pt")
    item = torch.load(path, weights_only=True)
    item["edge_index"][0, 3] = 10**9
    torch.save(item, path)
    meta_path = osp.join(parts, "meta.json")
    meta = json.load(open(meta_path))
    del meta["files"]
    json.dump(meta, open(meta_path, "w"))
    with pytest.raises(CorruptFileError, match="edge_index points outside"):
        pyg_dist.DistData.load(parts, 1, world_size=2)


@pytest.mark.parametrize("where", [0.05, 0.5, 0.95])
def test_a_corrupt_checkpoint_is_refused_and_the_run_kept(graph, tmp_path, where):
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 1, root=root)
    config = TrainConfig(hidden=8, epochs=2, progress=False, checkpoint_every=1)
    train(root, config, out)
    model_before = open(osp.join(out, "model.pt"), "rb").read()
    path = osp.join(out, "checkpoint", "epoch_2", "rank_0.pt")
    _flip(path, int(os.path.getsize(path) * where), 4)
    with pytest.raises(CheckpointError, match="rank_0.pt' is corrupt"):
        train(root, dataclasses.replace(config, epochs=3, resume=True), out)
    assert osp.exists(path)  # the checkpoint was not replaced...
    assert open(osp.join(out, "model.pt"), "rb").read() == model_before  # ...nor the model


def test_resume_with_fewer_epochs_than_the_checkpoint_is_refused(graph, tmp_path):
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 1, root=root)
    config = TrainConfig(hidden=8, epochs=3, progress=False, checkpoint_every=1)
    train(root, config, out)
    with pytest.raises(ValueError, match="checkpoint is at epoch 3: --epochs 2"):
        train(root, dataclasses.replace(config, epochs=2, resume=True), out)


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_partition_root_that_cannot_be_written(tmp_path, kind, capsys):
    from pyg_dist.cli import main
    root = tmp_path / "root"
    if kind == "file":
        root.write_text("not a directory")
    else:
        root = tmp_path / "sub" / "root"
        (tmp_path / "sub").write_text("a file where a directory must go")
    with pytest.raises(SystemExit) as info:
        main(["partition", "--num-parts", "2", "--root", str(root), "--num-nodes", "100"])
    assert str(root) in str(info.value) and "pyg-dist partition: error" in str(info.value)


def test_a_checkpoint_of_another_partitioning_is_refused(graph, tmp_path):
    a, b, out = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 2, root=a)
    pyg_dist.partition_graph(graph, 2, root=b, method="random")  # same graph, other parts
    config = TrainConfig(hidden=8, epochs=2, progress=False, checkpoint_every=1)
    pyg_dist.spawn(train, 2, (a, config, out), timeout=60)
    with pytest.raises(RuntimeError, match="partitioning_id"):
        pyg_dist.spawn(train, 2, (b, dataclasses.replace(config, epochs=3, resume=True), out),
                       timeout=60)
