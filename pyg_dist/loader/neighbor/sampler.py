r"""DistDGL's distributed neighbour sampler: fan-out sampling over
partitions whose owners hold the whole in-neighbourhood of their nodes."""
from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm.request import OwnerRequest
from pyg_dist.data import DistData
from pyg_dist.comm.stats import CommStats
from pyg_dist.partition.book import owner_of
from pyg_dist.utils import mix_seeds


def sample_neighbors(rowptr: Tensor, col: Tensor, targets: Tensor, num: int,
                     generator: torch.Generator) -> Tuple[Tensor, Tensor]:
    r"""Samples, for every node in :obj:`targets`, :math:`\min(k, d_i)` of
    its :math:`d_i` in-neighbours uniformly without replacement (all of them
    when :obj:`num` is -1), from the CSR graph ``(rowptr, col)``.

    Returns the count per target and the sampled ``col`` entries,
    concatenated target by target. Targets with more than :math:`k`
    neighbours draw their :math:`k` neighbour positions with Floyd's
    algorithm, all targets at once: step :math:`i` draws :math:`t` uniform
    in :math:`[0, d - k + i]` and takes it, or :math:`d - k + i` if it was
    taken, so every :math:`k`-subset is equally likely, at :math:`O(k)`
    vector operations over the targets, never over their neighbours."""
    start = rowptr.index_select(0, targets)
    deg = rowptr.index_select(0, targets + 1) - start
    counts = deg if num < 0 else deg.clamp(max=num)
    total = int(counts.sum())
    out_ptr = counts.cumsum(0) - counts
    segment = torch.repeat_interleave(torch.arange(targets.numel()), counts,
                                      output_size=total)
    # the first counts[i] neighbours...
    pos = torch.arange(total) - out_ptr.index_select(0, segment)
    big = (deg > counts).nonzero().view(-1)
    if big.numel():  # ...unless there are more than k of them
        d = deg[big]
        chosen = torch.empty(big.numel(), num, dtype=torch.long)
        for i in range(num):
            last = d - num + i
            t = (torch.rand(big.numel(), generator=generator, dtype=torch.double)
                 * (last + 1)).long()
            taken = (chosen[:, :i] == t.unsqueeze(1)).any(1)
            chosen[:, i] = torch.where(taken, last, t)
        pos[(out_ptr[big].unsqueeze(1) + torch.arange(num)).view(-1)] = chosen.view(-1)
    return counts, col.index_select(0, start.index_select(0, segment) + pos)


class SampledSubgraph(NamedTuple):
    r"""A mini-batch's sampled graph, laid out as PyG's ``NeighborLoader``
    does: nodes in order of discovery (seeds first, then each hop's new
    nodes), ``edge_index`` local (row: sampled neighbour, col: the node it
    was sampled for), edges hop by hop and sorted by (col, row)."""
    node: Tensor  # relabelled global ids
    edge_index: Tensor
    num_sampled_nodes: List[int]
    num_sampled_edges: List[int]


