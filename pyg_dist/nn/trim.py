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

Applies to PyG's BasicGNN models whose layers run bipartitely (the
:data:`~pyg_dist.nn.spec.LAYERS` marked ``bipartite``, GCN and GAT), with
row-wise norms and no jumping knowledge; any other model runs untrimmed.
"""
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional

import torch
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.models.basic_gnn import BasicGNN

from pyg_dist.nn.spec import spec_of
from pyg_dist.utils import csr_tensor

#: Norms that act row by row (statistics over a layer's rows would change
#: with the rows computed).
ROW_WISE_NORMS = (torch.nn.Identity, torch.nn.LayerNorm, torch.nn.RMSNorm)


def trims(model: torch.nn.Module) -> bool:
    r"""Whether :obj:`model` runs trimmed per layer."""
    if not isinstance(model, BasicGNN) or type(model).forward is not BasicGNN.forward \
            or model.jk_mode is not None or hasattr(model, "lin"):
        return False
    return all(isinstance(norm, ROW_WISE_NORMS) for norm in model.norms) and all(
        isinstance(conv, (GCNConv, GATConv)) or getattr(spec_of(conv), "bipartite", False)
        for conv in model.convs)


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
    handles = []
    if first_layer is not None:
        first, block = model.convs[0], _rows(adj_t, sizes[1], sizes[0])
        first.forward = lambda *args, **kwargs: first_layer(first, block)
    for layer, conv in enumerate(model.convs):
        n_src, n_dst = sizes[layer], sizes[layer + 1]
        if layer == 0 and first_layer is not None:
            continue

        def trim(module, args, kwargs, n_dst=n_dst, n_src=n_src):
            x, graph, *rest = args
            if x.size(0) != n_src:
                raise ValueError(f"A trimmed layer got {x.size(0)} rows for {n_src} sources")
            if isinstance(module, GATConv):  # per edge: the first edges, by target
                count = int(adj_t.crow_indices()[n_dst])
                return ((x, x[:n_dst]), graph[:, :count], *rest), {**kwargs,
                                                                  "size": (n_src, n_dst)}
            if isinstance(module, GCNConv):  # normalised on the whole batch, then cut
                if module.normalize:
                    key = (module.improved, module.add_self_loops, x.dtype)
                    if key not in normalised:
                        normalised[key] = _gcn_adjacency(module, graph, x.dtype)
                    graph = normalised[key]
                    module._dist_normalize, module.normalize = True, False
                return (x, _rows(graph, n_dst, n_src), *rest), kwargs
            return ((x, x[:n_dst]), _rows(graph, n_dst, n_src), *rest), kwargs

        handles.append(conv.register_forward_pre_hook(trim, with_kwargs=True))
        handles.append(conv.register_forward_hook(_restore, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        if first_layer is not None:  # the layer's own forward again
            del model.convs[0].forward


def _restore(module, args, out) -> None:
    if module.__dict__.pop("_dist_normalize", False):
        module.normalize = True


def _gcn_adjacency(conv: GCNConv, adj: Tensor, dtype: torch.dtype) -> Tensor:
    normed, _ = gcn_norm(adj.to(dtype), None, adj.size(0), conv.improved,
                         conv.add_self_loops, conv.flow, dtype)
    return normed if normed.layout == torch.sparse_csr else normed.to_sparse_csr()
