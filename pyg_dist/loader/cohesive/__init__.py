r"""CM-GCN's cohesive mini-batches: the cost model, the batch partitioner,
per-batch layer plans, balanced workloads and the loader."""
from pyg_dist.loader.cohesive.batch_partition import (cohesive_batches, queyranne_bisection,
                                                      random_batches, recursive_bisection)
from pyg_dist.loader.cohesive.batch_plan import BatchGraph, batch_subgraph, sample_layers
from pyg_dist.loader.cohesive.cost import CostModel, HopGraph
from pyg_dist.loader.cohesive.loader import (BATCHES_FILE, CohesiveBatchLoader,
                                             gather_cohesive_batches, load_batch_cost,
                                             load_batches, save_batches)

__all__ = ["BATCHES_FILE", "BatchGraph", "CohesiveBatchLoader", "CostModel", "HopGraph",
           "batch_subgraph", "cohesive_batches", "gather_cohesive_batches", "load_batch_cost",
           "load_batches", "queyranne_bisection", "random_batches", "recursive_bisection",
           "sample_layers", "save_batches"]
