"""CM-GCN's asynchronous computation across layers (``overlap="nodes"``):
the same outputs and gradients as single-process PyG, and the schedule it
promises (stages of later layers computed while earlier exchanges travel,
forward and backward), on real gloo ranks."""
import json

import pytest
import torch
from torch_geometric.nn import GAT, GIN, GraphSAGE, SAGEConv

import pyg_dist
from pyg_dist.comm import HaloPlan
from pyg_dist.datasets import synthetic_communities
from pyg_dist.nn.async_layers import Schedule
from pyg_dist.train import TrainConfig, load_model, train_single_process
from tests.nn import async_workers as workers
from tests.models import linear_loss
from tests.numeric import assert_fp32_close, assert_params_close, assert_scalar_close

MODELS = ["GraphSAGE", "GCN", "GIN", "GraphConv"]


def sparse_graph(directed: bool = False):
    r"""A graph whose parts have rows at every depth from the halo up to
    three (average degree 4), so every stage of a 3-layer model has rows."""
    data = synthetic_communities(num_nodes=300, num_classes=5, num_features=12,
                                 num_communities=8, avg_degree=4, seed=0)
    if directed:
        keep = torch.rand(data.num_edges, generator=torch.Generator().manual_seed(1)) > 0.33
        data.edge_index = data.edge_index[:, keep]
    return data


@pytest.fixture(scope="module")
def graph2(tmp_path_factory):
    data = sparse_graph()
    root = str(tmp_path_factory.mktemp("async2"))
    pyg_dist.partition_graph(data, 2, root=root)
    return data, root


@pytest.fixture(scope="module")
def passes(graph2):
    r"""Every model with overlap="nodes" and with no overlap: two steps each."""
    _, root = graph2
    return {mode: pyg_dist.spawn(workers.nodes_passes, 2, (root, MODELS, mode), timeout=180)
            for mode in ("nodes", False)}


@pytest.fixture(scope="module")
def other_passes(graph2):
    r"""Input gradients, a cohesive batch and a BNS plan, per overlap."""
    _, root = graph2
    return {mode: pyg_dist.spawn(workers.other_passes, 2, (root, mode), timeout=180)
            for mode in ("nodes", False)}


