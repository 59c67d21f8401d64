"""Corrupt, truncated or foreign partition and checkpoint files are refused
with one line naming them, before any byte reaches a kernel."""
import dataclasses
import json
import os
import os.path as osp
import re
import shutil

import pytest
import torch

import pyg_dist
from pyg_dist.checkpoint import CheckpointError
from pyg_dist.integrity import CorruptFileError
from pyg_dist.train import TrainConfig, train
from tests.conftest import flip_bytes


@pytest.fixture
def parts(graph, tmp_path):
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(graph, 2, root=root)
    return root


@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
def test_flipped_bytes_in_a_part_file_are_refused_by_name(parts, where):
    path = osp.join(parts, "part_1.pt")
    flip_bytes(path, int(os.path.getsize(path) * where))
    with pytest.raises(CorruptFileError, match="part_1.pt' is corrupt"):
        pyg_dist.DistData.load(parts, 1, world_size=2)
    pyg_dist.DistData.load(parts, 0, world_size=2)  # the intact part still loads


def test_a_truncated_book_is_refused(parts):
    path = osp.join(parts, "book.pt")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    with pytest.raises(CorruptFileError, match="book.pt' is corrupt, truncated"):
        pyg_dist.PartitionBook.load(parts)


def test_a_part_without_a_recorded_checksum_is_refused(parts):
    meta_path = osp.join(parts, "meta.json")
    meta = json.load(open(meta_path))
    del meta["files"]["part_1.pt"]
    json.dump(meta, open(meta_path, "w"))
    with pytest.raises(CorruptFileError, match="records no checksum of .*part_1.pt'"):
        pyg_dist.DistData.load(parts, 1, world_size=2)


def test_a_part_of_another_partitioning_is_refused(graph, parts, tmp_path):
    other = str(tmp_path / "other")
    pyg_dist.partition_graph(graph, 2, root=other, method="random")
    os.replace(osp.join(other, "part_1.pt"), osp.join(parts, "part_1.pt"))
    with pytest.raises(RuntimeError, match="part_1.pt' does not match .*partitioning_id"):
        pyg_dist.DistData.load(parts, 1, world_size=2)


def test_inconsistent_tensors_never_reach_a_kernel(parts):
    r"""A file whose checksum is recorded but whose indices are wrong
    (written so, not damaged): refused by validation, not by a crash."""
    from pyg_dist.integrity import save_checked
    path = osp.join(parts, "part_1.pt")
    item = torch.load(path, weights_only=True)
    item["edge_index"][0, 3] = 10**9
    meta_path = osp.join(parts, "meta.json")
    meta = json.load(open(meta_path))
    meta["files"]["part_1.pt"] = save_checked(item, path)
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
    flip_bytes(path, int(os.path.getsize(path) * where), 4)
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


def _model_run(root: str, out: str) -> None:
    train(root, TrainConfig(hidden=8, epochs=1, progress=False), out)


