r"""Which modules :func:`~pyg_dist.nn.distribute` makes exact, and why it
refuses the others.

A model distributes only if every one of its modules is known to compute
under ``distribute()`` what it computes in single-process PyG: PyG's own
layers by name (verified by ``tests/nn/test_layer_zoo.py``, which builds every
class of ``torch_geometric.nn.conv`` and ``torch_geometric.nn.norm``), row-wise
``torch.nn`` modules, and norms converted to whole-graph statistics
(:mod:`pyg_dist.nn.norm`). A PyG or ``torch.nn`` module of any other class,
including one a later PyG release adds, is refused before any work, naming
its path in the model and the reason (the PyG classes and their facts are
:data:`pyg_dist.nn.spec.LAYERS`). Modules of other libraries and the
user's own (a model class, a ``MessagePassing`` that only propagates node
features) are the user's to vouch for; their children are checked all the
same.
"""
from typing import Dict, List, Optional

import torch

from pyg_dist.nn.norm import NORMS
from pyg_dist.nn.spec import LAYERS, spec_of

#: torch.nn modules whose output row i depends only on input row i, by
#: definition, for node features [N, ...] (tests/nn/test_row_wise.py checks each
#: against a shuffled subset of rows).
ROW_WISE_TORCH = (
    torch.nn.Linear, torch.nn.Bilinear, torch.nn.Identity, torch.nn.Dropout,
    torch.nn.AlphaDropout, torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict,
    torch.nn.LayerNorm, torch.nn.RMSNorm, torch.nn.GroupNorm, torch.nn.Embedding,
    torch.nn.GRUCell, torch.nn.LSTMCell, torch.nn.RNNCell,
)

#: torch.nn modules that are row-wise only along some dimensions: their
#: ``dim``/``start_dim`` must not be the node dimension (0, or a negative
#: index that may resolve to it).
ROW_WISE_TORCH_ALONG = {
    torch.nn.Flatten: "start_dim", torch.nn.Unflatten: "dim", torch.nn.Softmax: "dim",
    torch.nn.Softmin: "dim", torch.nn.LogSoftmax: "dim", torch.nn.GLU: "dim",
}

#: torch.nn modules that mix rows, refused with the reason.
REFUSED_TORCH = {
    torch.nn.RNNBase: "a recurrent module runs along the node dimension as a sequence "
                      "(output row i depends on rows before it)",
    torch.nn.MultiheadAttention: "attention over all nodes would attend over this rank's "
                                 "nodes only",
    torch.nn.Softmax2d: "a softmax over dimension -3, the nodes of 3-D features",
}


def _along_rows(module: torch.nn.Module, attribute: str) -> Optional[str]:
    dim = getattr(module, attribute)
    if isinstance(dim, int) and (dim >= 1 or dim == -1):
        return None
    return (f"{attribute}={dim} may be the node dimension: its output rows would mix "
            f"nodes (use {attribute}=1 or -1)")


def refusal(module: torch.nn.Module) -> Optional[str]:
    r"""Why :obj:`module` cannot be made exact under distribute() (``None``:
    it can, possibly after conversion)."""
    cls = type(module)
    name, origin = cls.__name__, cls.__module__
    if cls in NORMS:  # converted to whole-graph statistics
        return None
    if origin.startswith("torch_geometric."):
        spec = spec_of(cls)
        if spec is not None:
            return spec.refusal
        return (f"{name} is not among the PyG classes verified under pyg_dist (see the "
                f"table of supported layers in docs/layers.md)")
    if origin.startswith("torch.nn."):
        for base, why in REFUSED_TORCH.items():
            if isinstance(module, base):
                return why
        if cls in ROW_WISE_TORCH_ALONG:
            return _along_rows(module, ROW_WISE_TORCH_ALONG[cls])
        if cls in ROW_WISE_TORCH or origin == "torch.nn.modules.activation":
            return None
        return (f"torch.nn.{name} is not verified to compute row by row on node features "
                f"(supported norms: BatchNorm1d, LayerNorm, GroupNorm, RMSNorm)")
    return None


