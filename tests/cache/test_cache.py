"""Halo caches: staleness exactly as specified, bounds respected, cached
rows correct, no exchange left in flight — on real gloo worlds."""
import pytest
import torch

import pyg_dist
from pyg_dist.cache import FeatureCache, HistoricalCache, PipelineCache, check_cache
from pyg_dist.cache.feature import parse_capacity
from tests.cache import cache_workers as workers
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


# Exact plan: the iterations between two resends of a layer, per epoch bound
# (adaptive: a receiver finds a copy older than A after using it, and the
# owner resends at the next iteration, Algorithm 5).
PERIOD = {"fixed": lambda e: e + 1, "age": lambda a: a + 1, "adaptive": lambda a: a + 2}


@pytest.fixture(scope="module")
def historical_runs(parts3):
    r"""``historical_checks`` per (bound, exchange, sampled), run once."""
    runs = {}

    def get(bound: str, exchange: str = "halo", sampled: bool = False):
        if (bound, exchange, sampled) not in runs:
            runs[bound, exchange, sampled] = pyg_dist.spawn(
                workers.historical_checks, 3, (parts3, bound, sampled, 9, exchange),
                timeout=120)
        return runs[bound, exchange, sampled]
    return get


def _resends(result):
    r"""Per iteration, whether any layer's rows travelled to this rank."""
    return [any(v > 0 for v in layers.values()) for layers in result["rounds"]]


@pytest.mark.parametrize("exchange", ["halo", "broadcast"])
@pytest.mark.parametrize("bound", ["fixed:1", "fixed:2", "age:2", "adaptive:1",
                                   "adaptive:2"])
def test_historical_epoch_bounds(historical_runs, bound, exchange):
    r"""Exact plan: every layer is resent every :data:`PERIOD` iterations
    and the oldest row served is one period minus one old."""
    kind, epochs = bound.split(":")
    period = PERIOD[kind](int(epochs))
    results = historical_runs(bound, exchange)
    _agree(results)
    for r in results:
        assert r["max_age"] and max(r["max_age"].values()) == period - 1
        assert r["saved"] > 0
        for t, layers in enumerate(r["rounds"]):
            resend = t % period == 0  # exact plan: every row has one age
            for key, received in layers.items():
                assert (received > 0) == resend, (t, key, received)


def test_adaptive_and_fixed_schedules_differ(historical_runs):
    r"""SCS-A and SCS-E at the same bound: the paper's Fig. 14 — fixed:1
    resends every other epoch, adaptive:1 one epoch after a receiver finds
    its copy 2 epochs old (0, 3, 6, ...), so less often, with older rows."""
    for exchange in ("halo", "broadcast"):
        fixed = historical_runs("fixed:1", exchange)
        adaptive = historical_runs("adaptive:1", exchange)
        for f, a in zip(fixed, adaptive):
            assert _resends(f) == [t % 2 == 0 for t in range(9)]
            assert _resends(a) == [t % 3 == 0 for t in range(9)]
            assert max(a["max_age"].values()) == 2 > max(f["max_age"].values()) == 1
            assert a["saved"] > f["saved"]


@pytest.mark.parametrize("bound,limit", [("age:2", 2), ("fixed:2", 2), ("adaptive:1", 2)])
def test_historical_under_sampling_bounds_every_row(historical_runs, bound, limit):
    results = historical_runs(bound, "halo", True)
    _agree(results)
    for r in results:
        assert max(r["max_age"].values()) <= limit
        # rows age apart: some rounds outside the every-third schedule send rows
        assert any(v > 0 for t, layers in enumerate(r["rounds"]) if t % 3
                   for v in layers.values())


@pytest.mark.parametrize("bound", ["gap:0.05", "gap-abs:0.5"])
def test_historical_gap_bound(historical_runs, bound):
    value = float(bound.split(":")[1])
    results = historical_runs(bound)
    _agree(results)
    skipped = 0
    for r in results:
        assert all(g <= value for g in r["max_gap"].values()), r["max_gap"]
        skipped += sum(v == 0 for layers in r["rounds"][1:] for v in layers.values())
    assert skipped > 0  # the bound let some rounds skip


SERVED_BOUNDS = ["fixed:2", "adaptive:1", "age:2", "gap:0.3", "gap-abs:10.0"]


@pytest.fixture(scope="module")
def served(parts3):
    r"""``historical_served_rows`` per (exchange, sampled), run once."""
    runs = {}

    def get(exchange: str, sampled: bool):
        if (exchange, sampled) not in runs:
            runs[exchange, sampled] = pyg_dist.spawn(
                workers.historical_served_rows, 3, (parts3, SERVED_BOUNDS, exchange, sampled),
                timeout=180)
        return runs[exchange, sampled]
    return get


@pytest.fixture(params=[("halo", False), ("halo", True), ("broadcast", False)],
                ids=["halo", "halo-sampled", "broadcast"])
def served_rows(served, request):
    exchange, sampled = request.param
    return exchange, sampled, served(exchange, sampled)


def _truth(ranks, bound: str, key: str) -> torch.Tensor:
    r"""``[iteration, node, F]``: every node's row as its owner had it."""
    runs = [r["runs"][bound] for r in ranks]
    num_nodes = max(int(r["n_id"].max()) for r in ranks) + 1
    width = runs[0][0][key][0].size(1)
    truth = torch.full((len(runs[0]), num_nodes, width), float("nan"))
    for r, records in zip(ranks, runs):
        for t, layers in enumerate(records):
            truth[t, r["n_id"][:r["num_inner"]]] = layers[key][0]
    return truth


