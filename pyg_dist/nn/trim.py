r"""Per-layer trimming of a sampled mini-batch (DGL's blocks, PyG's
``trim_to_layer``): layer :math:`\ell` of an :math:`L`-layer model computes
only the rows layer :math:`\ell + 1` reads.

A batch of the neighbour loader lists its nodes hop by hop (the seeds, then
each hop's new nodes) and its edges by target. The rows layer :math:`\ell`
must output are the nodes within :math:`L - 1 - \ell` hops of the seeds, a
prefix of :math:`n^{dst}_\ell` rows, and they read the nodes within
:math:`L - \ell` hops, a prefix of :math:`n^{src}_\ell` rows; their in-edges
are the first rows of the batch's CSR ``adj_t``. So each layer runs
bipartitely on ``(x, x[:n_dst])`` over the ``[n_dst, n_src]`` block of
``adj_t`` (GCN: of its normalised ``adj_t``, so the degrees stay the whole
batch's), and the seeds' outputs equal the untrimmed model's. The last
layer outputs the seeds' rows only.

Applies to PyG's BasicGNN models whose layers run trimmed (the
:data:`~pyg_dist.nn.spec.LAYERS` with a ``trim``), with row-wise norms and
no jumping knowledge; any other model runs untrimmed.
"""
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional

import torch
from torch import Tensor
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.models.basic_gnn import BasicGNN

from pyg_dist.nn.spec import ROW_WISE_NORMS, spec_of
from pyg_dist.utils import csr_tensor


def trims(model: torch.nn.Module) -> bool:
    r"""Whether :obj:`model` runs trimmed per layer."""
    if not isinstance(model, BasicGNN) or type(model).forward is not BasicGNN.forward \
            or model.jk_mode is not None or hasattr(model, "lin"):
        return False
    return all(isinstance(norm, ROW_WISE_NORMS) for norm in model.norms) and all(
        getattr(spec_of(conv), "trim", None) is not None for conv in model.convs)


def layer_sizes(num_sampled_nodes: List[int], num_layers: int) -> List[int]:
    r"""The input rows, then the rows each layer outputs
    (:math:`n^{dst}_\ell`, which layer :math:`\ell + 1` reads)."""
    hops = len(num_sampled_nodes) - 1
    if hops != num_layers:
        raise ValueError(f"A batch sampled {hops} hops for a model of {num_layers} layers")
    ends = torch.tensor(num_sampled_nodes).cumsum(0).tolist()
    return [ends[num_layers - layer] for layer in range(num_layers + 1)]


def _rows(adj: Tensor, rows: int, cols: int) -> Tensor:
    r"""The first :obj:`rows` rows of the CSR :obj:`adj`, as ``[rows, cols]``."""
    crow = adj.crow_indices()[:rows + 1]
    end = int(crow[-1])
    return csr_tensor(crow, adj.col_indices()[:end], adj.values()[:end], (rows, cols))


@contextmanager
def trimmed(model: BasicGNN, adj_t: Optional[Tensor], num_sampled_nodes: List[int],
            first_layer: Optional[Callable[[torch.nn.Module, Tensor], Tensor]] = None
            ) -> Iterator[None]:
    r"""Inside the block, ``model(x, adj_t)`` (or ``model(x, edge_index)``
    for a model that takes an ``edge_index``, sorted by target) runs
    trimmed per layer on the batch of CSR :obj:`adj_t` described by
    :obj:`num_sampled_nodes` (see the module).

    With :obj:`first_layer`, the first layer's output is
    ``first_layer(conv, block)`` (:obj:`block`: the rows of :obj:`adj_t` it
    outputs) instead of the layer's forward, which then reads no ``x``
    (the neighbour loader's :class:`~pyg_dist.loader.neighbor.RowsPlan`)."""
    sizes = layer_sizes(num_sampled_nodes, len(model.convs))
    normalised: Dict[tuple, Tensor] = {}  # GCN's adj_t, normalised once per batch
    unnormalised: List[torch.nn.Module] = []  # GCN layers given it, their normalize off
    handles = []
    for layer, conv in enumerate(model.convs):
        n_src, n_dst = sizes[layer], sizes[layer + 1]
        if layer == 0 and first_layer is not None:
            continue
        how = spec_of(conv).trim

        def trim(module, args, kwargs, n_dst=n_dst, n_src=n_src, how=how):
            x, graph, *rest = args
            if x.size(0) != n_src:
                raise ValueError(f"A trimmed layer got {x.size(0)} rows for {n_src} sources")
            if how == "edges":  # per edge: the first edges, by target
                count = int(adj_t.crow_indices()[n_dst])
                return ((x, x[:n_dst]), graph[:, :count], *rest), {**kwargs,
                                                                  "size": (n_src, n_dst)}
            if how == "normalised":  # normalised on the whole batch, then cut
                if module.normalize:
                    key = (module.improved, module.add_self_loops, x.dtype)
                    if key not in normalised:
                        normalised[key] = _gcn_adjacency(module, graph, x.dtype)
                    graph = normalised[key]
                    module.normalize = False  # until the layer's forward returns
                    unnormalised.append(module)
                return (x, _rows(graph, n_dst, n_src), *rest), kwargs
            return ((x, x[:n_dst]), _rows(graph, n_dst, n_src), *rest), kwargs

        def restore(module, args, out) -> None:
            if any(module is m for m in unnormalised):
                unnormalised.remove(module)
                module.normalize = True

        handles.append(conv.register_forward_pre_hook(trim, with_kwargs=True))
        handles.append(conv.register_forward_hook(restore, always_call=True))
    first = model.convs[0]
    if first_layer is not None:  # the first layer's output comes from first_layer
        model.convs[0] = _GivenOutput(first, first_layer, _rows(adj_t, sizes[1], sizes[0]))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        model.convs[0] = first


class _GivenOutput(torch.nn.Module):
    r"""Stands in for a model's first layer while its output is
    ``compute(layer, block)``: it reads no ``x``."""

    def __init__(self, layer: torch.nn.Module, compute: Callable, block: Tensor) -> None:
        super().__init__()
        # a tuple, not a submodule: the model's parameters keep their names
        self.given = (layer, compute, block)

    def forward(self, *args, **kwargs) -> Tensor:
        layer, compute, block = self.given
        return compute(layer, block)


def _gcn_adjacency(conv: torch.nn.Module, adj: Tensor, dtype: torch.dtype) -> Tensor:
    normed, _ = gcn_norm(adj.to(dtype), None, adj.size(0), conv.improved,
                         conv.add_self_loops, conv.flow, dtype)
    return normed if normed.layout == torch.sparse_csr else normed.to_sparse_csr()
