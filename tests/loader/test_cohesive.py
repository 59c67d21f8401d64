"""CM-GCN cost model and cohesive batch partitioning (single process: the
partitioning is a preprocessing step on the whole graph)."""
import itertools
import json

import pytest
import torch

from pyg_dist.loader import (CostModel, HopGraph, cohesive_batches, queyranne_bisection,
                             random_batches, recursive_bisection)
from pyg_dist.loader.cohesive.batch_partition import CoverCounts
from tests.numeric import assert_fp32_close, assert_params_close


def _tiny_graph(n: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (3 * n, ), generator=g)
    dst = torch.randint(0, n, (3 * n, ), generator=g)
    keep = src != dst
    edge_index = torch.stack([torch.cat([src[keep], dst[keep]]),
                              torch.cat([dst[keep], src[keep]])])
    return edge_index


def test_cost_matches_equations():
    cost = CostModel(dims=[3, 4, 2], alpha=1, beta=10, gamma=100, eta=1000, lam=10000)
    deg = torch.tensor([0, 5])
    assert torch.equal(cost.forward_cost(deg, 0), torch.zeros(2, dtype=torch.double))
    # c_f(v,1) = α|N|d0 + β d1 d0 + γ d1
    assert cost.forward_cost(deg, 1).tolist() == [120 + 400, 15 + 120 + 400]
    # last layer: (λ+η) d2 + (2β+η) d2 d1
    assert cost.backward_cost(deg, 2).tolist() == [2 * 11000 + 1020 * 8] * 2
    # middle layer: α|N| d1 + (β+η) d1 d0 + η d1
    assert cost.backward_cost(deg, 1).tolist() == [1010 * 12 + 4000, 20 + 1010 * 12 + 4000]
    assert torch.equal(cost.node_cost(deg), cost.layer_costs(deg)[1:].sum(0))


def test_batch_cost_counts_the_computational_graph():
    # path 0 <- 1 <- 2 <- 3: node 0's 2-layer computational graph is {0} at
    # layer 2 and {0, 1} at layer 1.
    edge_index = torch.tensor([[1, 2, 3], [0, 1, 2]])
    cost = CostModel(dims=[1, 1, 1], alpha=0, beta=1, gamma=0, eta=0, lam=0)
    graph = HopGraph(edge_index, 4, cost)
    per_node = cost.layer_costs(graph.deg)
    assert graph.batch_cost(torch.tensor([0])) == pytest.approx(
        float(per_node[2, 0] + per_node[1, [0, 1]].sum()))
    # submodular: sharing neighbours costs less than the parts alone
    a, b = graph.batch_cost(torch.tensor([0])), graph.batch_cost(torch.tensor([1]))
    assert graph.batch_cost(torch.tensor([0, 1])) < a + b


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_queyranne_finds_the_brute_force_optimum(seed):
    edge_index = _tiny_graph(9, seed)
    graph = HopGraph(edge_index, 9, CostModel(dims=[4, 8, 8, 3]))
    nodes = torch.arange(9)
    best = min(graph.batch_cost(nodes[torch.tensor(mask)]) +
               graph.batch_cost(nodes[~torch.tensor(mask)])
               for mask in itertools.product([False, True], repeat=9)
               if 0 < sum(mask) < 9)
    mask, value = queyranne_bisection(graph, nodes)
    assert value == pytest.approx(best)
    assert value == pytest.approx(graph.batch_cost(nodes[mask])
                                  + graph.batch_cost(nodes[~mask]))


def _community_graph():
    from tests.conftest import small_graph
    data = small_graph(num_nodes=400, seed=3)
    return data, torch.nonzero(data.train_mask).view(-1)


