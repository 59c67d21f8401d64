"""The broadcast (CAGNET 1-D whole-block) exchange and SANCUS's local
gradient clipping, on real gloo worlds: the broadcast exchange computes
what single-process PyG and the halo exchange compute, and moves the bytes
the 1-D algorithm moves."""
import math

import pytest
import torch

import pyg_dist
from pyg_dist.config import TrainConfig
from tests.comm import broadcast_workers as workers
from tests.models import MODELS
from tests.numeric import assert_fp32_close, assert_params_close, assert_scalar_close
from tests.nn.test_exactness import _reference


@pytest.fixture(scope="module")
def parts3(tmp_path_factory, graph):
    root = str(tmp_path_factory.mktemp("parts3"))
    pyg_dist.partition_graph(graph, 3, root=root)
    return root


@pytest.fixture(scope="module")
def both(parts3):
    return pyg_dist.spawn(workers.both_exchanges, 3, (parts3, ), timeout=120)


def test_broadcast_exchange_matches_pyg_and_the_halo_exchange(graph, both):
    r"""Every model: outputs, loss and weight gradients equal single-process
    PyG on the whole graph, and the halo exchange's."""
    for name in MODELS:
        out, loss, magnitude, grads = _reference(graph, name, 0)
        n_id = torch.cat([r["n_id"] for r in both])
        got = torch.cat([r[name, "broadcast"]["out"] for r in both])
        halo = torch.cat([r[name, "halo"]["out"] for r in both])
        assert_fp32_close(got, out[n_id], msg=f"{name}: outputs")
        assert_fp32_close(got, halo, msg=f"{name}: outputs against the halo exchange")
        result = both[0][name, "broadcast"]
        assert_scalar_close(result["loss"], loss, msg=f"{name}: loss", scale=magnitude)
        assert_params_close(result["grads"], grads, msg=f"{name}: grad")
        assert_params_close(result["grads"], both[0][name, "halo"]["grads"],
                            msg=f"{name}: grad against the halo exchange")


def test_broadcast_moves_whole_blocks(both, graph):
    r"""A 3-layer GraphSAGE: per layer, rank :math:`i` sends its block to
    the :math:`P - 1` others and receives theirs; backward, it sends a dense
    gradient of every other block and receives :math:`P - 1` of its own
    (the input features need no gradient). The halo exchange moves the
    halo rows only, fewer. Blocks are the layers' inputs (no projection
    before the exchange on whole blocks); the halo exchange sends the last
    layer's rows projected (8 -> 5, see DistSAGEConv)."""
    widths = {"convs.0.x": graph.num_features, "convs.1.x": 8, "convs.2.x": 8}
    halo_widths = {**widths, "convs.2.x": 5}
    for r in both:
        n, total, world = r["num_inner"], sum(r["sizes"]), len(r["sizes"])
        sent, recv = r["GraphSAGE", "broadcast"]["sent"], r["GraphSAGE", "broadcast"]["recv"]
        halo_recv = r["GraphSAGE", "halo"]["recv"]
        for key, width in widths.items():
            row = width * 4
            assert sent[key] == (world - 1) * n * row and recv[key] == (total - n) * row
            assert halo_recv[key] == r["num_halo"] * halo_widths[key] * 4 < recv[key]
            if key != "convs.0.x":
                assert sent[key + ".grad"] == (total - n) * row
                assert recv[key + ".grad"] == (world - 1) * n * row
        assert "convs.0.x.grad" not in sent


def test_broadcast_with_a_codec(both):
    r"""Rows and gradients encoded (bf16) on the broadcast exchange: the
    same rows arrive as through the halo exchange with the same codec, so
    the same outputs and gradients, in half the bytes of fp32 blocks."""
    for r in both:
        bcast, halo = r["bf16", "broadcast"], r["bf16", "halo"]
        assert_fp32_close(bcast["out"], halo["out"], msg="bf16 outputs")
        assert_params_close(bcast["grads"], halo["grads"], msg="bf16 grad")
        fp32 = r["GraphSAGE", "broadcast"]["sent"]
        assert all(2 * bcast["sent"][k] == fp32[k] for k in fp32)


