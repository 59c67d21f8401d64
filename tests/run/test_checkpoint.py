"""Checkpoints: resuming gives exactly the uninterrupted run, a killed rank
is named by the survivors and the run resumes, bad files are refused."""
import dataclasses
import json
import os
import pickle

import pytest
import torch

import pyg_dist
from pyg_dist.checkpoint import CheckpointError
from pyg_dist.train import TrainConfig, train
from tests.run.checkpoint_workers import resume_runs, train_and_die

BASE = TrainConfig(hidden=16, epochs=4, progress=False, dropout=0.5)
CONFIGS = {
    "exact": BASE,
    # stale rows and gradients in flight, smoothed, under a sampled plan
    "pipeline": dataclasses.replace(BASE, sampler="bns", sampler_args={"p": 0.5},
                                    cache="pipeline",
                                    cache_args={"smooth_features": 0.9, "smooth_grads": 0.9}),
    "historical": dataclasses.replace(BASE, cache="historical",
                                      cache_args={"bound": "adaptive:2"}),
    # SANCUS on whole blocks: block versions and the last broadcast block
    "historical-broadcast": dataclasses.replace(BASE, cache="historical",
                                                cache_args={"bound": "gap-abs:2"},
                                                exchange="broadcast", clip_grad=0.5),
    "neighbor": dataclasses.replace(BASE, loader="neighbor", loader_args={
        "fanout": [3, 3, 3], "batch_size": 40, "workers": 1}),
}


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from tests.conftest import small_graph
    root = str(tmp_path_factory.mktemp("parts"))
    pyg_dist.partition_graph(small_graph(), 2, root=root)
    return root


def test_resume_equals_uninterrupted_run(parts, tmp_path):
    results = pyg_dist.spawn(resume_runs, 2, (parts, str(tmp_path), CONFIGS), timeout=60)[0]
    for name, (whole, resumed, loss_a, loss_b, epochs_a, epochs_b) in results.items():
        assert epochs_a == epochs_b == 4, name
        for key in whole:  # bit for bit: same draws, same dropout, same stale rows
            assert torch.equal(whole[key], resumed[key]), (name, key)
        assert loss_a == loss_b, name
    # Only the latest checkpoint is kept.
    assert os.listdir(tmp_path / "exact-parts" / "checkpoint") == ["latest.json", "epoch_4"] \
        or sorted(os.listdir(tmp_path / "exact-parts" / "checkpoint")) == ["epoch_4",
                                                                           "latest.json"]


def test_resume_keeps_gradient_buckets(tmp_path):
    # From 3 ranks on, where a gradient sits in the all-reduce's buckets
    # decides the order its sum adds the ranks' values in (2 ranks add in
    # either order alike). GAT's gradients arrive out of parameter order, so
    # its buckets are rebuilt after the first step: the resumed run's second
    # step must use those. No dropout: the buckets alone tell the runs apart.
    from tests.conftest import small_graph
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(small_graph(), 3, root=root)
    config = dataclasses.replace(BASE, model="gat", heads=2, epochs=2, dropout=0.0)
    whole, resumed, *_ = pyg_dist.spawn(resume_runs, 3, (root, str(tmp_path), {"gat": config}),
                                        timeout=60)[0]["gat"]
    differ = [key for key in whole if not torch.equal(whole[key], resumed[key])]
    assert not differ, differ


def test_killed_rank_is_named_and_run_resumes(parts, tmp_path):
    out = str(tmp_path / "run")
    config = dataclasses.replace(BASE, epochs=5, checkpoint_every=1)
    with pytest.raises(RuntimeError) as info:
        pyg_dist.spawn(train_and_die, 2, (parts, out, config, 1, 3), timeout=20)
    survivor = [line for line in str(info.value).splitlines() if line.startswith("rank 0:")]
    assert survivor and "lost rank 1" in survivor[0], str(info.value)
    assert json.load(open(os.path.join(out, "checkpoint", "latest.json")))["epoch"] == 2
    resumed = pyg_dist.spawn(train, 2, (parts, dataclasses.replace(config, resume=True), out),
                             timeout=60)[0]
    whole = pyg_dist.spawn(train, 2, (parts, config, str(tmp_path / "whole")), timeout=60)[0]
    assert resumed["final_loss"] == whole["final_loss"]
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5]


@pytest.fixture
def one_part(tmp_path):
    from tests.conftest import small_graph
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(small_graph(), 1, root=root)
    out = str(tmp_path / "run")
    train(root, dataclasses.replace(BASE, epochs=2, checkpoint_every=1), out)
    return root, out, os.path.join(out, "checkpoint", "epoch_2", "rank_0.pt")


def test_truncated_checkpoint_is_refused(one_part):
    root, out, path = one_part
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt, truncated"):
        train(root, dataclasses.replace(BASE, epochs=3, resume=True), out)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_tampered_checkpoint_never_executes(one_part, tmp_path, monkeypatch):
    root, out, path = one_part
    monkeypatch.chdir(tmp_path)
    with open(path, "wb") as f:
        pickle.dump({"epoch": 2, "model": _Exploit()}, f)
    torch.save({"epoch": 2, "model": _Exploit()}, path)
    with pytest.raises(CheckpointError):
        train(root, dataclasses.replace(BASE, epochs=3, resume=True), out)
    assert not os.path.exists(tmp_path / "pwned")


def test_other_runs_checkpoint_is_refused(one_part):
    root, out, _ = one_part
    with pytest.raises(CheckpointError, match="hidden: checkpoint 16, this run 32"):
        train(root, dataclasses.replace(BASE, hidden=32, epochs=3, resume=True), out)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        train(root, dataclasses.replace(BASE, resume=True), out + "-elsewhere")