def test_every_node_in_exactly_one_batch_and_deterministic():
    data, nodes = _community_graph()
    graph = HopGraph(data.edge_index, data.num_nodes, CostModel(dims=[12, 16, 16, 5]))
    a = cohesive_batches(graph, data.edge_index, nodes, 8, method="metis", seed=1)
    b = cohesive_batches(graph, data.edge_index, nodes, 8, method="metis", seed=1)
    assert torch.equal(a, b) and a.numel() == nodes.numel()
    assert set(a.tolist()) == set(range(8))
    sizes = torch.bincount(a, minlength=8).double()
    assert sizes.max() <= 1.1 * nodes.numel() / 8 + 1
    small = recursive_bisection(graph, nodes[:20], 3)
    assert set(small.tolist()) == {0, 1, 2}


def test_cohesive_batches_cost_less_than_random():
    data, nodes = _community_graph()
    graph = HopGraph(data.edge_index, data.num_nodes, CostModel(dims=[12, 16, 16, 5]))
    cohesive = cohesive_batches(graph, data.edge_index, nodes, 8, method="metis")
    rand = random_batches(nodes.numel(), 8)
    j, j_rand = graph.partition_cost(cohesive, nodes), graph.partition_cost(rand, nodes)
    assert j < 0.8 * j_rand, (j, j_rand)
    # the refinement's incremental bookkeeping agrees with a recount
    counts = CoverCounts(graph, nodes, cohesive, 8)
    assert counts.total() == pytest.approx(j)


def test_calibration_measures_positive_constants():
    threads = torch.get_num_threads()
    cost = CostModel.calibrate([16, 16, 4], rows=256, repeats=2, model="gcn", threads=1)
    assert all(getattr(cost, k) > 0 for k in ("alpha", "beta", "gamma", "eta", "lam"))
    assert list(cost.dims) == [16, 16, 4] and torch.get_num_threads() == threads
    # where and how the constants were measured travels with them
    assert cost.measured["model"] == "gcn" and cost.measured["threads"] == 1
    assert cost.measured["dims"] == [16, 16, 4] and "cpu" in cost.measured["device"]
    assert CostModel(dims=[16, 4]).measured is None  # the defaults: placeholders
    with pytest.raises(ValueError, match="Unknown model kind 'mlp'"):
        CostModel.calibrate([16, 4], model="mlp")


def test_calibration_times_what_the_model_runs():
    r"""α is timed on the model's sparse aggregation, forward and backward
    (not a dense vector add), β on all of a layer's weight matrices, λ on
    the loss gradient over the output width."""
    from torch_geometric.utils import spmm
    from pyg_dist.config import MODELS
    from pyg_dist.loader.cohesive.cost import MODEL_KINDS, calibration_ops
    from pyg_dist.utils.sparse import csr
    assert set(MODELS) <= set(MODEL_KINDS)  # every train --model has its operations
    dims, rows, degree = [6, 5, 3], 40, 4.0
    for model in ("sage", "gcn", "gat"):
        ops = calibration_ops(dims, rows, model, degree, torch.device("cpu"), seed=2)
        assert [units for _, units in ops["alpha"]] == [2 * rows * 4 * 6, 2 * rows * 4 * 5]
        # the same draws as calibration_ops: the op returns the backward A^T G
        g = torch.Generator().manual_seed(2)
        dst = (torch.arange(rows * 4) % rows).sort().values
        src = torch.randint(0, rows, (rows * 4, ), generator=g)
        torch.rand(rows * 4, 1, generator=g)  # GAT's edge weights
        x = torch.randn(rows, 6, generator=g).requires_grad_()
        grad = torch.randn(rows, 6, generator=g)
        if model == "gat":  # per-edge messages with random weights: check the shape
            assert ops["alpha"][0][0]().shape == (rows, 6)
            continue
        reduce = "mean" if model == "sage" else "sum"
        out = spmm(csr(torch.stack([src, dst]), None, rows, rows), x, reduce=reduce)
        expected = torch.autograd.grad(out, x, grad)[0]
        torch.testing.assert_close(ops["alpha"][0][0](), expected)
    # GraphSAGE's two weight matrices per layer, GIN's MLP, GCN's one
    for model, matrices in (("sage", 2), ("gin", 2), ("gcn", 1)):
        assert len(MODEL_KINDS[model][1]) == matrices
    ops = calibration_ops(dims, rows, "sage", degree, torch.device("cpu"))
    assert [units for _, units in ops["beta"]] == [rows * 5 * 6, rows * 3 * 5]
    assert [units for _, units in ops["lam"]] == [rows * 3]
    assert ops["lam"][0][0]().shape == (rows, 3)


