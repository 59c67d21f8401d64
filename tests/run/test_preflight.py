"""Everything the launcher can check is checked before any rank starts:
``pyg-dist train`` and ``pyg-dist predict`` refuse a bad file, world size,
folder or model in one line naming it, and leave earlier results whole."""
import dataclasses
import functools
import json
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest
import torch

import pyg_dist
from pyg_dist.cli import main
from pyg_dist.preflight import PreflightError, check_training
from pyg_dist.train import TrainConfig, train
from tests.conftest import flip_bytes, small_graph

TRAIN = ["--epochs", "1", "--hidden", "8", "--no-progress", "--no-plots"]


def _refused(capsys, command: str, argv, *names: str) -> str:
    r"""Runs the CLI in this process (a spawned rank would show in the
    output and take seconds); it must exit non-zero with one line on
    stderr naming :obj:`names`."""
    with pytest.raises(SystemExit) as info:
        main([command, *argv])
    assert info.value.code not in (0, None)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"pyg-dist {command}: error: "), err
    for name in names:
        assert name in err, err
    assert captured.out == ""  # no rank printed anything: none started
    return err


@pytest.fixture
def parts(graph, tmp_path):
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(graph, 2, root=root)
    return root


@pytest.fixture
def one_part(graph, tmp_path):
    root = str(tmp_path / "one")
    pyg_dist.partition_graph(graph, 1, root=root)
    return root


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "foreign", "missing", "directory"])
def test_a_bad_part_file_is_one_line_before_any_rank(parts, graph, tmp_path, capsys, damage):
    path = osp.join(parts, "part_1.pt")
    if damage == "corrupt":
        flip_bytes(path, os.path.getsize(path) // 2)
    elif damage == "truncated":
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 3])
    elif damage == "foreign":  # a whole, valid part of another partitioning
        other = str(tmp_path / "other")
        pyg_dist.partition_graph(graph, 2, root=other, method="random")
        shutil.copy(osp.join(other, "part_1.pt"), path)
    elif damage == "missing":
        os.remove(path)
    else:  # unreadable: reading a directory fails even as root
        os.remove(path)
        os.mkdir(path)
    err = _refused(capsys, "train", ["--root", parts, *TRAIN], "part_1.pt")
    assert "part_0.pt" not in err  # the intact part is not blamed
    assert {"corrupt": "corrupt", "truncated": "truncated", "foreign": "of another run",
            "missing": "missing", "directory": "cannot read"}[damage] in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_part_file_is_a_permission_error(parts, capsys):
    path = osp.join(parts, "part_1.pt")
    os.chmod(path, 0)
    err = _refused(capsys, "train", ["--root", parts, *TRAIN], "part_1.pt")
    assert "permission denied" in err and "corrupt" not in err


