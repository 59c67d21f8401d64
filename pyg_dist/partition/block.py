r"""ByteGNN's GNN-aware block partitioner (§4.2.3, Alg. 2): K-hop blocks
around the labelled nodes, assigned greedily to keep each block's
neighbourhood together and the train/val/test counts balanced."""
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from pyg_dist.partition.metis import symmetric_csr


def neighbourhood_blocks(edge_index: Tensor, num_nodes: int, centers: Tensor,
                         num_hops: int) -> Tensor:
    r"""Step (1): a multi-source BFS of :obj:`num_hops` hops from every
    block center (a labelled node); each node keeps the first block id that
    reaches it (the smallest center index among those reaching it in the
    same hop, so the result is deterministic), centers keep their own.
    Nodes no center reaches form one block each. Returns the block id of
    every node; centers' blocks are numbered ``0..len(centers)-1`` in the
    order given."""
    rowptr, col = symmetric_csr(edge_index, num_nodes)
    src = torch.repeat_interleave(torch.arange(num_nodes), rowptr.diff(),
                                  output_size=col.numel())
    block = torch.full((num_nodes, ), -1, dtype=torch.long)
    block[centers] = torch.arange(centers.numel())
    frontier = torch.zeros(num_nodes, dtype=torch.bool)
    frontier[centers] = True
    for _ in range(num_hops):
        reach = frontier[src] & (block[col] < 0)
        if not reach.any():
            break
        first = torch.full((num_nodes, ), centers.numel(), dtype=torch.long)
        first.scatter_reduce_(0, col[reach], block[src[reach]], reduce="amin")
        frontier = first < centers.numel()
        block[frontier] = first[frontier]
    alone = (block < 0).nonzero().view(-1)
    block[alone] = centers.numel() + torch.arange(alone.numel())
    return block


def assign_blocks(edge_index: Tensor, num_nodes: int, block: Tensor, masks: Tensor,
                  num_parts: int, weights: Optional[Sequence[float]] = None,
                  tolerance: float = 0.05) -> Tensor:
    r"""Step (2), Alg. 2: blocks, in descending order of their largest
    train/val/test count (ties: more nodes first, then block id), go to the
    part :math:`j` maximising :math:`CE[j] \cdot BS[j]`, with
    :math:`CE[j]` the edges between the block and part :math:`j` divided by
    :math:`|P_j|` and :math:`BS[j] = 1 - \sum_t w_t |P_j(t)| / C(t)` the
    balance score over the columns :math:`t` of :obj:`masks`
    (:math:`C(t)`: the mean count per part; :obj:`weights` default to
    :math:`1/T`).

    Two additions keep the result within :obj:`tolerance` of the means
    whatever the graph: a part that the block would push above
    :math:`(1 + \mathrm{tolerance}) C(t)` in any column, or above that share
    of the nodes, is not a candidate (unless no part is), and when no
    candidate shares an edge with the block, the balance score alone
    decides (the paper's product would be 0 for all); a block without
    labelled nodes goes where its edges go, or to the part with the fewest
    nodes."""
    num_cols = masks.size(1)
    weights = torch.full((num_cols, ), 1.0 / num_cols, dtype=torch.double) \
        if weights is None else torch.tensor(weights, dtype=torch.double)
    num_blocks = int(block.max()) + 1
    counts = torch.zeros(num_blocks, num_cols + 1, dtype=torch.double)
    counts.index_add_(0, block, torch.cat([masks.double(), torch.ones(num_nodes, 1,
                                                                      dtype=torch.double)], 1))
    capacity = counts.sum(0) / num_parts * (1 + tolerance) + 1
    mean = (counts[:, :num_cols].sum(0) / num_parts).clamp(min=1)
    order = sorted(range(num_blocks), key=lambda b: (-float(counts[b, :num_cols].max()),
                                                     -float(counts[b, -1]), b))
    # The edges leaving each block's nodes, grouped by block (CSR by block).
    rowptr, col = symmetric_csr(edge_index, num_nodes)
    src = torch.repeat_interleave(torch.arange(num_nodes), rowptr.diff(),
                                  output_size=col.numel())
    by_block = torch.argsort(block[src], stable=True)
    neighbours = col[by_block]
    block_ptr = torch.zeros(num_blocks + 1, dtype=torch.long)
    block_ptr[1:] = torch.bincount(block[src], minlength=num_blocks).cumsum(0)
    nodes_by_block = torch.argsort(block, stable=True)
    node_ptr = torch.zeros(num_blocks + 1, dtype=torch.long)
    node_ptr[1:] = torch.bincount(block, minlength=num_blocks).cumsum(0)
    node_part = torch.full((num_nodes, ), -1, dtype=torch.long)
    load = torch.zeros(num_parts, num_cols + 1, dtype=torch.double)
    block_part = torch.empty(num_blocks, dtype=torch.long)
    for b in order:
        parts = node_part[neighbours[block_ptr[b]:block_ptr[b + 1]]]
        cross = torch.bincount(parts[parts >= 0], minlength=num_parts).double()
        ce = cross / load[:, -1].clamp(min=1)
        bs = 1 - (weights * load[:, :num_cols] / mean).sum(1)
        fits = ((load + counts[b])[:, :num_cols] <= capacity[:num_cols]).all(1)
        candidates = fits if fits.any() else torch.ones(num_parts, dtype=torch.bool)
        connected = bool((cross[candidates] > 0).any())
        if counts[b, :num_cols].any():
            score = ce * bs if connected else bs
        else:  # no labelled node: only locality and the node count matter
            score = ce if connected else -load[:, -1]
        j = int(torch.argmax(torch.where(candidates, score, float("-inf"))))
        block_part[b] = j
        load[j] += counts[b]
        node_part[nodes_by_block[node_ptr[b]:node_ptr[b + 1]]] = j
    return block_part[block]


def block_assignment(edge_index: Tensor, num_nodes: int, masks: Tensor, num_parts: int,
                     num_hops: int = 2, tolerance: float = 0.05) -> Tensor:
    r"""The part of every node: K-hop blocks around the nodes of any column
    of :obj:`masks` (train/val/test), assigned by :func:`assign_blocks`."""
    centers = masks.any(1).nonzero().view(-1)
    block = neighbourhood_blocks(edge_index, num_nodes, centers, num_hops)
    return assign_blocks(edge_index, num_nodes, block, masks, num_parts, tolerance=tolerance)


def khop_remote_volume(edge_index: Tensor, num_nodes: int, assignment: Tensor,
                       seeds: Tensor, num_hops: int) -> List[int]:
    r"""Per part, how many nodes the full :obj:`num_hops`-hop in-neighbourhood
    of its :obj:`seeds` (a node mask) holds that other parts own: the remote
    rows a K-hop sampler may have to fetch (the bound fan-outs sample
    from)."""
    src, dst = edge_index
    volume = []
    for p in range(int(assignment.max()) + 1):
        reached = seeds & (assignment == p)
        for _ in range(num_hops):
            grown = reached.clone()
            grown[src[reached[dst]]] = True
            reached = grown
        volume.append(int((reached & (assignment != p)).sum()))
    return volume