def test_cost_constants_file(tmp_path):
    cost = CostModel(dims=[8, 4, 2], alpha=4e-10, beta=1e-11, gamma=2e-10, eta=3e-10,
                     lam=5e-9, measured={"model": "sage"})
    path = cost.save(str(tmp_path / "c.json"))
    assert CostModel.load(path) == cost
    other = CostModel.load(path, dims=[12, 16, 3])  # constants measured elsewhere
    assert list(other.dims) == [12, 16, 3] and other.alpha == cost.alpha
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CostModel.load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not readable JSON"):
        CostModel.load(str(bad))
    item = cost.to_dict()
    for broken, match in (({k: v for k, v in item.items() if k != "beta"}, "missing beta"),
                          ({**item, "eta": -1.0}, "eta must be a finite number > 0"),
                          ({**item, "lam": "fast"}, "lam must be"),
                          ({**item, "dims": [8]}, "dims must be"), ([1, 2], "JSON object")):
        bad.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=match):
            CostModel.load(str(bad))


def test_batches_file_keeps_the_cost_model(tmp_path):
    import pyg_dist
    from pyg_dist.loader import load_batch_cost, load_batches, save_batches
    from tests.conftest import small_graph
    data = small_graph(60)
    pyg_dist.partition_graph(data, 1, root=str(tmp_path))  # batches live beside parts
    batch_of = torch.where(data.train_mask, torch.arange(60) % 2, -1)
    cost = CostModel.calibrate([4, 8, 2], rows=64, repeats=1)
    save_batches(str(tmp_path), batch_of, cost)
    assert torch.equal(load_batches(str(tmp_path)), batch_of)
    assert load_batch_cost(str(tmp_path)) == cost
    save_batches(str(tmp_path), batch_of)  # batches of no known cost model
    assert torch.equal(load_batches(str(tmp_path)), batch_of)
    assert load_batch_cost(str(tmp_path)) is None


