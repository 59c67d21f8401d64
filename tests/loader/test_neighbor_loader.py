"""DistDGL's neighbour loader: sampled batches exist in the graph, respect
the fan-outs, carry the original rows, and equal PyG on the whole graph when
every neighbour is taken; ByteGNN's pool keeps the trainer fed in order."""
import time

import pytest
import torch
from torch_geometric.nn import GraphSAGE
from torch_geometric.utils import to_torch_csr_tensor

import pyg_dist
from pyg_dist.loader.neighbor.sampler import sample_neighbors
from pyg_dist.loader.neighbor.pipeline import SamplerPool
from tests.loader.neighbor_workers import die_while_sampling, sample_epochs
from tests.numeric import assert_fp32_close


def test_sample_neighbors_is_uniform_without_replacement():
    rowptr = torch.tensor([0, 10, 12, 12])  # degrees 10, 2, 0
    col = torch.arange(12)
    targets = torch.tensor([0, 1, 2])
    hits = torch.zeros(10)
    draws = 3000
    for i in range(draws):
        counts, values = sample_neighbors(rowptr, col, targets, 3,
                                          torch.Generator().manual_seed(i))
        assert counts.tolist() == [3, 2, 0]
        first = values[:3]
        assert first.unique().numel() == 3 and bool((first < 10).all())
        assert sorted(values[3:].tolist()) == [10, 11]
        hits[first] += 1
    # each of the 10 neighbours is kept w.p. 3/10 (binomial sd 25 draws)
    assert (hits - 0.3 * draws).abs().max() < 5 * (draws * 0.3 * 0.7) ** 0.5
    counts, values = sample_neighbors(rowptr, col, targets, -1, torch.Generator())
    assert counts.tolist() == [10, 2, 0] and values.tolist() == list(range(12))


def test_sample_neighbors_draws_every_subset_equally_often():
    rowptr, col, draws = torch.tensor([0, 5]), torch.arange(5), 4000
    subsets = torch.zeros(5, 5)
    for i in range(draws):
        _, values = sample_neighbors(rowptr, col, torch.tensor([0]), 2,
                                     torch.Generator().manual_seed(i))
        subsets[values.min(), values.max()] += 1
    pairs = subsets[torch.triu_indices(5, 5, 1).unbind()]  # the 10 pairs of 5 neighbours
    assert pairs.sum() == draws  # always 2 distinct neighbours
    assert (pairs - draws / 10).abs().max() < 5 * (draws * 0.1 * 0.9) ** 0.5


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    from tests.conftest import small_graph
    graph = small_graph()
    root = str(tmp_path_factory.mktemp("neighbor"))
    pyg_dist.partition_graph(graph, 2, root=root)
    return graph, pyg_dist.spawn(sample_epochs, 2, (root, ))


def test_batches_are_sampled_from_the_graph(sampled):
    graph, results = sampled
    edges = set(map(tuple, graph.edge_index.t().tolist()))
    in_degree = torch.bincount(graph.edge_index[1], minlength=graph.num_nodes)
    for result in results:
        for batch in result["loop"]:
            n_id, (row, col) = batch["n_id"], batch["edge_index"]
            assert n_id.unique().numel() == n_id.numel()
            assert sum(batch["num_sampled_nodes"]) == n_id.numel()
            assert sum(batch["num_sampled_edges"]) == row.numel()
            assert torch.equal(batch["x"], graph.x[n_id])  # rows pulled from the owners
            assert torch.equal(batch["y"], graph.y[n_id])
            pairs = set(zip(n_id[row].tolist(), n_id[col].tolist()))
            assert len(pairs) == row.numel() and pairs <= edges
            # Hop l samples min(k, deg) in-neighbours of exactly the nodes hop l-1 added.
            bounds = torch.tensor(batch["num_sampled_nodes"]).cumsum(0).tolist()
            count = torch.bincount(col, minlength=n_id.numel())
            for hop, k in enumerate([4, 3]):
                start = bounds[hop - 1] if hop else 0
                nodes = torch.arange(start, bounds[hop])
                assert torch.equal(count[nodes], in_degree[n_id[nodes]].clamp(max=k))
            assert int(count[bounds[1]:].sum()) == 0