@pytest.mark.parametrize("bound", SERVED_BOUNDS)
def test_historical_serves_the_owners_rows_at_their_version(served_rows, bound):
    r"""Every halo row the cache serves equals its owner's row at the
    version the cache recorded for it (weights change every iteration, so
    another version's row differs), never newer than the current iteration
    and never older than the bound allows; and rows of earlier versions are
    really served (the test can tell them apart)."""
    exchange, sampled, ranks = served_rows
    kind, value = bound.split(":")
    limit = {"fixed": 0, "age": 0, "adaptive": 1}.get(kind)
    limit = None if limit is None else limit + int(value)
    stale_and_different = 0
    for key in ranks[0]["runs"][bound][0]:
        truth = _truth(ranks, bound, key)
        for r in ranks:
            halo_id = r["n_id"][r["num_inner"]:]
            for t, layers in enumerate(r["runs"][bound]):
                _, served, rows, version = layers[key]
                assert bool((version >= 0).all() and (version <= t).all()), (key, t)
                if limit is not None:
                    assert int((t - version).max()) <= limit, (key, t)
                ids = halo_id[rows]
                want = truth[version, ids]
                assert torch.equal(served, want), (bound, key, t)
                stale_and_different += int(((version < t)
                                            & (want != truth[t, ids]).any(1)).sum())
    assert stale_and_different > 0


def _owner_gap(ranks, truth, owner: int, t: int, previous: int, exchange: str,
               relative: bool) -> float:
    r"""The owner's :math:`\|H_t - \tilde H\|_F` (relative: over
    :math:`\|\tilde H\|_F`) over the rows its exchange moves: its whole
    block (broadcast) or every halo row of every peer (halo), against
    version :obj:`previous`, the one its peers hold."""
    if exchange == "broadcast":
        r = ranks[owner]
        ids = r["n_id"][:r["num_inner"]]
    else:
        ids = torch.cat([r["n_id"][r["num_inner"]:][r["owner"] == owner] for r in ranks])
    old = truth[previous, ids]
    gap = float((truth[t, ids] - old).norm())
    return gap / max(float(old.norm()), 1e-30) if relative else gap


@pytest.mark.parametrize("exchange", ["halo", "broadcast"])
def test_historical_resends_when_the_paper_says(served, exchange):
    r"""Exact plan, from the recorded rows alone: an owner resends a layer
    at iteration :math:`t` exactly when its bound says — adaptive: some
    receiver held a copy more than :math:`A` old at :math:`t - 1`; the gap
    bounds: its rows moved more than :math:`H` (absolute, or relative to
    the rows) from the version its peers hold."""
    ranks = served(exchange, False)
    for bound in ("adaptive:1", "gap:0.3", "gap-abs:10.0"):
        kind, value = bound.split(":")
        value = float(value)
        decisions = set()
        for key in ranks[0]["runs"][bound][0]:
            truth = _truth(ranks, bound, key)
            versions = torch.full(truth.shape[:2], -1, dtype=torch.long)
            for r in ranks:  # per iteration, the version served of each halo node
                halo_id = r["n_id"][r["num_inner"]:]
                for t, layers in enumerate(r["runs"][bound]):
                    versions[t, halo_id[layers[key][2]]] = layers[key][3]
            owner_of = torch.full((truth.size(1), ), -1, dtype=torch.long)
            for o, r in enumerate(ranks):
                owner_of[r["n_id"][:r["num_inner"]]] = o
            for t in range(1, truth.size(0)):
                for o in range(len(ranks)):
                    mine = (owner_of == o) & (versions[t] >= 0)
                    if not bool(mine.any()):
                        continue
                    resent = bool((versions[t][mine] == t).any())
                    assert bool((versions[t][mine] == t).all()) == resent  # whole owners
                    if kind == "adaptive":
                        want = int((t - 1 - versions[t - 1][mine]).max()) > value
                    else:
                        held = versions[t - 1][mine]
                        assert bool((held == held[0]).all())  # one version per owner
                        gap = _owner_gap(ranks, truth, o, t, int(held[0]), exchange,
                                         kind == "gap")
                        if abs(gap - value) < 1e-4 * value:
                            continue  # too close to call in fp32
                        want = gap > value
                    assert resent == want, (bound, key, t, o)
                    decisions.add(resent)
        assert decisions == {True, False}, bound  # both happen: the check can fail
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
                         ("historical", dict(bound="gap-abs:-1")),
                         ("historical", dict(bound="gap-abs:nan")),
                         ("historical", dict(bound="age:1.5")),
                         ("historical", dict(bound="adaptive:-1")),
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
    assert (HistoricalCache("gap-abs:0.02").kind, HistoricalCache("age:3").bound) == \
        ("gap-abs", 3)


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


def test_checkpoint_of_the_previous_adaptive_bound_resumes_with_it():
    r"""A cache state written when ``adaptive:A`` was the per-row bound (no
    ``format``) resumes under that bound, now ``age:A``, with a warning; a
    state of this release keeps the paper's Algorithm 5."""
    old = {"iteration": 3, "history": {}, "max_age": {}, "max_gap": {}}
    cache = HistoricalCache("adaptive:2")
    with pytest.warns(FutureWarning, match="now called 'age:2'"):
        cache.load_state_dict(old)
    assert (cache.kind, cache.bound, cache.iteration) == ("age", 2, 3)
    fresh = HistoricalCache("adaptive:2")
    fresh.load_state_dict(HistoricalCache("adaptive:2").state_dict())
    assert fresh.kind == "adaptive"
