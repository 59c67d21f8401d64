"""Boundary samplers: their defining properties, on real gloo worlds."""
import math

import pytest
import torch

import pyg_dist
from pyg_dist.sampler import build_sampler, sampling_variance, vr_probabilities
from pyg_dist.comm.bitmask import pack, unpack
from pyg_dist.train import TrainConfig
from tests.sampler.sampler_workers import SAMPLER_CASES, precompute_checks, sampler_checks
from tests.numeric import RTOL, assert_fp32_close, scale_of

ITERATIONS = 80  # the z-tests below scale with it; the power test keeps rejecting
WORLD = 3


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    from tests.conftest import small_graph
    root = str(tmp_path_factory.mktemp("parts"))
    pyg_dist.partition_graph(small_graph(), WORLD, root=root)
    return pyg_dist.spawn(sampler_checks, WORLD, (root, ITERATIONS), timeout=240)


def test_senders_and_receivers_agree(checks):
    for rank in checks:
        for name, t, agree, all_used, in_range in rank["agree"]:
            assert agree, f"{name} iteration {t}: owners sent other rows than expected"
            assert all_used, f"{name} iteration {t}: a received halo row has no edge"
            assert in_range, f"{name} iteration {t}: an edge points past the sources"


def test_plans_are_deterministic_by_seed(checks):
    for rank in checks:
        for name, (same, differs) in rank["deterministic"].items():
            assert same, f"{name}: the same seed gave different plans"
            assert differs, f"{name}: another seed gave the same plans"


def test_bns_rows_are_binomial(checks):
    r"""Rows received per iteration ~ Binomial(halo, p): the total over all
    ranks and iterations lies within 5 standard deviations of its mean."""
    p = 0.1
    total = sum(sum(r["bns_rows"]) for r in checks)
    trials = sum(r["num_halo"] for r in checks) * ITERATIONS
    mean, sd = trials * p, math.sqrt(trials * p * (1 - p))
    assert abs(total - mean) <= 5 * sd, (total, mean, sd)
    assert all(r["bns_bytes_ok"] for r in checks)


def test_bns_p1_is_exact_and_p0_isolates(checks):
    for r in checks:
        bit_equal, same_bytes = r["p1"]  # p = 1 is the exact plan itself
        assert bit_equal and same_bytes
        isolated, inner_only, bytes_recv = r["p0"]
        assert_fp32_close(isolated, inner_only, msg="p = 0 against the inner subgraph")
        assert bytes_recv == 0


@pytest.mark.parametrize("aggr", ["mean", "sum", "gcn"])
@pytest.mark.parametrize("form", ["adj_t", "edge_index"])
@pytest.mark.parametrize("name", list(SAMPLER_CASES))
def test_sampled_layer_is_unbiased(checks, aggr, form, name):
    r"""The mean of the sampled outputs over many iterations approaches the
    exact output within 6 standard errors sqrt(var / iterations) per entry
    (outputs that sampling cannot change must match to fp32 rounding)."""
    for r in checks:
        exact, mean, var = r["moments"][aggr, form, name]
        se = (var / ITERATIONS).sqrt()
        err = (mean - exact.double()).abs()
        assert bool((err <= 6 * se + RTOL * scale_of(exact)).all()), \
            f"{name}/{aggr}/{form}: max z {float((err / (se + 1e-12)).max()):.1f}"
        assert float(var.max()) > 0, "sampling changed nothing"


def test_unbiasedness_check_detects_missing_rescaling(checks):
    r"""The same statistic rejects BNS without the 1/p factor, so the test
    above has the power to see a bias."""
    rejected = False
    for r in checks:
        exact, mean, var = r["moments"]["sum", "adj_t", "bns-unscaled"]
        err = (mean - exact.double()).abs()
        rejected |= bool((err > 6 * (var / ITERATIONS).sqrt() + RTOL * scale_of(exact)).any())
    assert rejected


def test_pack_unpack_roundtrip():
    for n in (0, 1, 7, 8, 9, 100):
        bits = torch.rand(n) < 0.5
        assert torch.equal(unpack(pack(bits), n), bits)


def _random_instance(seed: int, num_targets: int = 40, zeros: bool = True):
    gen = torch.Generator().manual_seed(seed)
    deg = torch.randint(1, 30, (num_targets, ), generator=gen)
    index = torch.repeat_interleave(torch.arange(num_targets), deg)
    weight = torch.rand(index.numel(), generator=gen) ** 3 * 10
    if zeros:  # zero-norm neighbours still get a probability > 0
        weight[torch.rand(index.numel(), generator=gen) < 0.05] = 0.0
    return weight, index, deg


