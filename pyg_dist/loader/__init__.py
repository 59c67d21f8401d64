r"""Loaders on top of :class:`~pyg_dist.DistData`: CM-GCN's cohesive
mini-batches: cost model, batch partitioner, per-batch layer plans."""
from pyg_dist.loader.batch_partition import (cohesive_batches, queyranne_bisection,
                                             random_batches, recursive_bisection)
from pyg_dist.loader.batch_plan import BatchGraph, batch_subgraph, sample_layers
from pyg_dist.loader.cohesive import (Batch, CohesiveBatchLoader, load_batches,
                                      save_batches)
from pyg_dist.loader.cost import CostModel, HopGraph

__all__ = ["Batch", "BatchGraph", "CohesiveBatchLoader", "batch_subgraph", "sample_layers",
           "load_batches", "save_batches", "CostModel", "HopGraph", "cohesive_batches",
           "queyranne_bisection", "random_batches", "recursive_bisection"]
