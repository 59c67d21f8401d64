"""The sequential exchange (SAR) on real gloo worlds of 2 and 3 ranks:
every layer it accepts equals single-process PyG (outputs and weight
gradients over two SGD steps), on METIS and random partitions, through
``edge_index`` and ``adj_t``; it moves each halo row once (a layer that
aggregates its rows as they are) or twice (the backward re-fetches it) and
its gradient once; it composes with a codec
and a BNS plan; what it cannot compute exactly is refused."""
import pytest
import torch
from torch_geometric.utils import to_torch_csr_tensor

import pyg_dist
from tests.comm import sequential_workers as workers
from tests.conftest import small_graph
from tests.numeric import assert_fp32_close, assert_params_close, assert_scalar_close


def _graph():
    data = small_graph()
    gen = torch.Generator().manual_seed(5)
    data.edge_attr = torch.randn(data.num_edges, workers.EDGE_DIM, generator=gen)
    return data


@pytest.fixture(scope="module")
def graph():
    return _graph()


@pytest.fixture(scope="module")
def reference(graph):
    r"""Single-process PyG, per layer and form."""
    data = graph.clone()
    data.adj_t = to_torch_csr_tensor(data.edge_index.flip(0), size=(data.num_nodes, ) * 2)
    n_id = torch.arange(data.num_nodes)
    return {(name, form): workers.train_steps(workers.build(name, data.num_features), name,
                                              data.x, data[form], data.edge_attr, n_id)
            for name in workers.LAYERS for form in workers.forms(name)}


def _parts(graph, tmp_path_factory, world: int):
    roots = []
    for method in ("metis", "random"):
        root = str(tmp_path_factory.mktemp(f"seq_{method}{world}"))
        pyg_dist.partition_graph(graph, world, method=method, root=root)
        roots.append(root)
    return roots


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def world_results(request, graph, tmp_path_factory):
    roots = _parts(graph, tmp_path_factory, request.param)
    return roots, pyg_dist.spawn(workers.every_layer, request.param, (roots, ), timeout=300)


def test_every_accepted_layer_matches_pyg(world_results, reference):
    r"""Outputs and summed gradients of both SGD steps, for every layer of
    :data:`~pyg_dist.nn.spec.LAYERS` marked ``sequential`` (SAGE with mean, max
    and sum, GraphConv with min, GAT with and without edge features)."""
    roots, ranks = world_results
    for root in roots:
        n_id = torch.cat([r[root, "n_id"] for r in ranks])
        for name in workers.LAYERS:
            for form in workers.forms(name):
                for step, (out, grads) in enumerate(reference[name, form]):
                    got = torch.cat([r[root, name, form][step][0] for r in ranks])
                    what = f"{name} on {form}, {root.rsplit('/', 1)[-1]}, step {step}"
                    assert_fp32_close(got, out[n_id], msg=f"{what}: outputs")
                    assert_params_close(ranks[0][root, name, form][step][1], grads,
                                        msg=f"{what}: grad")


def test_the_accepted_classes_are_the_tested_ones():
    from pyg_dist.nn.spec import layer_names
    tested = {name.split("(")[0] for name in workers.LAYERS}
    assert tested == layer_names(sequential=True)


@pytest.fixture(scope="module")
def composed(graph, tmp_path_factory):
    root = _parts(graph, tmp_path_factory, 3)[1]  # random: a large halo
    return pyg_dist.spawn(workers.bytes_and_composition, 3, (root, ), timeout=120)


def test_rows_travel_once_or_twice_and_gradients_once(composed):
    r"""Per layer, the sequential exchange sends the halo exchange's rows in
    the forward pass and the same gradients back. A layer that aggregates
    its rows as they are (SAGE's mean over ``adj_t``) differentiates
    without them: nothing more travels. Any other (GAT) recomputes each
    piece in the backward and fetches its rows again (rematerialisation).
    Layer 0's input needs no gradient: its rows are not re-fetched."""
    for r in composed:
        halo_sent, halo_recv = composed_bytes(r, "halo")
        seq_sent, seq_recv = composed_bytes(r, "sequential")
        assert seq_sent["first.x"] == halo_sent["first.x"]
        assert seq_recv["first.x"] == halo_recv["first.x"]
        assert "first.x.refetch" not in seq_sent and "first.x.grad" not in seq_sent
        for key in ("second.x", "second.x.grad"):
            assert seq_sent[key] == halo_sent[key] > 0 and seq_recv[key] == halo_recv[key]
        assert not any(key.endswith(".refetch") for key in seq_sent)
        gat = r["sequential", "sent", "GATConv"]
        refetched = [key for key in gat if key.endswith(".refetch")]
        assert refetched and all(gat[key] == gat[key[:-len(".refetch")]] > 0
                                 for key in refetched)