def _theorem2(w: torch.Tensor, budget: float) -> torch.Tensor:
    r"""Eq. 19 for one target by the statement of Theorem 2, with a loop."""
    order = torch.argsort(w.double())
    ws = w.double()[order]
    n = ws.numel()
    k = max(k for k in range(1, n + 1)
            if (budget + k - n) * ws[k - 1] <= ws[:k].sum() * (1 + 1e-12))
    p = torch.ones(n, dtype=torch.double)
    p[:k] = (budget + k - n) * ws[:k] / ws[:k].sum()
    out = torch.empty_like(p)
    out[order] = p
    return out


@pytest.mark.parametrize("rate", [0.05, 0.3, 0.9, 1.0])
def test_vr_probabilities_solve_eq17(rate):
    weight, index, deg = _random_instance(0)
    p = vr_probabilities(weight, index, deg.numel(), rate)
    assert bool((p > 0).all() and (p <= 1).all())
    sums = torch.zeros(deg.numel(), dtype=torch.double).index_add_(0, index, p)
    assert torch.allclose(sums, rate * deg.double(), rtol=1e-9)
    # Equal to Theorem 2 evaluated target by target ...
    weight, index, deg = _random_instance(0, zeros=False)
    p = vr_probabilities(weight, index, deg.numel(), rate)
    start = 0
    for d in deg.tolist():
        ref = _theorem2(weight[start:start + d], rate * d)
        assert torch.allclose(p[start:start + d], ref, rtol=1e-9)
        start += d
    # ... and no feasible perturbation lowers the variance (optimality).
    gen = torch.Generator().manual_seed(1)
    sums = torch.zeros(deg.numel(), dtype=torch.double).index_add_(0, index, p)
    best = sampling_variance(p, weight)
    for _ in range(20):
        noise = torch.randn(p.numel(), generator=gen, dtype=torch.double) * 0.01
        noise -= torch.zeros_like(sums).index_add_(0, index, noise)[index] / deg[index]
        q = p + noise
        if bool((q > 0).all() and (q <= 1).all()):
            assert sampling_variance(q, weight) >= best * (1 - 1e-12)


def test_vr_variance_at_most_uniform():
    r"""Lemma 3: the optimal probabilities never do worse than uniform
    sampling at the same budget, and strictly better on skewed weights."""
    for seed in range(5):
        weight, index, deg = _random_instance(seed)
        for rate in (0.1, 0.5):
            p = vr_probabilities(weight, index, deg.numel(), rate)
            uniform = torch.full_like(p, rate)
            assert sampling_variance(p, weight) <= sampling_variance(uniform, weight)
            assert sampling_variance(p, weight) < 0.9 * sampling_variance(uniform, weight)


def test_precompute_layer0(tmp_path):
    from tests.conftest import small_graph
    pyg_dist.partition_graph(small_graph(), 2, root=str(tmp_path))
    for r in pyg_dist.spawn(precompute_checks, 2, (str(tmp_path), ), timeout=120):
        for name, (out, want, grads, layer0_bytes, total_bytes, pieces, overlapped) \
                in r.items():
            assert_fp32_close(out, want, msg=f"{name}: precomputed layer 0")
            assert_fp32_close(overlapped, want, msg=f"{name}: precomputed, overlapped")
            # the input features' halo never held at once, where the aggregation folds
            assert pieces == ((0, 0) if name == "sage std" else (1, 1)), name
            assert grads
            assert sum(layer0_bytes.values()) == 0, layer0_bytes
            assert total_bytes > 0  # the other layers still exchange


def test_precompute_refuses_a_gcn_layer_that_neither_sums_nor_averages(graph, tmp_path):
    from torch_geometric.nn import GCN
    pyg_dist.partition_graph(graph, 1, root=str(tmp_path))
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    with pytest.raises(NotImplementedError, match="aggr='max'"):
        pyg_dist.nn.distribute(GCN(part.num_features, 8, 2, 4, aggr="max"), part,
                               precompute_layer0=True)
    pyg_dist.nn.distribute(GCN(part.num_features, 8, 2, 4, aggr="mean"), part,
                           precompute_layer0=True)


@pytest.mark.parametrize("name,params", [("bns", dict(p=1.5)), ("bns", dict(p=-0.1)),
                                         ("vr", dict(rate=0.0)), ("vr", dict(refresh=0)),
                                         ("vr", dict(coefficient="x")),
                                         ("dropedge", dict(p=0.0)), ("nope", {}),
                                         ("bns", dict(rate=0.1))])
def test_invalid_sampler_parameters(graph, tmp_path, name, params):
    pyg_dist.partition_graph(graph, 1, root=str(tmp_path))
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    with pytest.raises(ValueError):
        build_sampler(name, part, **params)


