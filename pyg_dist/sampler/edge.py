"""Edge-sampling baselines of the BNS-GCN ablation (Table 9): DropEdge and
boundary edge sampling."""
from typing import Optional

import torch

from pyg_dist.comm import HaloPlan
from pyg_dist.data import DistData
from pyg_dist.comm.stats import CommStats
from pyg_dist.sampler.base import BoundarySampler, validate_probability


class _EdgeSampler(BoundarySampler):
    r"""Keeps edge :math:`e` with a fixed probability and scales it by its
    inverse; a halo row travels iff one of its edges survives."""

    cut_only = False  # whether only cut edges are ever dropped

    def __init__(self, data: DistData, p: float = 0.1, seed: int = 0, group=None,
                 stats: Optional[CommStats] = None) -> None:
        super().__init__(data, seed, group, stats)
        self.check(p=p)
        self.p = float(p)

    @classmethod
    def check(cls, p: float = 0.1) -> None:
        validate_probability("p", p, allow_zero=False)

    def plan(self, iteration: int) -> HaloPlan:
        if self.p == 1:
            return self.full_plan
        return self.sample_edges(iteration, self.cut_only)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class DropEdgeSampler(_EdgeSampler):
    r"""DropEdge over all local edges, dropping as many edges in expectation
    as :class:`~pyg_dist.sampler.BNSSampler` at the same :math:`p` (which
    drops the fraction :math:`1-p` of the cut edges): each edge survives
    with probability :math:`q = 1 - (1-p)\,|E_{\mathrm{cut}}|/|E|` and is
    scaled by :math:`1/q`. A halo row must still travel if any of its
    edges survives, which is why DropEdge saves little communication."""

    def __init__(self, data: DistData, p: float = 0.1, seed: int = 0, group=None,
                 stats: Optional[CommStats] = None) -> None:
        super().__init__(data, p, seed, group, stats)
        num_edges = max(self.halo_edge.numel(), 1)
        q = 1.0 - (1.0 - self.p) * int(self.halo_edge.sum()) / num_edges
        self.set_edge_probability(torch.full_like(self.halo_edge, q, dtype=torch.double))


class BoundaryEdgeSampler(_EdgeSampler):
    r"""Boundary edge sampling (BES): each cut edge (from a halo source)
    survives independently with probability :math:`p` and is scaled by
    :math:`1/p`; inner edges are all kept. It drops exactly as many edges
    in expectation as :class:`~pyg_dist.sampler.BNSSampler`, but per edge
    rather than per node, so far fewer halo rows lose all their edges."""

    cut_only = True

    def __init__(self, data: DistData, p: float = 0.1, seed: int = 0, group=None,
                 stats: Optional[CommStats] = None) -> None:
        super().__init__(data, p, seed, group, stats)
        one = torch.ones((), dtype=torch.double, device=self.device)
        self.set_edge_probability(torch.where(self.halo_edge, one * self.p, one))