@pytest.mark.parametrize("balanced", [False, "owner", "greedy"])
def test_distributed_batches_equal_single_process_pyg(tmp_path, balanced):
    import pyg_dist
    from tests.loader.cohesive_workers import cohesive_batch_checks
    from tests.models import linear_loss
    from tests.models import build_model
    data, nodes = _community_graph()
    graph = HopGraph(data.edge_index, data.num_nodes, CostModel(dims=[12, 8, 8, 5]))
    batch_of = torch.full((data.num_nodes, ), -1)
    batch_of[nodes] = cohesive_batches(graph, data.edge_index, nodes, 4, method="metis")
    book = pyg_dist.partition_graph(data, 3, root=str(tmp_path))
    if balanced:  # each batch split over the ranks by cost, not by owner
        from pyg_dist.loader.cohesive.balance import save_batch_parts
        loads = save_batch_parts(str(tmp_path), data, graph, batch_of, book.owner(book.inv_perm),
                                 3, book.meta["graph_hash"], rule=balanced)
        assert all(float(load.max() / load.mean()) <= 1.05 for load in loads)
        from pyg_dist.loader.cohesive.cost import imbalance, rank_costs
        by_owner = [imbalance(rank_costs(graph, (batch_of == b).nonzero().view(-1),
                                         book.owner(book.inv_perm), 3)) for b in range(4)]
        assert max(by_owner) > 1.05  # so the balanced split really moved work
        from pyg_dist.loader.cohesive.balance import load_batch_part
        with pytest.raises(ValueError, match="3-layer computational graphs"):
            load_batch_part(str(tmp_path), 0, 0, num_layers=4)  # a deeper model
    results = pyg_dist.spawn(cohesive_batch_checks, 3, (str(tmp_path), batch_of,
                                                        bool(balanced)), timeout=180)
    for name in ("GraphSAGE", "GCN", "GAT"):
        for b in range(4):
            torch.manual_seed(0)
            model = build_model(name, data.num_features)
            y = model(data.x, data.edge_index)
            batch = (batch_of == b).nonzero().view(-1)
            linear_loss(y[batch], batch).backward()
            n_id = torch.cat([r[name, b]["n_id"] for r in results])
            assert torch.equal(n_id.sort().values, batch)  # every batch node, once
            out = torch.cat([r[name, b]["out"] for r in results])
            assert_fp32_close(out, y[n_id], msg=f"{name} batch {b}: outputs")
            # the gradients were all-reduced: every rank holds the batch's sum
            grads = {k: p.grad for k, p in model.named_parameters()}
            for r in results:
                assert_params_close(r[name, b]["grads"], grads, msg=f"{name} batch {b}: gradient")
            # The ranks compute exactly the batch's K-hop in-neighbourhood, each
            # node on one rank only (balanced parts are built for K = 3).
            if balanced and len(model.convs) != 3:
                continue
            hood = torch.zeros(data.num_nodes, dtype=torch.bool)
            hood[batch] = True
            for _ in range(len(model.convs)):
                hood = graph.expand(hood)
            computed = torch.cat([r[name, b]["computed"] for r in results])
            assert torch.equal(computed.sort().values, hood.nonzero().view(-1))
        # A batch exchanges less than the whole graph, unless CM-GCN's
        # greedy rule scattered its nodes regardless of where they live.
        for r in results if balanced != "greedy" else []:
            assert max(r[name, b]["bytes"] for b in range(4)) < r[name, "full_bytes"]


def test_balance_work_hands_outermost_nodes_to_the_least_loaded():
    from pyg_dist.loader.cohesive.balance import balance_work, computational_graph
    data, nodes = _community_graph()
    graph = HopGraph(data.edge_index, data.num_nodes, CostModel(dims=[12, 16, 16, 5]))
    order, work = computational_graph(graph, nodes[:30])
    assert torch.equal(order.sort().values, graph.expand(graph.hops(nodes[:30])[-1])
                       .nonzero().view(-1))
    assert torch.equal(torch.isin(order[:30], nodes[:30]), torch.ones(30, dtype=torch.bool))
    assert (work[:30] > 0).all() and work[-1] == 0  # batch first; inputs only read
    owner = torch.zeros(order.numel(), dtype=torch.long)  # all on rank 0
    rank = balance_work(work, owner, 3, tolerance=0.05)
    load = torch.zeros(3, dtype=torch.double).index_add_(0, rank, work.double())
    assert float(load.max() / load.mean()) <= 1.05 + float(work.max() / load.mean())
    moved = (rank != 0).nonzero().view(-1)
    kept = ((rank == 0) & (work > 0)).nonzero().view(-1)
    assert moved.min() > kept.max()  # the outermost computing nodes moved
    assert (rank[work == 0] == 0).all()  # inputs stay with their features


