"""Every torch.nn module distribute() accepts as row-wise is row-wise by
definition: output row i depends on input row i only (checked on a shuffled
subset of rows); the modules that mix rows are refused before any work."""
import inspect

import pytest
import torch

import pyg_dist
from pyg_dist.nn.support import ROW_WISE_TORCH, ROW_WISE_TORCH_ALONG, refusal

C = 6


def _linear_stack():
    return torch.nn.Sequential(torch.nn.Linear(C, C), torch.nn.ReLU())


# One instance per entry, and how it is called on node rows x [N, C].
ENTRIES = {
    torch.nn.Linear: (lambda: torch.nn.Linear(C, 3), lambda m, x: m(x)),
    torch.nn.Bilinear: (lambda: torch.nn.Bilinear(C, C, 3), lambda m, x: m(x, x.flip(1))),
    torch.nn.Identity: (torch.nn.Identity, lambda m, x: m(x)),
    torch.nn.Dropout: (lambda: torch.nn.Dropout(0.5).eval(), lambda m, x: m(x)),
    torch.nn.AlphaDropout: (lambda: torch.nn.AlphaDropout(0.5).eval(), lambda m, x: m(x)),
    torch.nn.Sequential: (_linear_stack, lambda m, x: m(x)),
    torch.nn.ModuleList: (lambda: torch.nn.ModuleList([torch.nn.Linear(C, C)]),
                          lambda m, x: m[0](x)),
    torch.nn.ModuleDict: (lambda: torch.nn.ModuleDict({"lin": torch.nn.Linear(C, C)}),
                          lambda m, x: m["lin"](x)),
    torch.nn.LayerNorm: (lambda: torch.nn.LayerNorm(C), lambda m, x: m(x)),
    torch.nn.RMSNorm: (lambda: torch.nn.RMSNorm(C), lambda m, x: m(x)),
    torch.nn.GroupNorm: (lambda: torch.nn.GroupNorm(2, C), lambda m, x: m(x)),
    torch.nn.Embedding: (lambda: torch.nn.Embedding(10, 3),
                         lambda m, x: m((x.abs() * 10).long()[:, 0] % 10)),
    torch.nn.GRUCell: (lambda: torch.nn.GRUCell(C, 3), lambda m, x: m(x)),
    torch.nn.LSTMCell: (lambda: torch.nn.LSTMCell(C, 3), lambda m, x: m(x)[0]),
    torch.nn.RNNCell: (lambda: torch.nn.RNNCell(C, 3), lambda m, x: m(x)),
    torch.nn.Flatten: (lambda: torch.nn.Flatten(1), lambda m, x: m(x.view(-1, 2, 3))),
    torch.nn.Unflatten: (lambda: torch.nn.Unflatten(1, (2, 3)), lambda m, x: m(x)),
    torch.nn.Softmax: (lambda: torch.nn.Softmax(-1), lambda m, x: m(x)),
    torch.nn.Softmin: (lambda: torch.nn.Softmin(1), lambda m, x: m(x)),
    torch.nn.LogSoftmax: (lambda: torch.nn.LogSoftmax(-1), lambda m, x: m(x)),
    torch.nn.GLU: (lambda: torch.nn.GLU(-1), lambda m, x: m(x)),
}


# Arguments of the activations that need some.
ACTIVATION_ARGS = {torch.nn.Threshold: (0.1, 0.0), torch.nn.MultiheadAttention: (C, 2)}


def _activations():
    r"""Every module class of ``torch.nn.modules.activation`` but those
    of :data:`ENTRIES`, built with :data:`ACTIVATION_ARGS` or defaults."""
    module = torch.nn.modules.activation
    for name in module.__all__:
        cls = getattr(module, name)
        if inspect.isclass(cls) and cls not in ENTRIES:
            # eval: RReLU draws random slopes in training, like dropout
            yield cls, cls(*ACTIVATION_ARGS.get(cls, ())).eval()


def _rows_of_subset(module, call) -> None:
    torch.manual_seed(0)
    x = torch.randn(20, C)
    rows = torch.randperm(20)[:7]
    with torch.no_grad():
        torch.testing.assert_close(call(module, x)[rows], call(module, x[rows]))


def test_every_row_wise_entry_has_a_check():
    assert set(ROW_WISE_TORCH) | set(ROW_WISE_TORCH_ALONG) == set(ENTRIES)


@pytest.mark.parametrize("cls", list(ENTRIES), ids=lambda c: c.__name__)
def test_row_wise_entry_is_row_wise(cls):
    build, call = ENTRIES[cls]
    module = build()
    assert refusal(module) is None
    _rows_of_subset(module, call)


@pytest.mark.parametrize("cls,instance", list(_activations()),
                         ids=lambda v: v.__name__ if inspect.isclass(v) else "")
def test_activation_is_row_wise_or_refused(cls, instance):
    if refusal(instance) is None:
        _rows_of_subset(instance, lambda m, x: m(x))
    else:  # only those that mix rows
        assert cls in (torch.nn.MultiheadAttention, torch.nn.Softmax2d)


@pytest.mark.filterwarnings("ignore:Implicit dimension choice for softmax")
@pytest.mark.parametrize("module,call", [
    (torch.nn.GRU(C, 3), lambda m, x: m(x)[0]),
    (torch.nn.LSTM(C, 3), lambda m, x: m(x)[0]),
    (torch.nn.RNN(C, 3), lambda m, x: m(x)[0]),
    (torch.nn.Softmax(0), lambda m, x: m(x)),
    (torch.nn.Softmax(), lambda m, x: m(x.view(-1, 2, 3))),  # implicit dim 0 in 3-D
    (torch.nn.Softmax2d(), lambda m, x: m(x.view(-1, 2, 3))),
], ids=["GRU", "LSTM", "RNN", "Softmax(0)", "Softmax()", "Softmax2d"])
def test_row_mixing_module_is_refused_and_mixes_rows(module, call):
    assert refusal(module) is not None
    with pytest.raises(AssertionError):  # the check above would catch it
        _rows_of_subset(module, call)


def test_a_dimension_that_may_be_the_nodes_is_refused():
    for module in (torch.nn.Flatten(0), torch.nn.Flatten(-2), torch.nn.Unflatten(0, (2, 10)),
                   torch.nn.LogSoftmax(-2), torch.nn.GLU(0)):
        assert "may be the node dimension" in refusal(module)


class _Recurrent(torch.nn.Module):
    r"""A model that runs a GRU over the node rows after a conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        from torch_geometric.nn import SAGEConv
        self.conv = SAGEConv(channels, 8)
        self.gru = torch.nn.GRU(8, 4)

    def forward(self, x, edge_index):
        return self.gru(self.conv(x, edge_index))[0]


def _distribute_recurrent(root: str) -> str:
    import torch.distributed as dist
    part = pyg_dist.DistData.load(root, dist.get_rank())
    try:
        pyg_dist.nn.distribute(_Recurrent(part.num_features), part)
    except NotImplementedError as e:
        return str(e)
    return "accepted"


def test_distribute_refuses_a_recurrent_module(graph, tmp_path):
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    for message in pyg_dist.spawn(_distribute_recurrent, 2, (str(tmp_path), ), timeout=60):
        assert "'gru' (GRU): a recurrent module" in message