def test_a_flipped_byte_in_model_pt_is_refused(graph, tmp_path):
    from pyg_dist.train import load_model
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 1, root=root)
    _model_run(root, out)
    load_model(out)  # intact: loads
    path = osp.join(out, "model.pt")
    flip_bytes(path, os.path.getsize(path) // 2, 4)
    with pytest.raises(CorruptFileError, match="model.pt' is corrupt"):
        load_model(out)
    spec = json.load(open(osp.join(out, "model.json")))
    del spec["files"]  # a model.json that cannot vouch for model.pt
    json.dump(spec, open(osp.join(out, "model.json"), "w"))
    with pytest.raises(CorruptFileError, match="records no checksum of model.pt"):
        load_model(out)


def _partition_with_batches(graph, root: str, num_parts: int):
    r""":obj:`num_parts` parts and 3 random batches of the training nodes."""
    from pyg_dist.loader import random_batches, save_batches
    pyg_dist.partition_graph(graph, num_parts, root=root)
    nodes = graph.train_mask.nonzero().view(-1)
    batch_of = torch.full((graph.num_nodes, ), -1, dtype=torch.long)
    batch_of[nodes] = random_batches(nodes.numel(), 3, seed=0)
    save_batches(root, batch_of)
    return batch_of, nodes


@pytest.fixture
def batches(graph, tmp_path):
    r"""Two parts and cohesive batches of their training nodes."""
    root = str(tmp_path / "parts")
    return root, _partition_with_batches(graph, root, 2)[0]


def test_a_flipped_byte_in_the_batches_file_is_refused(batches, capsys):
    from pyg_dist.cli import main
    from pyg_dist.loader import load_batches
    root, batch_of = batches
    path = osp.join(root, "batches.pt")
    assert "batches.pt" in json.load(open(osp.join(root, "meta.json")))["files"]
    assert torch.equal(load_batches(root), batch_of)
    flip_bytes(path, os.path.getsize(path) // 2)
    with pytest.raises(CorruptFileError, match="batches.pt' is corrupt"):
        load_batches(root)
    with pytest.raises(SystemExit):
        main(["train", "--root", root, "--loader", "cohesive", "--epochs", "1",
              "--no-progress", "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert err.startswith("pyg-dist train: error: ") and "batches.pt' is corrupt" in err
    assert len(err.splitlines()) == 1


def test_a_flipped_byte_in_a_balanced_batch_part_is_refused(batches, graph):
    from pyg_dist.loader.cohesive.balance import batch_part_file, load_batch_part, \
        save_batch_parts
    from pyg_dist.loader.cohesive.cost import CostModel, HopGraph
    from pyg_dist.partition import PartitionBook
    from pyg_dist.preflight import PreflightError, check_training
    root, batch_of = batches
    book = PartitionBook.load(root)
    hops = HopGraph(graph.edge_index, graph.num_nodes, CostModel(dims=[4, 8, 8, 3]))
    save_batch_parts(root, graph, hops, batch_of, book.owner(book.inv_perm), 2,
                     book.meta["graph_hash"])
    path = batch_part_file(root, 1, 1)
    files = json.load(open(osp.join(root, "meta.json")))["files"]
    assert osp.relpath(path, root) in files
    config = TrainConfig(loader="cohesive", epochs=1, progress=False)
    check_training(root, config)  # whole files pass
    load_batch_part(root, 1, 1, 2)
    flip_bytes(path, os.path.getsize(path) // 2)
    with pytest.raises(PreflightError, match=re.escape(f"'{path}' is corrupt")):
        check_training(root, config)
    with pytest.raises(CorruptFileError, match=re.escape(f"'{path}' is corrupt")):
        load_batch_part(root, 1, 1, 2)
    shutil.rmtree(osp.dirname(path))  # a batch's folder lost: meta.json still lists it
    with pytest.raises(PreflightError, match=re.escape(f"'{path}' is missing")):
        check_training(root, config)


def test_batches_that_do_not_fit_the_graph_are_refused(graph, tmp_path):
    r"""Batches whose file is whole but whose nodes are not the training
    nodes (written so, not damaged): refused by their contents."""
    from pyg_dist.loader import load_batches, save_batches
    root = str(tmp_path / "one")
    batch_of, nodes = _partition_with_batches(graph, root, 1)
    _cohesive_loader(root)  # they fit
    moved = batch_of.clone()
    other = int((~graph.train_mask).nonzero()[0])
    moved[other], moved[nodes[0]] = moved[nodes[0]], -1  # a training node swapped out
    save_batches(root, moved)
    with pytest.raises(CorruptFileError, match="not rank 0's training nodes"):
        _cohesive_loader(root)
    gap = batch_of.clone()
    gap[gap == 1] = 0  # batch ids 0 and 2: batch 1 empty
    save_batches(root, gap)
    with pytest.raises(CorruptFileError, match="batch 1 holds no node"):
        load_batches(root)
    fewer = batch_of.clone()
    fewer[nodes[0]] = -1
    save_batches(root, fewer)
    with pytest.raises(CorruptFileError, match="graph has .* training nodes"):
        load_batches(root)
    save_batches(root, batch_of[:-1].clone())
    with pytest.raises(CorruptFileError, match="one int64 entry per node"):
        load_batches(root)
    torch.save({"batch_of": batch_of}, osp.join(root, "batches.pt"))  # not by save_batches
    with pytest.raises(CorruptFileError, match="batches.pt' is corrupt"):
        load_batches(root)


def _cohesive_loader(root: str) -> None:
    r"""Builds the cohesive loader of the stored batches as a training rank
    does (a world of one)."""
    from pyg_dist.distributed import init
    from pyg_dist.loader import LoaderInputs, build_loader
    from pyg_dist.nn import distribute
    from tests.models import build_model
    init()
    data = pyg_dist.DistData.load(root, 0)
    net = distribute(build_model("GCN", data.num_features), data)
    inputs = LoaderInputs(root, data, net.dist_context.num_layers, 0,
                          torch.device("cpu"), net.comm_stats, context=net.dist_context)
    build_loader("cohesive", inputs).close()


def test_a_checkpoint_without_its_sidecar_is_refused(graph, tmp_path, capsys):
    r"""No "legacy" file without a sidecar: it could hold anything (an
    altered optimiser state resumed to a loss of 583)."""
    from pyg_dist.cli import main
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 1, root=root)
    config = TrainConfig(hidden=8, epochs=2, progress=False, checkpoint_every=1)
    train(root, config, out)
    path = osp.join(out, "checkpoint", "epoch_2", "rank_0.pt")
    os.remove(path + ".json")
    with pytest.raises(CheckpointError, match="rank_0.pt.json' is missing"):
        train(root, dataclasses.replace(config, epochs=3, resume=True), out)
    with pytest.raises(SystemExit):
        main(["train", "--root", root, "--out", out, "--hidden", "8", "--epochs", "3",
              "--checkpoint-every", "1", "--resume", "--no-progress", "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rank_0.pt.json' is missing" in err


def test_predictions_are_listed_with_their_checksums(graph, tmp_path):
    from pyg_dist.inference import load_predictions, predict
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 1, root=root)
    _model_run(root, out)
    from pyg_dist.train import load_model
    model = load_model(out)
    pred = str(tmp_path / "pred")
    predict(model, root, pred)
    manifest = json.load(open(osp.join(pred, "predictions.json")))
    assert set(manifest["files"]) == {"pred_0.pt"}
    assert manifest["partitioning"]["graph_hash"] == json.load(
        open(osp.join(root, "meta.json")))["graph_hash"]
    n_id, _ = load_predictions(pred)
    assert torch.equal(n_id.sort().values, torch.arange(graph.num_nodes))
    flip_bytes(osp.join(pred, "pred_0.pt"), 300)
    with pytest.raises(CorruptFileError, match="pred_0.pt' is corrupt"):
        load_predictions(pred)


def test_calibration_files_carry_a_checksum(tmp_path):
    from pyg_dist.loader import CostModel
    cost = CostModel(dims=[8, 4, 2], alpha=4e-10, beta=1e-11, gamma=2e-10, eta=3e-10,
                     lam=5e-9, measured={"model": "sage"})
    path = cost.save(str(tmp_path / "c.json"))
    assert CostModel.load(path) == cost
    item = json.load(open(path))
    json.dump({**item, "alpha": 5e-10}, open(path, "w"))  # still valid, but not measured
    with pytest.raises(CorruptFileError, match="c.json' is corrupt or was edited"):
        CostModel.load(path)
    del item["sum64"]
    json.dump(item, open(path, "w"))
    with pytest.raises(CorruptFileError, match="holds no checksum"):
        CostModel.load(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_permission_error_is_not_called_corrupt(parts):
    from pyg_dist.integrity import UnreadableFileError
    path = osp.join(parts, "meta.json")
    os.chmod(path, 0)
    with pytest.raises(UnreadableFileError, match="cannot read .*meta.json': permission denied"):
        pyg_dist.DistData.load(parts, 0, world_size=2)