def composed_bytes(result, exchange):
    return result[exchange, "fp32"][2], result[exchange, "fp32"][3]


def test_composes_with_a_codec_a_sampler_and_overlap(composed):
    r"""bf16 rows, a BNS plan (mean and max aggregation; p = 0, where no
    peer sends anything) and the next
    peer's rows fetched ahead (``overlap=True``): the same outputs and
    gradients as the halo exchange given the same rows."""
    for r in composed:
        for name in ("GATConv", "GINConv"):
            for step, (seq, halo) in enumerate(zip(r["sequential", "overlap", name],
                                                   r["halo", "overlap", name])):
                assert_fp32_close(seq[0], halo[0], msg=f"{name} overlap step {step}: outputs")
                assert_params_close(seq[1], halo[1], msg=f"{name} overlap step {step}: grads")
        out, grads, sent, _ = r["sequential", "bf16"]
        assert_fp32_close(out, r["halo", "bf16"][0], msg="bf16 outputs")
        assert_params_close(grads, r["halo", "bf16"][1], msg="bf16 grads")
        assert 2 * sent["second.x"] == r["sequential", "fp32"][2]["second.x"]
        for aggr, p in (("mean", 0.5), ("max", 0.5), ("mean", 0.0)):
            (y, g) = r["sequential", "bns", aggr, p]
            (y_halo, g_halo) = r["halo", "bns", aggr, p]
            assert_fp32_close(y, y_halo, msg=f"BNS p={p} {aggr} outputs")
            assert_params_close(g, g_halo, msg=f"BNS p={p} {aggr} grads")


def test_refused_before_any_work(graph, tmp_path_factory):
    r"""Layers whose aggregation does not decompose or that are not verified,
    a user's layer whose update would run once per piece, attention weights
    (no piece holds a whole neighbourhood), stale caches, overlap='nodes'
    and the feature cache: each refused with its reason."""
    root = _parts(graph, tmp_path_factory, 2)[0]
    out = pyg_dist.spawn(workers.refusals, 2, (root, ), timeout=120)[0]
    assert "PNAConv" in out["PNAConv"][1] and "not among the layers verified" in out["PNAConv"][1]
    assert out["APPNP"][0] == "NotImplementedError"
    assert "does not decompose" in out["SAGEConv(std)"][1]
    assert "does not run on exchange='sequential'" in out["pipeline"][1]
    assert "overrides update or aggregate" in out["Biased"][1]
    assert "returns no attention weights" in out["attention weights"][1]
    assert out["overlap"][0] == "ValueError" and "runs on exchange='halo'" in out["overlap"][1]
    assert out["feature_cache"][0] == "ValueError"
    assert "exchange='sequential'" in out["feature_cache"][1]


def test_a_precomputed_first_layer_stays_sequential(graph, tmp_path_factory):
    r"""``precompute_layer0`` aggregates the first layer's features once, and
    that aggregation too goes piece by piece (it never holds the layer's
    whole halo)."""
    root = _parts(graph, tmp_path_factory, 2)[0]
    for layers, engine in pyg_dist.spawn(workers.precomputed_first_layer, 2, (root, ),
                                         timeout=120):
        assert (layers, engine) == (2, "sequential")


def test_a_memory_budget_materialises_the_layers_that_fit(graph, tmp_path_factory, reference):
    r"""Under a memory budget, the layers whose halo rows fit in what is left
    of it receive them all at once and the others one peer's rows at a
    time, in any mix (GCN: only the first layer, only the second), with
    attention (GAT) and without; ranks given different budgets choose
    alike (the smallest); outputs and gradients of both SGD steps equal
    single-process PyG's either way."""
    root = _parts(graph, tmp_path_factory, 2)[0]
    ranks = pyg_dist.spawn(workers.budgeted, 2, (root, ), timeout=180)
    n_id = torch.cat([r["n_id"] for r in ranks])
    expected = {"none": ("sequential", "sequential"), "first": ("materialised", "sequential"),
                "second": ("sequential", "materialised"),
                "all": ("materialised", "materialised"),
                "one rank none": ("sequential", "sequential"),
                "one rank 0": ("sequential", "sequential")}
    for (name, label), (_, choices, pieces) in ((k, v) for k, v in ranks[0].items()
                                                if k != "n_id"):
        form = workers.BUDGETED[name]
        assert tuple(choices.values()) == expected[label], (name, label)
        assert list(choices) == ["first", "second"]
        # every pass of a sequential layer aggregated piece by piece, no other
        assert pieces == workers.STEPS * expected[label].count("sequential"), (name, label)
        for step, (out, grads) in enumerate(reference[name, form]):
            got = torch.cat([r[name, label][0][step][0] for r in ranks])
            what = f"{name}, budget '{label}', step {step}"
            assert_fp32_close(got, out[n_id], msg=f"{what}: outputs")
            assert_params_close(ranks[0][name, label][0][step][1], grads, msg=f"{what}: grad")
    for r in ranks[1:]:  # every rank chose alike
        assert all(r[k][1] == ranks[0][k][1] for k in r if k != "n_id")


