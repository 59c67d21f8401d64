"""The NCCL/GPU path: training on the local GPU (``LOCAL_RANK``) equals
single-process PyG. Skipped without CUDA (CI has no GPU); run on a GPU
machine with ``pytest tests/run/test_gpu.py``."""
import dataclasses

import pytest
import torch

import pyg_dist
from pyg_dist.train import TrainConfig, load_model, train, train_single_process
from tests.numeric import assert_params_close, assert_scalar_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CONFIG = TrainConfig(model="sage", num_layers=2, hidden=16, dropout=0.0, epochs=5,
                     progress=False)


def _train_on_gpu(root, config, out):
    assert pyg_dist.device().type == "cuda"
    return train(root, config, out)


def _check(graph, tmp_path, world_size: int, config: TrainConfig) -> None:
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, world_size, root=root)
    summary = pyg_dist.spawn(_train_on_gpu, world_size, (root, config, out),
                             backend="nccl", timeout=120)[0]
    reference, ref_model = train_single_process(graph, config)
    assert_params_close(dict(load_model(out).named_parameters()),
                        dict(ref_model.named_parameters()), msg="parameter")
    assert_scalar_close(summary["final_loss"], reference["final_loss"], msg="final loss")


def test_nccl_full_graph_training_matches_pyg(graph, tmp_path):
    _check(graph, tmp_path, 1, CONFIG)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (one per rank)")
def test_nccl_two_ranks_match_pyg(graph, tmp_path):
    _check(graph, tmp_path, 2, CONFIG)


def test_neighbor_loader_batches_reach_the_gpu(graph, tmp_path):
    r"""Batches are sampled on the CPU (gloo side groups beside the NCCL
    world), pinned and copied to the GPU; with every neighbour taken the
    run equals full-graph PyG."""
    config = dataclasses.replace(CONFIG, loader="neighbor", loader_args={
        "fanout": [-1, -1], "batch_size": 10_000, "workers": 1})
    _check(graph, tmp_path, 1, config)


@pytest.mark.parametrize("model", ["sage", "gat"])
def test_sequential_exchange_on_the_gpu(graph, tmp_path, model):
    r"""The sequential exchange's pieces, folds and recomputation (GAT: the
    softmax folded over pieces) on CUDA tensors."""
    _check(graph, tmp_path, 1, dataclasses.replace(CONFIG, model=model, exchange="sequential"))
