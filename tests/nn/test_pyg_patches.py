"""What pyg_dist changes inside PyG is checked, not assumed: the whole
graph's ``gcn_norm`` reaches every layer that calls PyG's (or installing it
fails loudly), and the sequential exchange's piece softmax is seen by the
thread running the piece only."""
import importlib
import inspect
import pkgutil
import re
import threading

import pytest
import torch
import torch_geometric.nn.conv as pyg_conv
import torch_geometric.utils
from torch_geometric.nn import GATConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm as pyg_gcn_norm

from pyg_dist.comm import sequential
from pyg_dist.nn import gcn_norm
from pyg_dist.nn.spec import layer_names


def _conv_modules():
    for info in pkgutil.iter_modules(pyg_conv.__path__):
        yield importlib.import_module(f"{pyg_conv.__name__}.{info.name}")


def test_every_pyg_conv_reaches_gcn_norm_through_the_patch():
    gcn_norm.install()
    for module in _conv_modules():
        if module.__name__ == "torch_geometric.nn.conv.gcn_conv":
            continue
        assert not [k for k, v in vars(module).items() if v is pyg_gcn_norm], module
        # A call through another module's attribute, or an alias, would bypass it.
        source = inspect.getsource(module)
        assert not re.findall(r"[\w\])]\.gcn_norm\b|gcn_norm as \w+", source), module
    for name in layer_names(role="gcn_norm"):
        module = importlib.import_module(getattr(pyg_conv, name).__module__)
        assert module.gcn_norm is gcn_norm.gcn_norm, name


def test_install_refuses_a_layer_the_patch_cannot_reach(monkeypatch):
    # As a PyG release that imports gcn_norm another way in sg_conv would be.
    sg_conv = importlib.import_module(pyg_conv.SGConv.__module__)
    monkeypatch.delattr(sg_conv, "gcn_norm")
    monkeypatch.setattr(gcn_norm, "_installed", False)
    with pytest.raises(RuntimeError, match=r"give SGConv the whole graph"):
        gcn_norm.install()


def test_the_piece_softmax_is_this_thread_s_only():
    src, index = torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 1, 2])
    expected = sequential._pyg_softmax(src, index)
    piece = sequential._Softmax()
    elsewhere = []
    with sequential._routed_softmax(GATConv(4, 4, heads=2), piece):
        inside = torch_geometric.utils.softmax(src, index)
        thread = threading.Thread(
            target=lambda: elsewhere.append(torch_geometric.utils.softmax(src, index)))
        thread.start()
        thread.join()
    assert len(piece.calls) == 1  # this thread's call, unnormalised
    torch.testing.assert_close(inside / piece.calls[0][1][index], expected)
    torch.testing.assert_close(elsewhere[0], expected)  # PyG's, meanwhile
    torch.testing.assert_close(torch_geometric.utils.softmax(src, index), expected)
    assert len(piece.calls) == 1