@pytest.mark.parametrize("ranks,budget", [(2, None), (2, 2 ** 30), (1, None)],
                         ids=["sequential", "budget", "one rank"])
def test_training_matches_pyg(graph, tmp_path, ranks, budget):
    r"""``train()`` with ``--exchange sequential``: the trained parameters
    and the final loss equal single-process PyG's (GCN, so its whole-graph
    normalisation is covered, through the trainer's own loop); with a
    memory budget every layer fits, and ``summary.json`` says so; one rank
    has no halo to receive piece by piece: every layer materialises."""
    from pyg_dist.config import TrainConfig
    from pyg_dist.train import load_model, train_single_process
    from tests.comm.broadcast_workers import train_rank
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, ranks, root=root)
    config = TrainConfig(model="gcn", num_layers=2, hidden=16, dropout=0.0, epochs=4,
                         progress=False, exchange="sequential", memory_budget=budget)
    summary = pyg_dist.spawn(train_rank, ranks, (root, config, out), timeout=120)[0]
    assert summary["layer_aggregation"] == dict.fromkeys(
        ("convs.0", "convs.1"),
        "sequential" if budget is None and ranks > 1 else "materialised")
    reference, ref_model = train_single_process(graph, config)
    assert_params_close(dict(load_model(out).named_parameters()),
                        dict(ref_model.named_parameters()), msg="parameter")
    assert_scalar_close(summary["final_loss"], reference["final_loss"], msg="final loss")
    assert summary["config"]["exchange"] == "sequential"


def test_config_refusals():
    r"""What the sequential exchange cannot run with is refused when the
    configuration is validated, before any work."""
    from pyg_dist.config import TrainConfig
    for kwargs, word in ((dict(sampler="vr"), "sampler='vr'"),
                         (dict(loader="cohesive"), "loader='cohesive'"),
                         (dict(cache="pipeline"), "cache='pipeline'"),
                         (dict(cache="historical"), "cache='historical'"),
                         (dict(feature_cache="degree"), "feature_cache='degree'"),
                         (dict(overlap="nodes"), "overlap='nodes'")):
        with pytest.raises(ValueError, match=word):
            TrainConfig(exchange="sequential", **kwargs).validate()
    for kwargs in (dict(sampler="bns"), dict(overlap=True), dict(exchange_dtype="int8"),
                   dict(memory_budget=0), dict(memory_budget=2 ** 30)):
        TrainConfig(exchange="sequential", **kwargs).validate()
    for exchange in ("halo", "broadcast"):
        with pytest.raises(ValueError, match="memory_budget .* needs exchange='sequential'"):
            TrainConfig(exchange=exchange, memory_budget=2 ** 20).validate()
    for budget in (-1, 1.5, True):
        with pytest.raises(ValueError, match="memory_budget is a number of bytes"):
            TrainConfig(exchange="sequential", memory_budget=budget).validate()


class _Rounds:
    r"""A ring's rounds as source ranges of a graph (the slices
    :class:`~pyg_dist.comm.ring.RingSchedule` derives from a plan)."""

    def __init__(self, bounds):
        self.bounds, self.world = bounds, len(bounds) - 1

    def sources(self, k):
        return slice(self.bounds[k], self.bounds[k + 1])