def _reference(data, name: str, steps: int = 2):
    r"""Single-process PyG: per Adam step the outputs and gradients."""
    torch.manual_seed(0)
    model = workers.build(name, data.num_features)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    out = []
    for _ in range(steps):
        optimizer.zero_grad()
        y = model(data.x, data.edge_index)
        linear_loss(y, torch.arange(data.num_nodes)).backward()
        out.append((y.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
        optimizer.step()
    model.eval()
    with torch.no_grad():
        return out, model(data.x, data.edge_index)


def _depth(part) -> torch.Tensor:
    r"""Per inner node, the length of the shortest path from a halo node
    (``10**9``: none), by breadth-first search."""
    n = part.num_inner
    src, dst = part.edge_index
    depth = torch.full((n, ), 10**9)
    frontier = torch.zeros(n, dtype=torch.bool)
    frontier[dst[src >= n]] = True
    k = 1
    while frontier.any():
        depth[frontier] = k
        inner = src < n
        reached = torch.zeros(n, dtype=torch.bool)
        reached[dst[inner][frontier[src[inner]]]] = True
        frontier = reached & (depth == 10**9)
        k += 1
    return depth


@pytest.mark.parametrize("directed", [False, True])
def test_stages_are_the_depths_from_the_halo(tmp_path, directed):
    r"""Stage s of layer l holds the rows at depth l - s + 1 from the halo
    (stage 0: deeper than l), as the readiness recursion promises on one
    graph; each stage reads only rows its exchange leaves ready
    (:meth:`Schedule.build` checks the columns of every block)."""
    pyg_dist.partition_graph(sparse_graph(directed), 2, root=str(tmp_path))
    for rank in range(2):
        part = pyg_dist.DistData.load(str(tmp_path), rank)
        plan = HaloPlan.full(part)
        stages = Schedule.build([plan] * 3, [part.adj_t] * 3, ["x"] * 3).rows_per_stage()
        depth = _depth(part)
        for l in range(1, 4):
            want = [int((depth > l).sum())] + [int((depth == l - s + 1).sum())
                                               for s in range(1, l + 1)]
            assert stages[l - 1] == want, (rank, l)
        if not directed:  # the fixture's promise: every stage of 3 layers has rows
            assert all(rows > 0 for layer in stages for rows in layer), stages


def test_nodes_overlap_matches_pyg(graph2, passes):
    r"""Outputs, gradients (two Adam steps: the weights change) and the
    evaluation output equal single-process PyG for every supported layer;
    the same bytes as exchanging first."""
    data, _ = graph2
    every_nodes, every_plain = passes["nodes"], passes[False]
    for name in MODELS:
        ref_steps, ref_eval = _reference(data, name)
        nodes, plain = [r[name] for r in every_nodes], [r[name] for r in every_plain]
        n_id = torch.cat([r["n_id"] for r in nodes])
        for step, (ref_out, ref_grads) in enumerate(ref_steps):
            got = torch.cat([r["steps"][step][0] for r in nodes])
            assert_fp32_close(got, ref_out[n_id], msg=f"{name} step {step}: outputs")
            assert_params_close(nodes[0]["steps"][step][1], ref_grads,
                                msg=f"{name} step {step}: gradients")
        assert_fp32_close(torch.cat([r["eval"] for r in nodes]), ref_eval[n_id],
                          msg=f"{name}: evaluation")
        for a, b in zip(nodes, plain):
            assert a["bytes"] == b["bytes"] and sum(a["bytes"][0].values()) > 0, name
            assert a["counts"]["async_layers"] == 3 and "async_layers" not in b["counts"]


def test_directed_graph_matches_pyg(tmp_path):
    data = sparse_graph(directed=True)
    pyg_dist.partition_graph(data, 3, root=str(tmp_path))
    ref_steps, _ = _reference(data, "GraphSAGE")
    nodes = pyg_dist.spawn(workers.nodes_pass, 3, (str(tmp_path), "GraphSAGE", "nodes"),
                           timeout=120)
    n_id = torch.cat([r["n_id"] for r in nodes])
    for step, (ref_out, ref_grads) in enumerate(ref_steps):
        assert_fp32_close(torch.cat([r["steps"][step][0] for r in nodes]), ref_out[n_id])
        assert_params_close(nodes[0]["steps"][step][1], ref_grads)


def _position(trace, *event):
    return next(i for i, e in enumerate(trace) if e[:len(event)] == event)


@pytest.mark.parametrize("name", MODELS)
def test_schedule_has_no_barrier_between_layers(passes, name):
    r"""Forward: layers 2 and 3 compute their deep rows before exchange 1
    (layer 1's halo rows) has arrived, and every stage s runs between the
    wait for exchange s and the wait for exchange s + 1. Backward: the
    halo gradients of layer 3 travel while layers 3 and 2 differentiate
    their other stages, and exchange j's gradients leave before any wait
    for j - 1. With a barrier per layer (overlap=True) no such trace
    exists and layer l + 1 starts after exchange l arrived."""
    for r in (ranks[name] for ranks in passes["nodes"]):
        trace, stages = r["trace"], r["rows_per_stage"]
        forward = trace[:_position(trace, "stage_backward")]
        backward = trace[len(forward):]
        computed = [(e[1], e[2]) for e in forward if e[0] == "stage"]
        # every non-empty stage once, stage 0 of every layer even if empty
        assert sorted(computed) == sorted((l, s) for l in range(1, 4) for s in range(l + 1)
                                          if stages[l - 1][s] > 0 or s == 0)
        wait = {e[1]: i for i, e in enumerate(forward) if e[0] == "wait"}
        post = {e[1]: i for i, e in enumerate(forward) if e[0] == "post"}
        assert post[1] < _position(forward, "stage", 2, 0) < wait[1]
        assert post[1] < _position(forward, "stage", 3, 0) < wait[1]
        assert stages[1][0] > 0 and stages[2][0] > 0  # layers 2, 3 did work before it
        for (l, s) in computed:
            at = _position(forward, "stage", l, s)
            assert (s == 0 or wait[s] < at) and (s == 3 or at < wait[s + 1]), (l, s)
        # exchange 2 leaves once layer 1 is complete; layer 2's stage 1 hides it
        assert _position(forward, "stage", 1, 1) < post[2] < _position(forward, "stage", 2, 1)
        # backward: the gradient exchanges leave in order 3, 2 and hide work
        grad_post = {e[1]: i for i, e in enumerate(backward) if e[0] == "grad_post"}
        grad_wait = {e[1]: i for i, e in enumerate(backward) if e[0] == "grad_wait"}
        # x needs no gradient; GCN's layer 1 transforms it (XΘ travels)
        assert sorted(grad_post) == sorted(grad_wait) == ([1, 2, 3] if name == "GCN" else [2, 3])
        assert grad_post[3] < grad_post[2] < grad_wait[2]
        assert grad_post[3] < grad_wait[3] < grad_post[2]
        hidden = [(e[1], e[2]) for e in backward[grad_post[3] + 1:grad_wait[3]]]
        assert (3, 2) in hidden and (2, 1) in hidden and (2, 0) in hidden, hidden
        assert _position(backward, "stage_backward", 3, 3) < grad_post[3]
        assert grad_wait[3] < _position(backward, "stage_backward", 2, 2) < grad_post[2]
        assert grad_post[2] < _position(backward, "stage_backward", 1, 0) < grad_wait[2]
        assert grad_wait[2] < _position(backward, "stage_backward", 1, 1)
        assert r["time"]["comm_backward"] > 0 and r["time"]["comm"] > r["time"]["comm_backward"]


def test_input_gradient_matches(other_passes):
    r"""An input that requires a gradient gets it, halo rows' share
    returned through exchange 1, as without the schedule."""
    nodes, plain = ([r["input"] for r in other_passes[m]] for m in ("nodes", False))
    for (n_id, got), (_, want) in zip(nodes, plain):
        assert_fp32_close(got, want)
        assert got.abs().sum() > 0


def test_compressed_exchange_matches_and_backward_runs_once(other_passes):
    r"""bf16 rows and gradients: the same outputs, gradients and bytes as
    without the schedule. A second backward through a pass (retain_graph)
    is refused with a clear error, not a wrong gradient."""
    nodes, plain = ([r["bf16"] for r in other_passes[m]] for m in ("nodes", False))
    for a, b in zip(nodes, plain):
        assert_fp32_close(a["out"], b["out"])
        assert_params_close(a["grads"], b["grads"])
        assert a["bytes"] == b["bytes"] > 0
        assert "differentiated once" in a["twice"]


@pytest.mark.parametrize("name", ["GraphSAGE", "GCN"])
def test_cohesive_batch_and_sampled_plan_match(other_passes, name):
    r"""A cohesive batch (per-layer plans on shrinking prefixes) and a BNS
    plan: the same outputs, gradients and bytes as exchanging first."""
    nodes, plain = ([r[name] for r in other_passes[m]] for m in ("nodes", False))
    for a, b in zip(nodes, plain):
        for case in ("batch", "bns"):
            assert_fp32_close(a[case][0], b[case][0], msg=f"{case}: outputs")
            assert_params_close(a[case][1], b[case][1], msg=f"{case}: gradients")
            assert a[case][2] == b[case][2] > 0, case
            assert a[case][3] == 3 and b[case][3] == 0, case


def test_training_matches_pyg(graph2, tmp_path):
    r"""``train()`` with ``overlap="nodes"`` (full-graph loader) ends with
    the parameters and loss of single-process PyG; its rows split the
    halo wait into forward and backward."""
    data, root = graph2
    out = str(tmp_path / "run")
    config = TrainConfig(model="gcn", num_layers=3, hidden=16, dropout=0.0, epochs=3,
                         progress=False, overlap="nodes")
    summary = pyg_dist.spawn(workers.train_run, 2, (root, config, out), timeout=120)[0]
    reference, ref_model = train_single_process(data, config)
    assert_params_close(dict(load_model(out).named_parameters()),
                        dict(ref_model.named_parameters()))
    assert_scalar_close(summary["final_loss"], reference["final_loss"], msg="final loss")
    assert summary["config"]["overlap"] == "nodes"
    rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
    assert all(0 < r["time_comm_backward"] < r["time_comm"] for r in rows)


def _part(tmp_path):
    pyg_dist.partition_graph(sparse_graph(), 1, root=str(tmp_path))
    return pyg_dist.DistData.load(str(tmp_path), 0)


@pytest.mark.parametrize("build,kwargs,error,message", [
    (lambda c: GAT(c, 8, 2, 5), {}, NotImplementedError, "GATConv"),
    (lambda c: GraphSAGE(c, 8, 2, 5, jk="cat"), {}, NotImplementedError, "jk"),
    (lambda c: GraphSAGE(c, 8, 2, 5, norm="batch_norm"), {}, NotImplementedError,
     "not row-wise"),
    (lambda c: GIN(c, 8, 2, 5, norm="batch_norm"), {}, NotImplementedError,
     "statistics over all rows"),
    (lambda c: SAGEConv(c, 5), {}, NotImplementedError, "BasicGNN"),
    (lambda c: GraphSAGE(c, 8, 2, 5), {"precompute_layer0": True}, ValueError,
     "precompute_layer0"),
    (lambda c: GraphSAGE(c, 8, 2, 5), {"cache": "pipeline"}, ValueError,
     "exact cache"),
    (lambda c: GraphSAGE(c, 8, 2, 5), {"overlap": "yes"}, ValueError,
     "overlap must be"),
])
def test_unsupported_is_refused_before_any_work(tmp_path, build, kwargs, error, message):
    from pyg_dist.cache import PipelineCache
    part = _part(tmp_path)
    model = build(part.num_features)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kwargs = {"overlap": "nodes", **kwargs}
    if kwargs.get("cache") == "pipeline":
        kwargs["cache"] = PipelineCache(1)
    with pytest.raises(error, match=message):
        pyg_dist.nn.distribute(model, part, **kwargs)
    assert not hasattr(model, "dist_context")  # nothing converted
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("overlap,want", [([], False), (["--overlap"], True),
                                          (["--overlap", "layers"], True),
                                          (["--overlap", "nodes"], "nodes")])
def test_cli_overlap_flag(tmp_path, monkeypatch, overlap, want):
    r"""A bare ``--overlap`` is today's (``True``), ``--overlap nodes`` the
    new mode."""
    import pyg_dist.launch
    from pyg_dist.cli import main
    seen = {}

    def capture(root, config, *args, **kwargs):
        config.validate()
        seen["overlap"] = config.overlap
        return {}

    monkeypatch.setattr(pyg_dist.launch, "run_training", capture)
    main(["train", "--root", str(tmp_path), "--no-plots", *overlap])
    assert seen["overlap"] == want and type(seen["overlap"]) is type(want)


@pytest.mark.parametrize("args,message", [
    (["--overlap", "nodes", "--model", "gat"], "overlap='nodes' runs models"),
    (["--overlap", "nodes", "--staleness", "1"], "needs the exact cache"),
    (["--overlap", "nodes", "--precompute-layer0"], "precompute_layer0"),
    (["--overlap", "everything"], "invalid choice"),
])
def test_cli_refuses_nodes_overlap_it_cannot_run(tmp_path, args, message, capsys):
    from pyg_dist.cli import main
    with pytest.raises(SystemExit) as info:
        main(["train", "--root", str(tmp_path), *args])
    assert info.value.code != 0
    assert message in capsys.readouterr().err + str(info.value.code)