def per_node_refusal(module: torch.nn.Module, num_nodes: int,
                     num_features: Optional[int] = None) -> Optional[str]:
    r"""Why :obj:`module` holds state per node of a graph of :obj:`num_nodes`
    nodes (``None``: it does not): an embedding table with one row per node,
    or a buffer, or a parameter, of a module of the user's own with that
    many rows (a parameter only where the graph has not as many features:
    with one-hot node features a weight's rows are its inputs). Under
    distribute() a rank's rows are its own nodes in partition order, so
    such a table indexed by row position reads other nodes' rows (and one
    indexed by original id would train every rank's copy apart)."""
    if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        if module.num_embeddings == num_nodes:
            return (f"{num_nodes} embeddings, one per node of the graph: per-node "
                    f"state is not distributed (a rank's rows are its own nodes in "
                    f"partition order); give node embeddings as input features (x)")
        return None
    if type(module).__module__.startswith(("torch.", "torch_geometric.", "pyg_dist.")):
        return None  # their tensors are weights over features, not nodes
    parameters = [] if num_features == num_nodes else module.named_parameters(recurse=False)
    for name, tensor in [*parameters, *module.named_buffers(recurse=False)]:
        if tensor.dim() >= 1 and tensor.size(0) == num_nodes:
            return (f"'{name}' has {num_nodes} rows, one per node of the graph: per-node "
                    f"state is not distributed (a rank's rows are its own nodes in "
                    f"partition order); give it as input features (x)")
    return None


def check_model(model: torch.nn.Module, num_nodes: Optional[int] = None,
                num_features: Optional[int] = None) -> None:
    r"""Raises :class:`NotImplementedError` naming every module of
    :obj:`model` that :func:`refusal` refuses, or that holds per-node state
    of a graph of :obj:`num_nodes` nodes (:func:`per_node_refusal`), with
    its path and reason."""
    def why(module: torch.nn.Module) -> Optional[str]:
        reason = refusal(module)
        if reason is None and num_nodes is not None:
            reason = per_node_refusal(module, num_nodes, num_features)
        return reason

    refused = [f"'{path or type(model).__name__}' ({type(m).__name__}): {reason}"
               for path, m in model.named_modules() if (reason := why(m)) is not None]
    if refused:
        raise NotImplementedError(
            "pyg_dist cannot distribute this model exactly:\n  " + "\n  ".join(refused))


def markdown_table() -> str:
    r"""The table of supported layers in docs/layers.md, from
    :data:`~pyg_dist.nn.spec.LAYERS` and the ``torch.nn`` tables above."""
    def names(items) -> str:
        return ", ".join(f"`{n}`" for n in sorted(items))

    def role(*roles: str) -> List[str]:
        return [name for name, spec in LAYERS.items() if spec.role in roles]

    norms = [("torch.nn." if c.__module__.startswith("torch.nn") else "") + c.__name__
             for c in NORMS]
    rows = [("exact: each propagate call fetches its halo rows",
             names(role("propagates", "gcn_norm"))),
            ("exact: statistics over the nodes of all ranks (one all-reduce)", names(norms)),
            ("exact: per node, per target (aggregations) or containers",
             names(role("row_wise")))]
    by_reason: Dict[str, list] = {}
    for name in role("refused"):
        by_reason.setdefault(LAYERS[name].refusal, []).append(name)
    rows += [(f"refused: {why}", names(group)) for why, group in by_reason.items()]
    refused_torch = {torch.nn.RNNBase: (torch.nn.RNN, torch.nn.LSTM, torch.nn.GRU)}
    rows += [(f"refused: {why}", names(f"torch.nn.{c.__name__}"
                                       for c in refused_torch.get(base, (base, ))))
             for base, why in REFUSED_TORCH.items()]
    rows.append(("refused: not verified under pyg_dist", "any other PyG or `torch.nn` class"))
    return "\n".join(["| under `distribute()` | classes |", "|---|---|"]
                     + [f"| {what} | {who} |" for what, who in rows])
