"""Halo caches: staleness exactly as specified, bounds respected, cached
rows correct, no exchange left in flight — on real gloo worlds."""
import pytest
import torch

import pyg_dist
from pyg_dist.cache import FeatureCache, HistoricalCache, PipelineCache, check_cache
from pyg_dist.cache.feature import parse_capacity
from tests import cache_workers as workers
from tests.numeric import assert_fp32_close, assert_params_close


@pytest.fixture(scope="module")
def parts3(tmp_path_factory):
    from tests.conftest import small_graph
    root = str(tmp_path_factory.mktemp("parts3"))
    pyg_dist.partition_graph(small_graph(), 3, root=root)
    return root


@pytest.fixture(scope="module")
def parts2(tmp_path_factory):
    from tests.conftest import small_graph
    root = str(tmp_path_factory.mktemp("parts2"))
    pyg_dist.partition_graph(small_graph(), 2, root=root)
    return root


@pytest.mark.parametrize("tau,gamma,sampled,start", [
    (1, None, False, "sync"), (2, None, False, "sync"), (3, 0.8, False, "sync"),
    (2, None, True, "sync"), (1, 0.8, False, "zero"), (2, None, True, "zero")])
def test_pipeline_uses_the_exchange_of_t_minus_tau(parts3, tau, gamma, sampled, start):
    r"""Forward: the rows of iteration max(t - τ, 0) (smoothed: the moving
    average of those). Backward: the owners add the halo gradients of
    iteration max(t - τ, 0). Under a sampler, of the plan of iteration t.
    The reference's start: zero rows and gradients before iteration τ,
    the moving averages from zero."""
    for steps in pyg_dist.spawn(workers.pipeline_checks, 3,
                                (parts3, tau, gamma, sampled, start), timeout=120):
        for t, rows, want_rows, grad, want_grad in steps:
            assert_fp32_close(rows, want_rows, msg=f"iteration {t}: rows")
            assert_fp32_close(grad, want_grad, msg=f"iteration {t}: gradients")


@pytest.fixture(scope="module", params=[(1, "sage", None), (2, "gcn", 0.9)],
                ids=["1-sage", "2-gcn-smoothed"])
def pipelined_models(parts3, request):
    return pyg_dist.spawn(workers.pipelined_model_checks, 3, (parts3, *request.param),
                          timeout=120)


def test_frozen_pipelined_model_equals_exact(pipelined_models):
    r"""Frozen weights: once the pipeline is full, stale rows and gradients
    are the current ones, and the model computes what the exact one does."""
    for r in pipelined_models:
        (out_exact, grads_exact), steps = r["frozen"]
        tau = len(steps) // 2 - 1
        for t, out, grads in steps[tau:]:
            assert_fp32_close(out, out_exact, msg=f"iteration {t}: outputs")
            assert_params_close(grads, grads_exact, msg=f"iteration {t}: gradient")


def test_pipelined_training_equals_its_definition(pipelined_models):
    r"""Weights that change every iteration: the pipelined model's outputs
    and gradients equal those of the oracle that fetches the rows and
    gradients of iteration max(t - τ, 0) synchronously, so a row or a
    gradient of another iteration shows. Bit for bit the same when the
    peers' messages arrive in other orders (each has its own buffer rows,
    added in peer order)."""
    for r in pipelined_models:
        pipelined, replayed, jittered = r["training"]
        assert not torch.equal(replayed[0][0], replayed[-1][0])  # the weights moved
        for t, ((out, grads), (want_out, want_grads), (out_j, grads_j)) in enumerate(
                zip(pipelined, replayed, jittered)):
            assert_fp32_close(out, want_out, msg=f"iteration {t}: outputs")
            assert_params_close(grads, want_grads, msg=f"iteration {t}: gradient")
            assert torch.equal(out_j, out) and all(torch.equal(grads_j[k], g)
                                                   for k, g in grads.items()), t


