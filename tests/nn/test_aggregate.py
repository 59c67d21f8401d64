"""pyg_dist.utils.aggregate: the sparse aggregation whose backward keeps the
adjacency's transpose equals PyG's spmm (outputs and gradients), keeps the
transpose only on an adjacency a plan serves, and is what the layers call."""
import pytest
import torch
from torch_geometric.nn import GCNConv, GraphConv, SAGEConv
from torch_geometric.utils import spmm as pyg_spmm

from pyg_dist.utils import aggregate
from pyg_dist.utils.aggregate import column_blocks, keep_transpose, kept, spmm, transposed
from pyg_dist.nn.conv import DistGraphConv
from pyg_dist.nn.conv.sage_conv import DistSAGEConv
from pyg_dist.utils import csr_tensor
from tests.numeric import assert_fp32_close


def _adjacency(rows: int, cols: int, nnz: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    key = torch.unique(torch.randint(0, rows * (cols - 1), (nnz, ), generator=gen))
    row, col = key // (cols - 1), key % (cols - 1)
    keep = row % 7 != 0  # rows without an entry (and the last column without one)
    row, col, key = row[keep], col[keep], key[keep]
    crow = torch.zeros(rows + 1, dtype=torch.long)
    crow[1:] = torch.bincount(row, minlength=rows).cumsum(0)
    return csr_tensor(crow, col, torch.rand(key.numel(), generator=gen), (rows, cols))


def _keeps_a_transpose(adj) -> bool:  # a sum's, or a mean's
    return kept(adj, "sum") is not None or kept(adj, "mean") is not None


@pytest.mark.parametrize("reduce", ["sum", "add", "mean"])
def test_equals_pyg_at_every_use(reduce):
    adj = keep_transpose(_adjacency(60, 80, 400))
    assert int(adj.crow_indices().diff().eq(0).sum()) > 0  # rows without an entry
    x = torch.randn(80, 7, requires_grad=True)
    grad = torch.randn(60, 7)
    expected = pyg_spmm(adj, x, reduce)
    expected_grad, = torch.autograd.grad(expected, x, grad)
    name = "mean" if reduce == "mean" else "sum"
    first = None
    for use in range(3):  # the transpose is built once, then served
        out = spmm(adj, x, reduce)
        got, = torch.autograd.grad(out, x, grad)
        assert_fp32_close(out, expected)
        assert_fp32_close(got, expected_grad)
        first = kept(adj, name) if first is None else first
        assert kept(adj, name) is first
        assert torch.equal(got, torch.autograd.grad(spmm(adj, x, reduce), x, grad)[0])


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_a_kept_transpose_runs_only_the_reduction_kernel(reduce):
    # each direction one kernel that writes only its output: no product of
    # MKL (a temporary and index copies every call), no division of the
    # mean's gradient
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(func.__name__)
            return func(*args, **(kwargs or {}))

    adj = keep_transpose(_adjacency(60, 80, 400, seed=2))
    x, grad = torch.randn(80, 7, requires_grad=True), torch.randn(60, 7)
    out = spmm(adj, x, reduce)
    torch.autograd.grad(out, x, grad)  # builds the transpose
    ops = []
    with Ops():
        torch.autograd.grad(spmm(adj, x, reduce), x, grad)
    assert [op for op in ops if "mm" in op or "div" in op] == \
        ["_sparse_mm_reduce_impl.default"] * 2


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_the_transpose_is_built_before_the_output(reduce):
    # a sampled plan's graph is new every step: its transpose's edge-sized
    # temporaries come and go in forward, not at backward's peak
    adj = keep_transpose(_adjacency(60, 80, 400, seed=3))
    x = torch.randn(80, 7, requires_grad=True)
    spmm(adj, x, reduce)
    assert isinstance(kept(adj, "sum" if reduce == "sum" else "mean"), torch.Tensor)


def test_the_kept_transpose_holds_only_its_own_arrays():
    # kept for the plan's lifetime: no index array may keep a larger buffer
    # alive, and a mean keeps no plain transpose's values beside its own
    adj = keep_transpose(_adjacency(60, 80, 400, seed=4))
    spmm(adj, torch.randn(80, 7, requires_grad=True), "mean")
    assert kept(adj, "sum") is None
    t = kept(adj, "mean")
    for part in (t.crow_indices(), t.col_indices(), t.values()):
        assert part.untyped_storage().nbytes() == part.numel() * part.element_size()


def test_a_sum_after_a_mean_shares_its_indices_and_equals_a_first_build():
    adj = keep_transpose(_adjacency(60, 80, 400, seed=5))
    fresh = _adjacency(60, 80, 400, seed=5)
    x = torch.randn(80, 7, requires_grad=True)
    spmm(adj, x, "mean")
    spmm(adj, x, "sum")
    mean, plain = kept(adj, "mean"), transposed(fresh)
    assert kept(adj, "sum").col_indices().data_ptr() == mean.col_indices().data_ptr()
    for a, b in zip((kept(adj, "sum").crow_indices(), kept(adj, "sum").col_indices(),
                     kept(adj, "sum").values()),
                    (plain.crow_indices(), plain.col_indices(), plain.values())):
        assert torch.equal(a, b)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_an_unmarked_graph_equals_pyg(reduce, monkeypatch):
    # a sampled batch's block: a sum takes torch's reduction kernel, not PyG's call
    adj = _adjacency(60, 80, 400, seed=1)
    x = torch.randn(80, 7, requires_grad=True)
    grad = torch.randn(60, 7)
    expected = pyg_spmm(adj, x, reduce)
    expected_grad, = torch.autograd.grad(expected, x, grad)
    calls = []
    real = torch.sparse.mm
    monkeypatch.setattr(torch.sparse, "mm", lambda *args: calls.append(args[2:]) or real(*args))
    out = spmm(adj, x, reduce)
    assert calls == [(reduce, )]
    assert_fp32_close(out, expected)
    assert_fp32_close(torch.autograd.grad(out, x, grad)[0], expected_grad)


def test_unmarked_and_gradient_free_graphs_keep_nothing():
    adj, x = _adjacency(30, 30, 100), torch.randn(30, 4, requires_grad=True)
    for _ in range(2):
        spmm(adj, x).sum().backward()
    assert kept(adj, "sum") is None  # not a plan's: torch's backward
    marked = keep_transpose(_adjacency(30, 30, 100))
    with torch.no_grad():
        spmm(marked, x)
    assert kept(marked, "sum") is None


@pytest.fixture
def small_blocks(monkeypatch):
    r"""Blocks of 16 columns, whatever their rows hold: a small graph cut as a
    large one is."""
    monkeypatch.setattr(aggregate, "BLOCK_COLUMNS", 16)
    monkeypatch.setattr(aggregate, "BLOCK_ROW_ENTRIES", 0)


def _kernel_calls(fn) -> int:
    r"""How many times :obj:`fn` runs torch's sparse reduction kernel."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(func.__name__)
            return func(*args, **(kwargs or {}))

    calls = []
    with Ops():
        fn()
    return calls.count("_sparse_mm_reduce_impl.default")


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_column_blocks_hold_every_entry_once_and_multiply_as_the_graph(reduce, small_blocks,
                                                                     monkeypatch):
    adj = _adjacency(60, 80, 400, seed=6)
    count = adj.crow_indices().diff()
    blocks = column_blocks(adj, reduce)
    assert [start for start, _ in blocks] == [0, 16, 32, 48, 64]
    assert [block.size(1) for _, block in blocks] == [16] * 5
    # the blocks, laid side by side, are the graph (a mean's: each row divided by its count)
    whole = torch.cat([block.to_dense() for _, block in blocks], dim=1)
    expected = adj.to_dense()
    if reduce == "mean":
        expected = expected / count.clamp(min=1).unsqueeze(1)
    assert torch.equal(whole, expected)
    assert sum(block.values().numel() for _, block in blocks) == adj.values().numel()
    monkeypatch.setattr(aggregate, "BLOCK_COLUMNS", 80)
    assert column_blocks(adj, reduce) is None  # one block: the graph itself


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_a_kept_graph_wider_than_a_block_multiplies_by_blocks_and_equals_pyg(reduce,
                                                                             small_blocks):
    adj = keep_transpose(_adjacency(60, 80, 400, seed=7))
    x = torch.randn(80, 7, requires_grad=True)
    grad = torch.randn(60, 7)
    expected = pyg_spmm(adj, x, reduce)
    expected_grad, = torch.autograd.grad(expected, x, grad)
    out = spmm(adj, x, reduce)
    got, = torch.autograd.grad(out, x, grad)
    assert_fp32_close(out, expected)
    assert_fp32_close(got, expected_grad)
    # forward over the graph's 5 blocks, backward over its transpose's 4 (60 columns)
    assert _kernel_calls(lambda: torch.autograd.grad(spmm(adj, x, reduce), x, grad)) == 5 + 4
    blocks = column_blocks(adj, reduce)
    again = spmm(adj, x, reduce)
    assert column_blocks(adj, reduce) is blocks  # kept, and the sums the same every use
    assert torch.equal(again, out)
    assert torch.equal(torch.autograd.grad(again, x, grad)[0], got)
    with torch.no_grad():  # evaluation takes the same blocks
        assert _kernel_calls(lambda: spmm(adj, x, reduce)) == 5
        assert torch.equal(spmm(adj, x, reduce), out)


def test_a_mean_after_a_sum_shares_the_blocks_indices(small_blocks):
    adj = keep_transpose(_adjacency(60, 80, 400, seed=9))
    x = torch.randn(80, 7)
    for reduce in ("sum", "mean"):
        assert_fp32_close(spmm(adj, x, reduce), pyg_spmm(adj, x, reduce))
    for (_, plain), (_, mean) in zip(column_blocks(adj, "sum"), column_blocks(adj, "mean")):
        assert plain.col_indices().data_ptr() == mean.col_indices().data_ptr()
        assert plain.crow_indices().data_ptr() == mean.crow_indices().data_ptr()


def test_blocks_only_where_they_pay(monkeypatch):
    # a graph whose blocks' rows would average fewer entries than BLOCK_ROW_ENTRIES
    # multiplies in one pass: each block writes a whole output
    monkeypatch.setattr(aggregate, "BLOCK_COLUMNS", 16)
    adj = keep_transpose(_adjacency(60, 80, 400, seed=10))  # 5 blocks, 1.3 entries a row
    x = torch.randn(80, 7)
    assert column_blocks(adj) is None
    assert _kernel_calls(lambda: spmm(adj, x)) == 1
    monkeypatch.setattr(aggregate, "BLOCK_ROW_ENTRIES", 1)
    assert len(column_blocks(adj)) == 5


def test_a_piece_and_a_sampled_graph_multiply_in_one_pass(small_blocks):
    # a piece of the sequential exchange lives one round, a sampled plan's graph
    # one step: no blocks are built for them or their transposes
    whole = _adjacency(80, 60, 400, seed=8)
    piece = keep_transpose(_adjacency(60, 80, 400, seed=8), whole)
    sampled = keep_transpose(_adjacency(60, 80, 400, seed=11), blocks=False)
    for adj in (piece, sampled):
        x = torch.randn(80, 7, requires_grad=True)
        out = spmm(adj, x)
        assert _kernel_calls(lambda: torch.autograd.grad(spmm(adj, x), x,
                                                         torch.randn(60, 7))) == 2
        assert column_blocks(adj) is None and column_blocks(kept(adj)) is None
        assert_fp32_close(out, pyg_spmm(adj, x))


@pytest.mark.parametrize("conv", [SAGEConv(6, 6), GraphConv(6, 6, aggr="mean"),
                                  GCNConv(6, 6, normalize=False)])
def test_layers_aggregate_with_it_and_equal_pyg(conv):
    from pyg_dist.nn.conv import DistGCNConv
    dist_cls = {SAGEConv: DistSAGEConv, GraphConv: DistGraphConv, GCNConv: DistGCNConv}
    adj = keep_transpose(_adjacency(40, 40, 300, seed=1))
    x = torch.randn(40, 6, requires_grad=True)
    expected = conv(x, adj)
    expected_grads = torch.autograd.grad(expected.sum(), [x, *conv.parameters()])
    if isinstance(conv, GCNConv):  # DistGCNConv's forward needs a partition: its aggregation
        conv.__class__ = dist_cls[type(conv)]
        out = conv.propagate(adj, x=conv.lin(x), edge_weight=None) + conv.bias
    else:
        conv.__class__ = dist_cls[type(conv)]
        conv.project_first = False  # PyG's order: only the aggregation differs
        out = conv(x, adj)
    grads = torch.autograd.grad(out.sum(), [x, *conv.parameters()])
    assert _keeps_a_transpose(adj)
    assert_fp32_close(out, expected)
    for got, want in zip(grads, expected_grads):
        assert_fp32_close(got, want)


@pytest.mark.parametrize("block_columns", [None, 16], ids=["one pass", "column blocks"])
@pytest.mark.parametrize("model_cls", ["GraphSAGE", "GCN"])
def test_distributed_layers_keep_the_plan_s_transpose_and_equal_pyg(graph, tmp_path, model_cls,
                                                                   block_columns, monkeypatch):
    import torch_geometric.nn as gnn
    from torch_geometric.utils import to_torch_csr_tensor

    import pyg_dist
    if block_columns is not None:
        monkeypatch.setattr(aggregate, "BLOCK_COLUMNS", block_columns)
        monkeypatch.setattr(aggregate, "BLOCK_ROW_ENTRIES", 0)
    pyg_dist.partition_graph(graph, 1, root=str(tmp_path))
    pyg_dist.init()
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    torch.manual_seed(0)
    plain = getattr(gnn, model_cls)(part.num_features, 16, 2, 5)
    model = pyg_dist.nn.distribute(getattr(gnn, model_cls)(part.num_features, 16, 2, 5), part)
    model.load_state_dict(plain.state_dict())
    adj = to_torch_csr_tensor(graph.edge_index.flip(0), size=(graph.num_nodes, ) * 2)
    for step in range(2):  # the second step reuses the kept transpose
        expected, out = plain(graph.x, adj)[part.n_id], model(part.x, part.adj_t)
        assert_fp32_close(out, expected)
        for got, want in zip(torch.autograd.grad(out.square().sum(), list(model.parameters())),
                             torch.autograd.grad(expected.square().sum(),
                                                 list(plain.parameters()))):
            assert_fp32_close(got, want)
    # the graph the plan served: the partition's adj_t, or GCN's normalised one
    served = [part.adj_t] if model_cls == "GraphSAGE" else \
        [norm.adj_t for norm in model.dist_context.memo["gcn_norm"].values()]
    assert all(_keeps_a_transpose(g) for g in served)
    assert all((column_blocks(g, "mean" if model_cls == "GraphSAGE" else "sum") is not None)
               == (block_columns is not None) for g in served)
