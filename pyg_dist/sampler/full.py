"""The exact plan: every halo row, every edge."""
from pyg_dist.comm import HaloPlan
from pyg_dist.sampler.base import BoundarySampler


class FullSampler(BoundarySampler):
    r"""Vanilla partition parallelism: every iteration exchanges every halo
    row (:meth:`~pyg_dist.comm.HaloPlan.full`)."""
    samples = False

    def plan(self, iteration: int) -> HaloPlan:
        return self.full_plan
