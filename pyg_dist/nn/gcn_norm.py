r"""PyG's ``gcn_norm`` answered with the whole graph's degrees inside
distributed layers.

SGConv, SSGConv, APPNP, TAGConv, GCN2Conv, MixHopConv, LGConv, FAConv,
EGConv, PDNConv (any layer of :mod:`torch_geometric.nn.conv` that calls
``gcn_norm`` in its forward) normalise the graph they are given. On a
partition that graph is the rank's local one, whose halo nodes miss most of
their edges. While a distributed layer runs its forward, the ``gcn_norm``
these modules call is :meth:`HaloContext.gcn_norm
<pyg_dist.nn.HaloContext.gcn_norm>`: the same weights

.. math::
    \frac{w_{ji}}{\sqrt{\hat d_j \hat d_i}}, \qquad
    \hat d_i = \sum_{j \in \mathcal N(i) \cup \{i\}} w_{ji}

with the degrees of the whole graph (a halo degree comes from its owner),
on the current plan's edges (a sampled plan's :math:`1/p` included), in the
form the layer passed: a CSR ``adj_t`` for a sparse input, ``(edge_index,
edge_weight)`` for an ``edge_index``. Each of the layer's K propagate calls
then fetches the current halo rows: K exchanges, counted under their own
keys, each served by the model's sampler plan and cache. Outside a
distributed layer the original ``gcn_norm`` runs unchanged.
"""
import importlib
import pkgutil
import threading
from typing import Optional

import torch
import torch_geometric
import torch_geometric.nn.conv as pyg_conv
from torch import Tensor
from torch_geometric.nn.conv.gcn_conv import gcn_norm as pyg_gcn_norm
from torch_geometric.utils import is_torch_sparse_tensor

from pyg_dist.nn.conv.gcn_conv import whole_graph_norm
from pyg_dist.nn.spec import layer_names

_running = threading.local()  # the HaloContext of the layer running in this thread


def enter(ctx) -> None:
    r"""A distributed layer's forward starts (nested layers stack)."""
    stack = getattr(_running, "stack", None)
    if stack is None:
        stack = _running.stack = []
    stack.append(ctx)


def leave() -> None:
    stack = getattr(_running, "stack", None)
    if stack:
        stack.pop()


def _current():
    stack = getattr(_running, "stack", None)
    return stack[-1] if stack else None


def gcn_norm(edge_index, edge_weight: Optional[Tensor] = None, num_nodes: Optional[int] = None,
             improved: bool = False, add_self_loops: bool = True,
             flow: str = "source_to_target", dtype: Optional[torch.dtype] = None):
    r"""PyG's ``gcn_norm`` signature; inside a distributed layer, the whole
    graph's normalisation of the current plan (see the module docstring)."""
    ctx = _current()
    if ctx is None:
        return pyg_gcn_norm(edge_index, edge_weight, num_nodes, improved, add_self_loops,
                            flow, dtype)
    if flow != "source_to_target":
        raise NotImplementedError("distributed gcn_norm supports flow='source_to_target'")
    sparse = is_torch_sparse_tensor(edge_index)
    adj_t, _ = whole_graph_norm(ctx, edge_index, edge_weight, improved, add_self_loops,
                                dtype or torch.float)
    if not isinstance(adj_t, Tensor) or adj_t.layout != torch.sparse_csr:
        return adj_t, _  # a bipartite edge_index given by the caller, normalised
    ctx.normalised[adj_t] = ctx.plan  # HaloContext.adjacency checks it is reused on its plan
    if sparse:
        return adj_t, None
    dst = torch._convert_indices_from_csr_to_coo(adj_t.crow_indices(), adj_t.col_indices())[0]
    edge_index = torch.stack([adj_t.col_indices(), dst])
    ctx.normalised[edge_index] = ctx.plan
    return edge_index, adj_t.values()


_installed = False
# Where PyG defines gcn_norm (its GCNConv is DistGCNConv's base, which
# normalises with the whole graph itself).
_DEFINING_MODULE = "torch_geometric.nn.conv.gcn_conv"


def install() -> None:
    r"""Points every PyG conv module that imported ``gcn_norm`` (under any
    name) at :func:`gcn_norm`, once; raises :class:`RuntimeError` if a layer
    of role ``"gcn_norm"`` in :data:`~pyg_dist.nn.spec.LAYERS` lives in a
    module this did not reach (a PyG release that reaches ``gcn_norm`` another way would
    otherwise normalise with the partition's degrees, silently)."""
    global _installed
    if _installed:
        return
    covered = set()
    for info in pkgutil.iter_modules(pyg_conv.__path__):
        module = importlib.import_module(f"{pyg_conv.__name__}.{info.name}")
        if module.__name__ == _DEFINING_MODULE:
            continue
        for name, value in list(vars(module).items()):
            if value is pyg_gcn_norm:
                setattr(module, name, gcn_norm)
        if any(value is gcn_norm for value in vars(module).values()):
            covered.add(module.__name__)
    missed = sorted(name for name in layer_names(role="gcn_norm") if hasattr(pyg_conv, name)
                    and getattr(pyg_conv, name).__module__ not in covered)
    if missed:
        raise RuntimeError(
            f"pyg_dist cannot give {', '.join(missed)} the whole graph's gcn_norm: their "
            f"modules do not import torch_geometric's gcn_norm by name in this PyG "
            f"release ({torch_geometric.__version__}); they would normalise with the "
            f"partition's degrees")
    _installed = True