def test_every_seed_once_per_epoch_split_evenly(sampled):
    graph, results = sampled
    sizes = results[0]["chunk_sizes"]
    assert sum(sizes) == int(graph.train_mask.sum()) and max(sizes) - min(sizes) <= 1
    steps = len(results[0]["loop"]) // 2
    for epoch in range(2):
        seeds = torch.cat([b["n_id"][:b["batch_size"]] for r in results
                           for b in r["loop"][epoch * steps:(epoch + 1) * steps]])
        assert torch.equal(seeds.sort().values, graph.train_mask.nonzero().view(-1))
    first = [b["n_id"][:b["batch_size"]] for b in results[0]["loop"]]
    assert not torch.equal(first[0], first[steps])  # shuffled per epoch


def test_pipelined_batches_equal_loop_batches_and_cache_saves_bytes(sampled):
    _, results = sampled
    for result in results:
        assert len(result["pool"]) == len(result["loop"])
        for a, b in zip(result["loop"], result["pool"]):
            for key in ("n_id", "edge_index", "x", "y"):
                assert torch.equal(a[key], b[key])
        loop, pool = result["loop_report"], result["pool_report"]
        assert pool["cache_hits"] > 0 and loop["cache_hits"] == 0
        assert pool["cache_lookups"] == loop["cache_lookups"]  # the same remote rows read
        assert pool["feature_bytes"] < loop["feature_bytes"] and loop["feature_bytes"] > 0
        assert pool["in_flight"] >= 1


def test_all_neighbours_equal_pyg_on_the_whole_graph(sampled):
    graph, results = sampled
    torch.manual_seed(0)
    model = GraphSAGE(graph.num_features, 8, 2, 5)
    adj_t = to_torch_csr_tensor(graph.edge_index.flip(0), size=(graph.num_nodes, ) * 2)
    full = model(graph.x, adj_t)
    for result in results:
        exact = result["exact"]
        expected = full[exact["n_id"]]
        assert_fp32_close(exact["out"], expected, msg="outputs")
        model.zero_grad()
        model(graph.x, adj_t)[exact["n_id"]].pow(2).sum().backward()
        for (name, p), g in zip(model.named_parameters(), exact["grads"]):
            assert_fp32_close(g, p.grad, msg=f"gradient {name}")


def test_pool_adapts_its_depth_and_keeps_order():
    def produce(job, worker):
        time.sleep(slow_sampling[0])
        return job

    slow_sampling = [0.03]
    pool = SamplerPool(produce, num_workers=4)
    got = []
    for job in range(40):
        got.append(pool.get(job))
        time.sleep(0.003)  # the trainer is 10x faster than sampling: it starves
    starved = pool.report()
    assert got == list(range(40)) and pool.target == 4 and starved["in_flight"] > 2
    slow_sampling[0] = 0.001
    pool.reset_report()
    for job in range(40, 80):
        assert pool.get(job) == job
        time.sleep(0.02)  # sampling is now 20x faster: one batch ahead suffices
    assert pool.target == 1 and pool.report()["idle"] < starved["idle"]
    pool.close(timeout=5)
    assert not any(t.is_alive() for t in pool.threads)


def test_pool_raises_a_worker_error():
    def produce(job, worker):
        if job == 2:
            raise ValueError("owner unreachable")
        return job

    pool = SamplerPool(produce, num_workers=2, adaptive=False)
    assert [pool.get(0), pool.get(1)] == [0, 1]
    with pytest.raises(RuntimeError, match="mini-batch 2 failed: owner unreachable"):
        pool.get(2)
    pool.close(timeout=5)


def test_dead_rank_while_sampling_fails_the_others(graph, tmp_path):
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        pyg_dist.spawn(die_while_sampling, 2, (str(tmp_path), 1), timeout=10)
    message = str(info.value)
    assert "rank 1 died (exit code 3)" in message
    assert "rank 0: " in message and "did not finish" not in message
    assert time.monotonic() - start < 10 + 15