def test_the_real_cli_fails_in_one_line(parts):
    r"""The console script itself: exit status 1 and one line, no rank."""
    flip_bytes(osp.join(parts, "part_0.pt"), 100)
    p = subprocess.run([sys.executable, "-m", "pyg_dist.cli", "train", "--root", parts,
                        *TRAIN], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [p.stderr.strip()], p.stderr
    assert "part_0.pt' is corrupt" in p.stderr and p.stdout == ""


@pytest.mark.parametrize("name", ["meta.json", "latest.json", "model.json"])
def test_an_index_of_garbage_bytes_is_named(one_part, tmp_path, capsys, name):
    out = str(tmp_path / "run")
    train(one_part, TrainConfig(hidden=8, epochs=1, progress=False, checkpoint_every=1), out)
    path = {"meta.json": osp.join(one_part, "meta.json"),
            "latest.json": osp.join(out, "checkpoint", "latest.json"),
            "model.json": osp.join(out, "model.json")}[name]
    with open(path, "wb") as f:
        f.write(b"\xff\xfe\x00garbage\x80")
    if name == "model.json":
        argv = ["predict", "--root", one_part, "--model-dir", out, "--out",
                str(tmp_path / "pred")]
    else:
        argv = ["train", "--root", one_part, "--out", out, *TRAIN, "--epochs", "2",
                "--resume"]
    err = _refused(capsys, argv[0], argv[1:], path)
    assert "not UTF-8 JSON" in err


@pytest.mark.parametrize("damage", ["num_parts", "files", "parts"])
def test_a_meta_json_of_valid_json_but_damaged_is_named(one_part, capsys, damage):
    path = osp.join(one_part, "meta.json")
    meta = json.load(open(path))
    if damage == "num_parts":  # a flipped bit in a key: still JSON
        meta["num_partz"] = meta.pop("num_parts")
    else:
        meta[damage] = "damaged"
    json.dump(meta, open(path, "w"))
    err = _refused(capsys, "train", ["--root", one_part, *TRAIN], path)
    assert f"its '{damage}' is missing or not a" in err


def test_checkpoints_with_nowhere_to_go_are_refused(one_part, capsys):
    _refused(capsys, "train", ["--root", one_part, *TRAIN, "--checkpoint-every", "1"],
             "checkpoints need a directory")


def test_world_size_other_than_the_parts(parts, capsys):
    _refused(capsys, "train", ["--root", parts, "--nproc", "3", *TRAIN],
             "holds 2 partitions but 3 ranks would start")


@pytest.mark.parametrize("flag", ["--out", "--checkpoint-dir"])
def test_an_output_folder_that_cannot_be_created(parts, tmp_path, capsys, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where a folder must go")
    target = str(blocker / "run")
    argv = ["--root", parts, *TRAIN, flag, target]
    if flag == "--checkpoint-dir":
        argv += ["--checkpoint-every", "1"]
    _refused(capsys, "train", argv, f"cannot create {flag} '{target}'", "is a file")
    assert blocker.read_text() == "a file where a folder must go"


def test_a_graph_without_training_nodes_is_refused(tmp_path, capsys):
    data = small_graph()
    data.train_mask = torch.zeros_like(data.train_mask)
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(data, 2, root=root)
    _refused(capsys, "train", ["--root", root, "--out", str(tmp_path / "run"), *TRAIN],
             "no training node")
    assert not osp.exists(tmp_path / "run")
    # train() called in the ranks directly (no launcher) refuses it too
    from pyg_dist.train import TrainConfig, train
    with pytest.raises(RuntimeError, match="no training node"):
        pyg_dist.spawn(train, 2, (root, TrainConfig(epochs=1, progress=False),
                                  str(tmp_path / "run")), timeout=30)
    assert not osp.exists(tmp_path / "run" / "model.pt")


def test_every_problem_is_one_line(parts, tmp_path):
    r"""Several problems at once: each is reported, one line each."""
    flip_bytes(osp.join(parts, "part_0.pt"), 64)
    os.remove(osp.join(parts, "part_1.pt"))
    (tmp_path / "f").write_text("")
    with pytest.raises(PreflightError) as info:
        check_training(parts, TrainConfig(), str(tmp_path / "f" / "run"), nproc=3)
    lines = info.value.problems
    assert len(lines) == 4 and str(info.value).splitlines() == lines
    assert any("3 ranks would start" in line for line in lines)
    assert any("part_0.pt' is corrupt" in line for line in lines)
    assert any("part_1.pt' is missing" in line for line in lines)
    assert any("cannot create --out" in line for line in lines)


def test_overwrite_keeps_the_old_run_when_the_new_one_is_refused(one_part, tmp_path, capsys):
    out = str(tmp_path / "run")
    main(["train", "--root", one_part, "--out", out, *TRAIN, "--checkpoint-every", "1"])
    capsys.readouterr()
    before = {name: open(osp.join(out, name), "rb").read()
              for name in ("metrics.jsonl", "model.pt", "model.json", "summary.json")}
    flip_bytes(osp.join(one_part, "part_0.pt"), 200)
    _refused(capsys, "train", ["--root", one_part, "--out", out, *TRAIN, "--overwrite"],
             "part_0.pt")
    for name, data in before.items():
        assert open(osp.join(out, name), "rb").read() == data, name
    assert osp.exists(osp.join(out, "checkpoint", "latest.json"))
    # train() itself (no launcher): the old run goes only once the inputs were read
    with pytest.raises(RuntimeError, match="part_0.pt' is corrupt"):
        train(one_part, TrainConfig(hidden=8, epochs=1, progress=False, overwrite=True), out)
    for name, data in before.items():
        assert open(osp.join(out, name), "rb").read() == data, name


def test_overwrite_waits_for_every_rank_s_inputs(parts, tmp_path):
    r"""Two ranks in train() directly: rank 0's inputs are whole, rank 1's
    part is corrupt; rank 0 must not remove the old run before rank 1 has
    read its part."""
    out = str(tmp_path / "run")
    pyg_dist.spawn(train, 2, (parts, TrainConfig(hidden=8, epochs=1, progress=False), out),
                   timeout=60)
    before = open(osp.join(out, "model.pt"), "rb").read()
    flip_bytes(osp.join(parts, "part_1.pt"), 200)
    with pytest.raises(RuntimeError, match="part_1.pt' is corrupt"):
        pyg_dist.spawn(train, 2, (parts, TrainConfig(hidden=8, epochs=1, progress=False,
                                                     overwrite=True), out), timeout=60)
    assert open(osp.join(out, "model.pt"), "rb").read() == before


def test_a_resume_that_cannot_continue_is_refused(one_part, tmp_path):
    out = str(tmp_path / "run")
    config = TrainConfig(hidden=8, epochs=2, progress=False, checkpoint_every=1)
    train(one_part, config, out)
    with pytest.raises(PreflightError) as info:
        check_training(one_part, TrainConfig(hidden=16, epochs=3, resume=True), out)
    assert info.value.problems == [info.value.problems[0]]
    assert "belongs to another run (hidden: checkpoint 8, this run 16)" in str(info.value)
    with pytest.raises(PreflightError, match="at epoch 2: --epochs 1 would train nothing"):
        check_training(one_part, TrainConfig(hidden=8, epochs=1, checkpoint_every=1,
                                             resume=True), out)
    check_training(one_part, TrainConfig(hidden=8, epochs=3, checkpoint_every=1,
                                         resume=True), out)  # this one may continue


@pytest.fixture
def model_dir(one_part, tmp_path):
    out = str(tmp_path / "model")
    train(one_part, TrainConfig(hidden=8, epochs=1, progress=False), out)
    return out


def test_a_flipped_byte_in_the_model_is_refused(parts, model_dir, tmp_path, capsys):
    path = osp.join(model_dir, "model.pt")
    flip_bytes(path, os.path.getsize(path) // 2, 4)
    pred = str(tmp_path / "pred")
    _refused(capsys, "predict", ["--root", parts, "--model-dir", model_dir, "--out", pred],
             "model.pt' is corrupt")
    assert not osp.exists(pred)


def test_a_model_of_another_feature_width_is_one_line(parts, tmp_path, capsys):
    other = str(tmp_path / "other")
    pyg_dist.partition_graph(pyg_dist.datasets.synthetic_communities(
        num_nodes=60, num_classes=5, num_features=6, num_communities=4, avg_degree=4), 1,
        root=other)
    out = str(tmp_path / "model6")
    train(other, TrainConfig(hidden=8, epochs=1, progress=False), out)
    _refused(capsys, "predict", ["--root", parts, "--model-dir", out, "--out",
                                 str(tmp_path / "pred")],
             "takes 6 input features", "has 12")


def test_predictions_of_another_run_are_never_mixed(parts, one_part, model_dir, tmp_path,
                                                     capsys):
    r"""A 2-rank prediction, then a 1-rank one into the same folder: refused
    (the stale ``pred_1.pt`` would be read as this run's), and with
    ``--overwrite`` the folder holds exactly the new run's files."""
    pred = str(tmp_path / "pred")
    main(["predict", "--root", parts, "--model-dir", model_dir, "--out", pred])
    assert sorted(os.listdir(pred)) == ["pred_0.pt", "pred_1.pt", "predictions.json"]
    capsys.readouterr()
    _refused(capsys, "predict", ["--root", one_part, "--model-dir", model_dir, "--out", pred],
             "holds predictions (pred_0.pt, pred_1.pt, predictions.json)", "--overwrite")
    main(["predict", "--root", one_part, "--model-dir", model_dir, "--out", pred,
          "--overwrite"])
    assert sorted(os.listdir(pred)) == ["pred_0.pt", "predictions.json"]
    manifest = json.load(open(osp.join(pred, "predictions.json")))
    assert list(manifest["files"]) == ["pred_0.pt"]
    assert manifest["partitioning"]["num_parts"] == 1
    assert manifest["model"]["model_dir"] == osp.abspath(model_dir)
    from pyg_dist.inference import load_predictions
    n_id, pred_ = load_predictions(pred)
    assert torch.equal(n_id.sort().values, torch.arange(240)) and pred_.numel() == 240
    # the Python API in the ranks (no launcher) keeps the same rule, and
    # leaves files that are not predictions alone
    from pyg_dist.train import load_model
    open(osp.join(pred, "pred_backup.pt"), "w").write("the user's own file")
    model = load_model(model_dir)
    with pytest.raises(RuntimeError, match="holds predictions .*pass --overwrite"):
        pyg_dist.spawn(pyg_dist.predict, 2, (model, parts, pred), timeout=60)
    pyg_dist.spawn(functools.partial(pyg_dist.predict, overwrite=True), 2,
                   (model, parts, pred), timeout=60)
    assert sorted(os.listdir(pred)) == ["pred_0.pt", "pred_1.pt", "pred_backup.pt",
                                        "predictions.json"]


@pytest.mark.parametrize("swap", ["other rank", "other run"])
def test_a_checkpoint_pair_of_another_rank_or_run_is_refused(parts, tmp_path, capsys, swap):
    r"""Each rank's checkpoint is its own (its sampler's draws, its cache, its
    random streams): rank 1's pair replaced by rank 0's of the same run and
    epoch, or by rank 1's of another run at the same epoch, whole and
    matching their sidecars, is refused before any rank starts."""
    config = TrainConfig(hidden=8, epochs=1, progress=False, checkpoint_every=1)
    runs = [str(tmp_path / "run"), str(tmp_path / "twin")]
    for out in runs[:1 + (swap == "other run")]:
        pyg_dist.spawn(train, 2, (parts, config, out), timeout=60)
    mine = osp.join(runs[0], "checkpoint", "epoch_1", "rank_1.pt")
    theirs = (osp.join(runs[0], "checkpoint", "epoch_1", "rank_0.pt") if swap == "other rank"
              else osp.join(runs[1], "checkpoint", "epoch_1", "rank_1.pt"))
    for suffix in ("", ".json"):
        shutil.copy(theirs + suffix, mine + suffix)
    err = _refused(capsys, "train", ["--root", parts, "--out", runs[0], *TRAIN, "--epochs", "2",
                                     "--checkpoint-every", "1", "--resume"], mine)
    assert ("rank 0's checkpoint" if swap == "other rank" else "another run") in err
    with pytest.raises(RuntimeError, match="rank 0's checkpoint|another run"):
        pyg_dist.spawn(train, 2, (parts, dataclasses.replace(config, epochs=2, resume=True),
                                  runs[0]), timeout=60)


def test_a_read_only_checkpoint_folder_inside_out_is_refused(one_part, tmp_path, capsys):
    r"""A resumed run writes its checkpoints into ``--out``'s ``checkpoint``
    folder, which must be writable before any rank starts (an immutable
    folder refuses even root)."""
    out = str(tmp_path / "run")
    train(one_part, TrainConfig(hidden=8, epochs=1, progress=False, checkpoint_every=1), out)
    folder = osp.join(out, "checkpoint")
    if subprocess.run(["chattr", "+i", folder], capture_output=True).returncode != 0:
        pytest.skip("no chattr +i on this filesystem")
    try:
        _refused(capsys, "train", ["--root", one_part, "--out", out, *TRAIN, "--epochs", "2",
                                   "--checkpoint-every", "1", "--resume"],
                 f"--checkpoint-dir '{folder}' is not writable")
    finally:
        subprocess.run(["chattr", "-i", folder], check=True)