def test_config_rejects_unknown_sampler_or_parameter():
    with pytest.raises(ValueError, match="Unknown sampler"):
        TrainConfig(sampler="nope").validate()
    with pytest.raises(ValueError, match="no parameter"):
        TrainConfig(sampler="bns", sampler_args={"rate": 0.1}).validate()


def test_vr_rows_never_seen_get_the_mean_norm(tmp_path):
    r"""A halo row no sampled plan fetched yet must not look like a zero
    embedding (it would get p ≈ 0 and never be fetched again)."""
    from pyg_dist.comm import HaloPlan
    from pyg_dist.sampler import VarianceReductionSampler
    from tests.conftest import small_graph
    pyg_dist.partition_graph(small_graph(), 2, root=str(tmp_path))
    part = pyg_dist.DistData.load(str(tmp_path), 0, world_size=2)
    vr = VarianceReductionSampler(part, rate=0.3, coefficient="uniform", halo_weight=1.0)
    halo_keep = torch.arange(part.num_halo) % 2 == 0
    plan = HaloPlan.sampled(part, torch.zeros(part.send_index.numel(), dtype=torch.bool),
                            halo_keep)
    vr.observe("layer", torch.full((plan.num_src, 4), 2.0), plan)  # every norm is 4
    halo = vr.halo_edge
    assert torch.allclose(vr.edge_weights()[halo], torch.full((int(halo.sum()), ), 4.0,
                                                              dtype=torch.double))


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_bns_graph_holds_only_kept_edges(tmp_path, p):
    r"""A sampled iteration's CSR stores only the inner edges and the kept
    cut edges (so memory and aggregation work fall with p), and aggregates
    as the per-edge form of the same plan does (sum and unbiased mean)."""
    from tests.conftest import small_graph
    from pyg_dist.utils import csr
    pyg_dist.partition_graph(small_graph(), 3, root=str(tmp_path))
    part = pyg_dist.DistData.load(str(tmp_path), 1)
    sampler = build_sampler("bns", part, p=p, seed=3)
    x = torch.randn(part.num_inner + part.num_halo, 5)
    for t in range(3):
        plan = sampler.plan(t)
        assert plan.patch is not None
        x_src = x[:plan.num_src]
        kept_cut = int((plan.patch.factor != 0).sum())
        inner_edges = int((part.edge_index[0] < part.num_inner).sum())
        for aggr in ("sum", "mean"):
            adj = plan.adjacency(aggr, fused=True)
            assert adj._nnz() == inner_edges + kept_cut < part.edge_index.size(1)
            assert bool((adj.values() != 0).all())
            per_edge = csr(plan.edge_index, plan.edge_weight(aggr), plan.num_inner,
                           plan.num_src, adj.dtype)
            reduce = "sum" if aggr == "sum" else "mean"
            if aggr == "mean":  # the mean of the per-edge form divides by the kept edges too
                assert torch.equal(per_edge.crow_indices(), adj.crow_indices())
            assert_fp32_close(torch.sparse.mm(adj, x_src, reduce),
                              torch.sparse.mm(per_edge, x_src, reduce), msg=f"{aggr}, t={t}")


@pytest.mark.parametrize("model_name,stale", [("gcn", False), ("gcn", True), ("sage", False)])
def test_vr_estimates_y_with_the_layer_weight(tmp_path, model_name, stale):
    r"""PSC-GCN's :math:`\|\mathbf y_{ij}\|^2 = c_{ij}^2 \sum_\ell \|W^{(\ell)}
    h_j^{(\ell-1)}\|^2` (Eq. 16): the same estimate whether a layer
    multiplies by :math:`W` before the exchange (GCN, exact cache) or after
    the aggregation (GCN under a stale cache, SAGE)."""
    from torch_geometric.nn import GCN, GraphSAGE
    from pyg_dist.cache import PipelineCache
    from pyg_dist.sampler import VarianceReductionSampler
    from tests.conftest import small_graph
    pyg_dist.partition_graph(small_graph(), 1, root=str(tmp_path))
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    torch.manual_seed(0)
    model = pyg_dist.nn.distribute({"gcn": GCN, "sage": GraphSAGE}[model_name](
        part.num_features, 8, 2, 4), part, cache=PipelineCache(1) if stale else None)
    vr = VarianceReductionSampler(part, rate=0.5, coefficient="uniform")
    vr.attach(model.dist_context)
    inputs = []
    for conv in model.convs:
        conv.register_forward_pre_hook(lambda m, args: inputs.append(args[0].detach()))
    model(part.x, part.adj_t)
    weights = [conv.lin.weight if model_name == "gcn" else conv.lin_l.weight
               for conv in model.convs]
    y = sum((h @ w.detach().t()).pow(2).sum(1) for h, w in zip(inputs, weights))
    assert_fp32_close(vr.edge_weights(), (vr.prior * y.double().sqrt()[part.edge_index[0]]))
