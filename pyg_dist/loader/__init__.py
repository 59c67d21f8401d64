r"""Loaders on top of :class:`~pyg_dist.DistData`: CM-GCN's cohesive
mini-batches (cost model and batch partitioner so far)."""
from pyg_dist.loader.batch_partition import (cohesive_batches, queyranne_bisection,
                                             random_batches, recursive_bisection)
from pyg_dist.loader.cost import CostModel, HopGraph

__all__ = ["CostModel", "HopGraph", "cohesive_batches", "queyranne_bisection",
           "random_batches", "recursive_bisection"]