@pytest.mark.parametrize("model_name,tau", [("gcn", 1), ("gcn", 2), ("sage", 1)])
def test_stale_cache_keeps_only_features_stale(parts2, model_name, tau):
    r"""PipeGCN and PSC-GCN keep features stale, never weights: at iteration
    :math:`t` every layer equals single-process PyG with the current
    weights on the whole graph, where this rank's halo nodes carry the
    layer's input of iteration :math:`\max(t - \tau, 0)` (weights change
    every iteration). A layer exchanging :math:`X\Theta` (GCN's order in
    PyG) would show the weights of an earlier iteration."""
    from torch_geometric.nn import GCNConv, SAGEConv
    from tests.conftest import small_graph
    graph = small_graph()
    ranks = pyg_dist.spawn(workers.stale_layer_records, 2, (parts2, model_name, tau),
                           timeout=120)
    iterations, layers = len(ranks[0]["records"]), len(ranks[0]["records"][0])
    for t in range(iterations):
        s = max(t - tau, 0)
        for layer in range(layers):
            inputs = [torch.zeros(graph.num_nodes, ranks[0]["records"][i][layer][0].size(1))
                      for i in (t, s)]
            for r in ranks:  # the layer's whole-graph input at iterations t and s
                for full, i in zip(inputs, (t, s)):
                    full[r["inner"]] = r["records"][i][layer][0]
            for r in ranks:
                rows, out, state = r["records"][t][layer]
                conv = (GCNConv(rows.size(1), out.size(1)) if model_name == "gcn"
                        else SAGEConv(rows.size(1), out.size(1)))
                conv.load_state_dict(state)
                mixed = inputs[0].clone()
                mixed[r["halo"]] = inputs[1][r["halo"]]
                with torch.no_grad():
                    want = conv(mixed, graph.edge_index)[r["inner"]]
                assert_fp32_close(out, want, msg=f"iteration {t}, layer {layer}")
    first, last = ranks[0]["records"][0][0][2], ranks[0]["records"][-1][0][2]
    assert not all(torch.equal(first[k], last[k]) for k in first)  # the weights moved


def test_stale_cache_refuses_rows_computed_with_weights(tmp_path):
    r"""A layer that transforms its input with its own weights before
    propagate (SAGE's ``project``) would exchange rows that carry stale
    weights: refused under a stale cache, fine under the exact one."""
    from torch_geometric.nn import SAGEConv
    from tests.conftest import small_graph
    pyg_dist.partition_graph(small_graph(), 1, root=str(tmp_path))
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    for cache, fails in ((None, False), (PipelineCache(1), True)):
        layer = pyg_dist.nn.distribute(SAGEConv(part.num_features, 4, project=True), part,
                                       cache=cache)
        if fails:
            with pytest.raises(NotImplementedError, match="own parameters"):
                layer(part.x, part.adj_t)
        else:
            layer(part.x, part.adj_t)


def test_dropout_goes_after_the_exchange(parts2):
    for r in pyg_dist.spawn(workers.dropout_after_exchange, 2, (parts2, ), timeout=120):
        assert r["sent_undropped"]  # the rows travel before dropout...
        # ...and are dropped on arrival (p = 0.5): zeros of ReLU and of dropout
        expected = 1 - (1 - r["input_zeros"]) * 0.5
        assert abs(r["halo_zeros"] - expected) < 0.05, r


def test_exception_mid_iteration_leaves_nothing_in_flight(parts3):
    for r in pyg_dist.spawn(workers.pipeline_exception_checks, 3, (parts3, ), timeout=120):
        assert r["raised"] and r["in_flight"] == 0
        assert_fp32_close(r["eval"], r["want"], msg="evaluation after finish()")
        assert_fp32_close(r["train"], r["want"], msg="training after finish()")


def _agree(results):
    r"""Every exchange an owner made matches what its receiver expected."""
    by_rank = {r["rank"]: r["logs"] for r in results}
    for rank, logs in by_rank.items():
        for key, log in logs.items():
            for i, (t, send_counts, _) in enumerate(log):
                for peer, count in enumerate(send_counts):
                    if peer != rank:
                        t_peer, _, recv_counts = by_rank[peer][key][i]
                        assert t_peer == t and recv_counts[rank] == count, (key, t)


@pytest.mark.parametrize("bound", ["fixed:2", "adaptive:1"])
def test_historical_epoch_bounds(parts3, bound):
    kind, epochs = bound.split(":")
    epochs = int(epochs)
    results = pyg_dist.spawn(workers.historical_checks, 3, (parts3, bound, False),
                             timeout=120)
    _agree(results)
    for r in results:
        assert r["max_age"] and max(r["max_age"].values()) == epochs
        assert r["saved"] > 0
        for t, layers in enumerate(r["rounds"]):
            resend = t % (epochs + 1) == 0  # exact plan: every row has one age
            for key, received in layers.items():
                assert (received > 0) == resend, (t, key, received)