def test_greedy_rule_assigns_every_node_to_the_least_loaded_rank():
    r"""CM-GCN §III-B: in BFS order, each node to the rank with the lowest
    total work so far; the ranks then differ by at most one node's work.
    The owner-first rule keeps far more nodes on their owners."""
    from pyg_dist.loader.cohesive.balance import balance_work, computational_graph
    data, nodes = _community_graph()
    graph = HopGraph(data.edge_index, data.num_nodes, CostModel(dims=[12, 16, 16, 5]))
    order, work = computational_graph(graph, nodes[:40])
    owner = torch.zeros(order.numel(), dtype=torch.long)  # ranks 0 and 1 own it all
    owner[order.numel() // 2:] = 1
    rank = balance_work(work, owner, 3, rule="greedy")
    load, expected = [0.0] * 3, owner.clone()  # the paper's loop, written out
    for v in range(order.numel()):
        if work[v] > 0:
            r = min(range(3), key=lambda r: (load[r], r))
            expected[v] = r
            load[r] += float(work[v])
    assert torch.equal(rank, expected)
    loads = torch.zeros(3, dtype=torch.double).index_add_(0, rank, work.double())
    assert float(loads.max() - loads.min()) <= float(work.max())
    assert torch.equal(rank[work == 0], owner[work == 0])
    by_owner = balance_work(work, owner, 3, rule="owner")
    assert int((by_owner == owner).sum()) > int((rank == owner).sum())
    with pytest.raises(ValueError, match="Unknown balance rule 'random'"):
        balance_work(work, owner, 3, rule="random")


def test_rank_costs_split_the_batch_cost():
    from pyg_dist.loader.cohesive.cost import imbalance, rank_costs
    data, nodes = _community_graph()
    graph = HopGraph(data.edge_index, data.num_nodes, CostModel(dims=[12, 16, 16, 5]))
    part_of = torch.arange(data.num_nodes) % 3
    batch = nodes[:10]
    costs = rank_costs(graph, batch, part_of, 3)
    assert float(costs.sum()) == pytest.approx(graph.batch_cost(batch))
    assert imbalance(costs) >= 1.0 and imbalance(torch.ones(3)) == 1.0


def test_bns_on_a_batch_halo_is_unbiased(tmp_path):
    r"""BNS composed with a batch: every draw receives only rows the batch
    needs (about p of them) and the batch's aggregation is unbiased: the
    mean over 400 draws approaches the exact batch output."""
    import pyg_dist
    from tests.loader.cohesive_workers import batch_sampling_checks
    data, _ = _community_graph()
    pyg_dist.partition_graph(data, 2, root=str(tmp_path))
    for r in pyg_dist.spawn(batch_sampling_checks, 2, (str(tmp_path), 400), timeout=120):
        assert r["extra"] == 0 and r["needed"] > 0
        assert 0.4 * r["needed"] < r["rows"] < 0.6 * r["needed"], r
        assert r["error"] < 0.05 * r["scale"], r


def test_loader_batches_the_graph_itself(tmp_path):
    r"""``CohesiveBatchLoader(data, num_batches=M, num_layers=K)``: the
    batches of the whole graph, as the single-process partitioner makes
    them, every training node in exactly one."""
    import pyg_dist
    from tests.loader.cohesive_workers import gathered_batches
    data, nodes = _community_graph()
    pyg_dist.partition_graph(data, 2, root=str(tmp_path))
    classes = int(data.y.max()) + 1
    cost = CostModel(dims=[data.num_features, 64, classes], alpha=20, beta=1)
    expected = cohesive_batches(HopGraph(data.edge_index, data.num_nodes, cost),
                                data.edge_index, nodes, 4, seed=1)
    results = pyg_dist.spawn(gathered_batches, 2, (str(tmp_path), cost), timeout=120)
    seen = torch.cat([r["seen"] for r in results])
    assert torch.equal(seen.sort().values, nodes)  # each training node once
    for r in results:
        position = torch.searchsorted(nodes, r["n_id"]).clamp(max=nodes.numel() - 1)
        assert torch.equal(r["batch_of"], expected[position]
                           .where(data.train_mask[r["n_id"]], torch.tensor(-1)))
        assert r["cost"] == cost.to_dict()
        # without a cost model, rank 0 measures one for the caller's model,
        # and every rank learns which
        assert r["measured"] == results[0]["measured"]
        assert r["measured"]["dims"] == [data.num_features, 32, classes]
        assert r["measured"]["measured"]["model"] == "gcn"
