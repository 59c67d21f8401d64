"""Node-to-part assignment backends (METIS through pymetis or PyG's
compiled libraries, and uniform random)."""
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from pyg_dist.utils import gather_neighbours
from pyg_dist.utils.sparse import row_pointers

OBJECTIVES = ("vol", "cut")


def symmetric_csr(edge_index: Tensor, num_nodes: int) -> tuple:
    r"""Returns the CSR (``rowptr``, ``col``) of the undirected, loop-free
    version of the graph, which is what METIS requires."""
    row, col = edge_index
    keep = row != col
    row, col = row[keep], col[keep]
    row, col = torch.cat([row, col]), torch.cat([col, row])
    key = torch.unique(row * num_nodes + col)  # sorted, duplicates removed
    row, col = key // num_nodes, key % num_nodes
    return row_pointers(row, num_nodes), col


def metis_assignment(
    edge_index: Tensor,
    num_nodes: int,
    num_parts: int,
    objective: str = "vol",
    balance_masks: Optional[Tensor] = None,
    seed: int = 0,
    tolerance: float = 0.03,
) -> Tensor:
    r"""Partitions the graph with METIS' k-way algorithm (recursive
    bisection cannot minimise the communication volume, ``objtype=vol``).

    ``balance_masks`` is a ``[num_nodes, k]`` boolean matrix whose columns
    (e.g. train/val/test) must each be spread evenly over the parts, as
    DistDGL's multi-constraint partitioning does. pymetis passes a single
    balance constraint to METIS, so the columns are balanced by
    :func:`rebalance` after METIS, moving the fewest, best-connected nodes
    until every column is within :obj:`tolerance` of the mean (METIS' own
    default imbalance tolerance).
    """
    if num_parts == 1:
        return torch.zeros(num_nodes, dtype=torch.long)
    rowptr, col = symmetric_csr(edge_index, num_nodes)
    assignment = metis_csr_assignment(rowptr.numpy(), col.numpy(), num_parts, objective, seed)
    if balance_masks is not None:
        rebalance(assignment, rowptr, col, balance_masks, num_parts, tolerance)
    return assignment


def metis_csr_assignment(rowptr: np.ndarray, col: np.ndarray, num_parts: int,
                         objective: str = "vol", seed: int = 0) -> Tensor:
    r"""METIS' k-way partition of the symmetric, loop-free CSR graph
    (``rowptr``, ``col``; ``col`` may be memory-mapped)."""
    try:
        import pymetis
    except ImportError:  # a required dependency, but degrade gracefully
        return _compiled_metis(torch.from_numpy(rowptr),
                               torch.from_numpy(np.asarray(col, dtype=np.int64)), num_parts)

    objtype = pymetis.ObjType.VOL if objective == "vol" else pymetis.ObjType.CUT
    options = pymetis.Options(seed=int(seed), objtype=int(objtype))
    _, parts = pymetis.part_graph(
        num_parts,
        pymetis.CSRAdjacency(adj_starts=rowptr, adjacent=col),
        recursive=False,
        options=options,
    )
    return torch.as_tensor(np.asarray(parts), dtype=torch.long)


def rebalance(assignment: Tensor, rowptr: Tensor, col: Tensor, masks: Tensor,
              num_parts: int, tolerance: float = 0.03) -> Tensor:
    r"""Moves nodes (in place) until, for every mask column :math:`c`, each
    part holds at most :math:`\lceil (1 + \epsilon) |c| / K \rceil` of its
    nodes. Nodes leave over-full parts in order of gain (neighbours in the
    destination minus neighbours at home), to the under-full part holding
    most of their neighbours, so the cut grows as little as possible."""
    deg = rowptr[1:] - rowptr[:-1]
    for mask in masks.t().bool():
        target = float(mask.sum()) / num_parts
        cap = int(np.ceil(target * (1 + tolerance)))
        counts = torch.bincount(assignment[mask], minlength=num_parts)
        if counts.max() <= cap:
            continue
        over = counts > cap
        nodes = (mask & over[assignment]).nonzero().view(-1)
        # Neighbour histogram over parts for every candidate node.
        src = torch.repeat_interleave(torch.arange(nodes.numel()), deg[nodes])
        nbr = gather_neighbours(rowptr, col, nodes)
        hist = torch.zeros(nodes.numel(), num_parts)
        hist.index_put_((src, assignment[nbr]), torch.ones(src.numel()), accumulate=True)
        home = hist[torch.arange(nodes.numel()), assignment[nodes]]
        hist[:, over] = -float("inf")  # only under-full parts receive
        best_gain, best_part = (hist - home.unsqueeze(1)).max(1)
        room = (cap - counts).clamp(min=0)
        excess = (counts - cap).clamp(min=0)
        for i in torch.argsort(best_gain, descending=True, stable=True).tolist():
            v, src_part = int(nodes[i]), int(assignment[nodes[i]])
            if excess[src_part] == 0:
                continue
            dst = int(best_part[i])
            if room[dst] == 0:  # preferred part full: the emptiest one
                dst = int(torch.argmax(room))
            assignment[v] = dst
            excess[src_part] -= 1
            room[dst] -= 1
            if int(excess.sum()) == 0:
                break
    return assignment


def random_assignment(num_nodes: int, num_parts: int, seed: int = 0) -> Tensor:
    r"""Assigns nodes to parts uniformly at random with equal part sizes."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_nodes, generator=gen)
    parts = torch.empty(num_nodes, dtype=torch.long)
    parts[perm] = torch.arange(num_nodes) % num_parts
    return parts


def _compiled_metis(rowptr: Tensor, col: Tensor, num_parts: int) -> Tensor:
    r"""METIS from pyg-lib or torch-sparse when pymetis is missing (both
    only expose the edge-cut objective)."""
    try:
        import pyg_lib
        return pyg_lib.partition.metis(rowptr, col, num_parts)
    except ImportError:
        pass
    try:
        import torch_sparse  # noqa: F401
    except ImportError:
        raise ImportError("METIS partitioning needs 'pymetis' "
                          "(pip install pymetis)") from None
    return torch.ops.torch_sparse.partition(rowptr, col, None, num_parts, False)