@pytest.mark.parametrize("columns", ["sorted", "interleaved"])
def test_a_piece_keeps_one_entry_a_row_where_its_edges_lie_together(columns):
    r"""A CSR graph's piece locates its edges by one entry a row where each
    row's edges of the piece lie side by side in the graph (columns sorted
    within rows, as a partition's are), by one an edge where they do not;
    either way it materialises as the graph's columns of its round."""
    from pyg_dist.comm.sequential import cut, materialise
    from pyg_dist.utils import csr_tensor
    gen = torch.Generator().manual_seed(1)
    num_inner, num_src, num_edges = 30, 70, 400
    edge_index = torch.stack([torch.randint(0, num_src, (num_edges, ), generator=gen),
                              torch.randint(0, num_inner, (num_edges, ), generator=gen)])
    graph = to_torch_csr_tensor(edge_index.flip(0), torch.rand(num_edges, generator=gen),
                                (num_inner, num_src))
    crow, col, value = graph.crow_indices(), graph.col_indices(), graph.values()
    if columns == "interleaved":  # each row's columns by their parity, then value
        order = torch.cat([torch.argsort(col[a:b] % 2 * num_src + col[a:b]) + a
                           for a, b in zip(crow[:-1].tolist(), crow[1:].tolist())])
        graph = csr_tensor(crow, col[order], value[order], graph.shape)
    rounds = _Rounds([0, num_inner, 50, num_src])
    pieces = cut(graph, num_inner, rounds)
    for k, piece in enumerate(pieces):
        if columns == "sorted":
            assert piece.position is None and piece.shift.numel() == num_inner
        else:
            assert piece.shift is None and piece.position.numel() == piece.num_edges
        assert torch.equal(materialise(piece, graph).graph.to_dense(),
                           graph.to_dense()[:, rounds.sources(k)])


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_pieces_slice_the_plan_s_kept_transpose(reduce):
    r"""A piece of a graph that keeps its transpose (a plan's) takes its
    transpose as a slice of the graph's for its backward: the same edges in
    the order a transpose of the piece has, and the same gradient as torch's
    backward of the piece; a piece of an unmarked graph, or one for a
    forward, keeps nothing."""
    from pyg_dist.comm.sequential import cut, materialise
    from pyg_dist.utils.aggregate import keep_transpose, spmm, transposed
    from pyg_dist.utils.aggregate import kept as kept_transpose
    gen = torch.Generator().manual_seed(0)
    num_inner, num_src, num_edges = 30, 70, 400
    edge_index = torch.stack([torch.randint(0, num_src, (num_edges, ), generator=gen),
                              torch.randint(0, num_inner, (num_edges, ), generator=gen)])
    values = torch.rand(num_edges, generator=gen)
    plain = to_torch_csr_tensor(edge_index.flip(0), values, (num_inner, num_src))
    marked = keep_transpose(to_torch_csr_tensor(edge_index.flip(0), values, (num_inner, num_src)))
    rounds = _Rounds([0, num_inner, 50, num_src])
    for piece in cut(marked, num_inner, rounds):
        kept = materialise(piece, marked, backward=True).graph
        fresh = materialise(piece, plain, backward=True).graph
        assert kept_transpose(fresh) is None
        assert kept_transpose(materialise(piece, marked).graph) is None  # forward
        expected, got = transposed(fresh), kept_transpose(kept)
        assert got.shape == expected.shape == (piece.num_rows, num_inner)
        for a, b in [(got.crow_indices(), expected.crow_indices()),
                     (got.col_indices(), expected.col_indices()),
                     (got.values(), expected.values())]:
            assert torch.equal(a, b)
        x = torch.randn(piece.num_rows, 8, generator=gen, requires_grad=True)
        out_grad = torch.randn(num_inner, 8, generator=gen)
        ours = torch.autograd.grad(spmm(kept, x, reduce), x, out_grad)[0]
        torch_s = torch.autograd.grad(spmm(fresh, x, reduce), x, out_grad)[0]
        assert_fp32_close(ours, torch_s)


def test_a_linear_layer_keeps_no_input_past_backward(graph, tmp_path_factory):
    r"""A linear layer's sequential backward (GraphSAGE's mean) reads
    nothing of the layer's call: its input is freed by backward, as the
    halo exchange's is, not held by the graph to the step's end. The
    transpose it reads is built by the forward, before the rounds' buffers
    (as the halo exchange's aggregation does)."""
    root = _parts(graph, tmp_path_factory, 2)[1]
    for freed in pyg_dist.spawn(workers.layer_input_freed, 2, (root, ), timeout=120):
        assert freed["halo"] == freed["sequential"] == (True, True)


def test_a_linear_forward_adds_each_piece_into_its_output(graph, tmp_path_factory):
    r"""A linear layer's sequential forward (GraphSAGE's mean, 3 ranks, so 3
    rounds) adds each round's product into its output in place: one buffer
    of the output's size, not one partial aggregate per round."""
    root = _parts(graph, tmp_path_factory, 3)[1]
    for count, ambiguous in pyg_dist.spawn(workers.linear_forward_allocations, 3, (root, ),
                                           timeout=120):
        assert not ambiguous
        assert count == 1