def test_broadcast_training_matches_pyg(graph, tmp_path):
    r"""``train()`` with the broadcast exchange: the trained parameters and
    the final loss equal single-process PyG's (GCN, so its whole-graph
    normalisation and its weights-before-exchange order are covered)."""
    from pyg_dist.train import load_model, train_single_process
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 2, root=root)
    config = TrainConfig(model="gcn", num_layers=2, hidden=16, dropout=0.0, epochs=4,
                         progress=False, exchange="broadcast")
    summary = pyg_dist.spawn(workers.train_rank, 2, (root, config, out), timeout=120)[0]
    reference, ref_model = train_single_process(graph, config)
    assert_params_close(dict(load_model(out).named_parameters()),
                        dict(ref_model.named_parameters()), msg="parameter")
    assert_scalar_close(summary["final_loss"], reference["final_loss"], msg="final loss")
    assert summary["config"]["exchange"] == "broadcast"


def test_broadcast_refusals(parts3):
    r"""What the broadcast exchange cannot run with is refused with a clear
    message: in the config before any work, in :func:`distribute`, and a
    sampled plan at its first exchange."""
    for kwargs, word in ((dict(sampler="bns"), "sampler='bns'"),
                         (dict(loader="neighbor"), "loader='neighbor'"),
                         (dict(cache="pipeline"), "cache='pipeline'"),
                         (dict(feature_cache="degree"), "feature_cache='degree'"),
                         (dict(overlap=True), "overlap=True")):
        with pytest.raises(ValueError, match=word):
            TrainConfig(exchange="broadcast", **kwargs).validate()
    with pytest.raises(ValueError, match="Unknown exchange 'ring'"):
        TrainConfig(exchange="ring").validate()
    TrainConfig(exchange="broadcast", cache="historical").validate()
    for r in pyg_dist.spawn(workers.refusals, 3, (parts3, ), timeout=120):
        assert "PipelineCache does not run on exchange='broadcast'" in r["pipeline"]
        assert "does not combine" in r["overlap"] and "does not combine" in r["feature_cache"]
        assert "exact full-graph plan only" in r["sampled"]


def test_local_gradient_clipping(tmp_path, graph):
    r"""SANCUS §4.3.2: each rank clips its own gradient to norm
    :math:`\sqrt{P}\, th` before the all-reduce. With :math:`th` between the
    ranks' norms over :math:`\sqrt P`, the rank above is scaled down to it,
    the other is not, and the sum differs from the unclipped one."""
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(graph, 2, root=root)
    ranks = pyg_dist.spawn(workers.local_clipping, 2, (root, ), timeout=120)
    world, clip = len(ranks), ranks[0]["clip"]
    limit = math.sqrt(world) * clip
    clipped = [r["norm"] > limit for r in ranks]
    assert sorted(clipped) == [False, True]
    want = {k: sum(r["local"][k] * min(1.0, limit / r["norm"]) for r in ranks)
            for k in ranks[0]["local"]}
    unclipped = {k: sum(r["local"][k] for r in ranks) for k in want}
    for r in ranks:
        assert_params_close(r["reduced"], want, msg="clipped sum")
    gap = max(float((want[k] - unclipped[k]).abs().max()) for k in want)
    assert gap > 1e-2 * max(float(g.abs().max()) for g in unclipped.values())


def test_clip_grad_is_validated():
    for value in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="clip_grad must be > 0 and finite"):
            TrainConfig(clip_grad=value).validate()
    TrainConfig(clip_grad=1.0).validate()


def test_runs_written_before_the_new_fields_still_match():
    r"""A checkpoint identity or summary written before ``exchange`` and
    ``clip_grad`` existed reads as the halo exchange without clipping (what
    those runs did), so their checkpoints still resume."""
    from pyg_dist.config import upgrade
    old = {k: v for k, v in TrainConfig().to_dict().items()
           if k not in ("exchange", "clip_grad")}
    assert upgrade(old)["exchange"] == "halo" and upgrade(old)["clip_grad"] is None
    assert upgrade(old) == upgrade(TrainConfig().to_dict())