class PartitionNeighborSampler:
    r"""Samples the :math:`K`-hop neighbourhood of seed nodes with a fan-out
    per hop (DistDGL §4.1.4; GraphSAGE's sampler). Hop :math:`\ell` samples
    the in-neighbours of the nodes hop :math:`\ell - 1` added (the seeds at
    hop 0), as PyG's ``NeighborLoader``: every rank asks the owners of its
    frontier nodes, with one :class:`~pyg_dist.comm.request.OwnerRequest`
    per hop, and each owner samples from its partition (which holds every
    in-edge of its inner nodes). Frontier nodes a rank owns itself are
    sampled without the network.

    The draws depend only on :obj:`seed`, the batch :obj:`key` given to
    :meth:`sample`, the hop and the owner, so a batch is the same whether
    it is sampled in the training loop or in a background worker.
    :meth:`sample` is collective over its group.
    """

    def __init__(self, data: DistData, num_neighbors: List[int], seed: int = 0) -> None:
        self.check(num_neighbors)
        self.num_neighbors = list(num_neighbors)
        self.seed = seed
        self.partptr = data.partptr.cpu()
        self.start = int(self.partptr[data.rank])
        src, dst = data.edge_index.cpu()  # sorted by target
        self.rowptr = torch.cat([torch.zeros(1, dtype=torch.long),
                                 torch.bincount(dst, minlength=data.num_inner).cumsum(0)])
        self.col = data.global_id.cpu()[src]  # in-neighbours as global ids

    @staticmethod
    def check(num_neighbors: List[int]) -> None:
        if not num_neighbors or any(k == 0 or k < -1 for k in num_neighbors):
            raise ValueError(f"fan-outs must be a non-empty list of integers >= 1 or -1 "
                             f"(all neighbours) (got {num_neighbors})")

    def sample(self, seeds: Tensor, key: int, group=None,
               stats: Optional[CommStats] = None) -> SampledSubgraph:
        r"""The sampled subgraph of the (distinct, relabelled global)
        :obj:`seeds`; :obj:`key` numbers the batch (equal keys draw the
        same sample). Requests go over :obj:`group`, counted in
        :obj:`stats` under ``sample``."""
        node = seeds.cpu()
        frontier = torch.arange(node.numel())  # batch-local ids of the last hop's nodes
        rows, cols = [], []
        num_nodes, num_edges = [node.numel()], []
        for hop, num in enumerate(self.num_neighbors):
            ids = node.index_select(0, frontier)
            request = OwnerRequest(ids, owner_of(ids, self.partptr), group, stats, "sample")
            generator = torch.Generator().manual_seed(
                mix_seeds(self.seed, key, hop, dist.get_rank(group)))
            counts, values = sample_neighbors(self.rowptr, self.col,
                                              request.received - self.start, num, generator)
            counts, neighbours = request.reply_ragged(counts, values)
            known = node.numel()
            node, src = _append_new(node, neighbours)
            rows.append(src)
            cols.append(frontier.index_select(0, request.order).repeat_interleave(counts))
            frontier = torch.arange(known, node.numel())
            num_nodes.append(frontier.numel())
            num_edges.append(src.numel())
        row, col = torch.cat(rows), torch.cat(cols)
        # Sorted by (node, neighbour): still hop by hop, as each hop's nodes
        # are a later id range, and ready for a CSR adj_t. The keys are
        # distinct (equal keys would be equal edges), so any sort gives the
        # same edges; 32-bit keys where they fit sort in about 60% of the
        # time of 64-bit ones.
        key = col * node.numel() + row
        if node.numel() ** 2 <= torch.iinfo(torch.int32).max:
            key = key.int()
        order = torch.argsort(key)
        edge_index = torch.stack([row.index_select(0, order), col.index_select(0, order)])
        return SampledSubgraph(node, edge_index, num_nodes, num_edges)


#: :func:`_append_new` maps ids through a dense table when their span is at
#: most this many times the ids it is given (its cost is then of the order of
#: theirs), and sorts them otherwise.
DENSE_SPAN = 4


def _append_new(node: Tensor, candidates: Tensor) -> Tuple[Tensor, Tensor]:
    r"""Appends the :obj:`candidates` not yet in :obj:`node` (distinct ids),
    in order of first occurrence; returns the new node list and every
    candidate's position in it.

    Both forms find each id's first occurrence :math:`f_i` in
    ``cat([node, candidates])`` (of length :math:`m`): through a table
    indexed by id where the ids span at most :data:`DENSE_SPAN` :math:`m`
    values (:math:`O(m + \mathrm{span})`, no sort; a batch of a graph not
    much larger than the batch), else through ``torch.unique`` (a sort). An
    element is new when it is its id's first occurrence and past
    :obj:`node`; new ids are numbered in the order of their first
    occurrence, so both forms return the same tensors."""
    both = torch.cat([node, candidates])
    if both.numel() == 0:
        return node, candidates.clone()
    low, high = both.aminmax()
    if int(high) - int(low) + 1 <= DENSE_SPAN * both.numel():
        return _append_new_dense(node, both, int(low), int(high) - int(low) + 1)
    return _append_new_sorted(node, both)


def _append_new_dense(node: Tensor, both: Tensor, low: int, span: int
                      ) -> Tuple[Tensor, Tensor]:
    known, index = node.numel(), torch.arange(both.numel())
    slot = both - low
    first = torch.full((span, ), both.numel(), dtype=torch.long)
    first.scatter_reduce_(0, slot, index, "amin")
    first = first.index_select(0, slot)  # per element: its id's first occurrence
    new = first == index
    new[:known] = False
    # the new ids up to each element, so a new id's number is at its first occurrence
    number = new.cumsum(0) + (known - 1)
    position = torch.where(first < known, first, number.index_select(0, first))
    return torch.cat([node, both[new]]), position[known:]


def _append_new_sorted(node: Tensor, both: Tensor) -> Tuple[Tensor, Tensor]:
    unique, inverse = torch.unique(both, return_inverse=True)
    first = torch.full((unique.numel(), ), both.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(both.numel()), "amin")
    new = (first >= node.numel()).nonzero().view(-1)
    new = new[torch.argsort(first[new])]
    position = first.clone()  # an existing node's first occurrence is its position
    position[new] = torch.arange(node.numel(), node.numel() + new.numel())
    return torch.cat([node, unique.index_select(0, new)]), \
        position.index_select(0, inverse[node.numel():])