@pytest.mark.parametrize("bound", ["adaptive:2", "fixed:2"])
def test_historical_under_sampling_bounds_every_row(parts3, bound):
    results = pyg_dist.spawn(workers.historical_checks, 3, (parts3, bound, True),
                             timeout=120)
    _agree(results)
    for r in results:
        assert max(r["max_age"].values()) <= 2
        # rows age apart: some rounds outside the every-third schedule send rows
        assert any(v > 0 for t, layers in enumerate(r["rounds"]) if t % 3
                   for v in layers.values())


def test_historical_gap_bound(parts3):
    results = pyg_dist.spawn(workers.historical_checks, 3, (parts3, "gap:0.05", False),
                             timeout=120)
    _agree(results)
    skipped = 0
    for r in results:
        assert all(g <= 0.05 for g in r["max_gap"].values()), r["max_gap"]
        skipped += sum(v == 0 for layers in r["rounds"][1:] for v in layers.values())
    assert skipped > 0  # the bound let some rounds skip


@pytest.mark.parametrize("policy", ["inclusion", "degree", "random"])
def test_feature_cache(parts3, graph, policy):
    for r in pyg_dist.spawn(workers.feature_cache_checks, 3, (parts3, policy, "40%"),
                            timeout=120):
        # a cached row always equals the owner's row
        assert torch.equal(r["cached_rows"], graph.x[r["cached_ids"]])
        assert r["cached"].sum() == r["num_rows"] > 0
        row_bytes = r["num_features"] * 4
        for round in r["rounds"]:
            assert torch.equal(round["out"], round["want"])  # same rows, same order
            assert round["hits"] == round["want_hits"] and round["lookups"] == round["num_recv"]
            assert round["bytes"] == (round["num_recv"] - round["hits"]) * row_bytes
        if policy == "inclusion":
            p, cached = r["inclusion"], r["cached"]
            assert p[cached].min() >= p[~cached].max() - 1e-6


def test_invalid_cache_parameters():
    for name, params in [("pipeline", dict(staleness=0)), ("pipeline", dict(staleness=1.5)),
                         ("pipeline", dict(smooth_features=1.0)),
                         ("pipeline", dict(start="zeros")),
                         ("historical", dict(bound="fixed:-1")),
                         ("historical", dict(bound="gap:0")),
                         ("historical", dict(bound="sometimes:3")),
                         ("historical", dict(staleness=2)), ("lru", {})]:
        with pytest.raises(ValueError):
            check_cache(name, params)
    for policy, capacity in [("lru", "10"), ("inclusion", "150%"), ("inclusion", "ten"),
                             ("inclusion", "2.5")]:
        with pytest.raises(ValueError):
            FeatureCache.check(policy, capacity)
    assert parse_capacity("8MB") == (8, "MB") and parse_capacity(100) == (100, "")
    assert HistoricalCache("gap:0.5").bound == 0.5 and PipelineCache(2).lookahead == 2


def test_background_sampling_draws_the_same_plans(parts3):
    for r in pyg_dist.spawn(workers.prefetch_checks, 3, (parts3, ), timeout=120):
        assert r["bns"] == (True, 0)  # BNS needs no message
        assert r["vr"][0] and r["vr"][1] > 0  # VR's bitmasks are counted


def test_overlap_equals_the_exchange_first_result(parts3):
    r"""CM-GCN's asynchronous computation: interior targets aggregate while
    the halo rows travel, border targets after; same outputs, gradients and
    bytes as exchanging first, on the exact plan, a BNS plan and a batch."""
    for r in pyg_dist.spawn(workers.overlap_checks, 3, (parts3, ), timeout=180):
        interior, border = r.pop("split")
        assert interior > 0 and border > 0  # both parts do work
        for name, cases in r.items():
            for case, (plain, overlapped) in cases.items():
                assert_fp32_close(overlapped[0], plain[0], msg=f"{name}/{case}: outputs")
                assert_params_close(overlapped[1], plain[1], msg=f"{name}/{case}: gradient")
                assert plain[2] == overlapped[2] > 0, (name, case)  # bytes
                # every layer overlapped, except GAT's (per-edge path: exchange first)
                layers = {"GraphSAGE": 3, "GCN": 3, "GIN": 2, "GraphConv": 1, "GAT": 0}
                assert plain[3] == 0 and overlapped[3] == layers[name], (name, case)
