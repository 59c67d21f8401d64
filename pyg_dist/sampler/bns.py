"""BNS-GCN: random boundary-node sampling."""
from typing import List, Optional

import torch
from torch import Tensor

from pyg_dist.comm import HaloPlan
from pyg_dist.data import DistData
from pyg_dist.comm.stats import CommStats
from pyg_dist.sampler.base import BoundarySampler, validate_probability


class BNSSampler(BoundarySampler):
    r"""Boundary-node sampling from `"BNS-GCN: Efficient Full-Graph Training
    of Graph Convolutional Networks with Partition-Parallelism and Random
    Boundary Node Sampling" <https://arxiv.org/abs/2203.10983>`_ (Alg. 1).

    Every iteration each rank keeps each of its halo nodes independently
    with probability :math:`p` (one sample for all layers of the
    iteration), drops the edges from the other halo nodes, and scales the
    kept halo contributions by :math:`1/p`:

    .. math::
        \tilde{\mathbf{h}}_i = \sum_{j \in \mathcal{N}_{\mathrm{in}}(i)}
        w_{ji}\mathbf{h}_j + \sum_{j \in \mathcal{N}_{\mathrm{halo}}(i)}
        \frac{\chi_j}{p} w_{ji} \mathbf{h}_j,
        \qquad \chi_j \sim \mathrm{Bernoulli}(p),

    an unbiased estimate of the exact sum, mean (divided by the full
    degree) and GCN aggregation (which keeps the whole graph's degree
    normalisation). A plan is a patch of the cut edges only
    (:class:`~pyg_dist.comm.plan.EdgePatch`: new source id, weight
    :math:`\chi_j/p`), so drawing it costs :math:`O(|E_{\mathrm{cut}}|)`,
    and the iteration's graph is compact: it allocates, receives and
    aggregates only the kept halo rows and their edges, so memory and
    aggregation work fall with :math:`p` (BNS-GCN §3.2).
    Attention layers (GAT) get the sampled graph unscaled: the softmax
    renormalises over the kept neighbours. :math:`p = 1` is the exact plan
    itself; :math:`p = 0` isolates the partitions (no exchange at all).

    The owners need no list of sampled ids: the receiver's draw for the
    rows it gets from owner :math:`q` and :math:`q`'s draw for the rows it
    sends come from the same generator, seeded by ``(seed, iteration, q,
    receiver)``, over the same rows in the same order, so they agree
    without any message (the reference implementation spends one
    ``all_to_all`` of index lists per iteration on this).

    Args:
        data: this rank's partition.
        p: the probability of keeping a halo node.
        seed: the seed shared by all ranks.
    """

    def __init__(self, data: DistData, p: float = 0.1, seed: int = 0, group=None,
                 stats: Optional[CommStats] = None) -> None:
        super().__init__(data, seed, group, stats)
        self.check(p=p)
        self.p = float(p)
        self._isolated: Optional[HaloPlan] = None

    @classmethod
    def check(cls, p: float = 0.1) -> None:
        validate_probability("p", p)

    def plan(self, iteration: int) -> HaloPlan:
        if self.p == 1:
            return self.full_plan
        if self.p == 0:
            if self._isolated is None:
                none = torch.zeros(self.data.num_halo, dtype=torch.bool, device=self.device)
                self._isolated = HaloPlan.sampled(  # the inner subgraph, unscaled
                    self.data, none.new_zeros(self.data.send_index.numel()), none,
                    skip_exchange=True)
            return self._isolated
        halo_keep = self._draw(self.data.recv_counts.tolist(), iteration,
                               lambda owner: (owner, self.rank))
        send_keep = self._draw(self.data.send_counts.tolist(), iteration,
                               lambda receiver: (self.rank, receiver))
        # Only cut edges change: the plan patches them in the partition's graph.
        patch = self.cut_patch(halo_keep, halo_keep[self.cut_src], 1.0 / self.p)
        return HaloPlan.sampled(self.data, send_keep, halo_keep, patch=patch)

    def inclusion_probability(self) -> Tensor:
        return torch.full((self.data.num_halo, ), self.p, device=self.device)

    def _draw(self, counts: List[int], iteration: int, pair) -> Tensor:
        r"""Bernoulli(p) per row, one generator per (owner, receiver) pair."""
        draws = [self.uniform(c, iteration, *pair(q)) < self.p
                 for q, c in enumerate(counts) if c > 0]
        if not draws:
            return torch.zeros(0, dtype=torch.bool, device=self.device)
        return torch.cat(draws)

    def extra_repr(self) -> str:
        return f"p={self.p}"
