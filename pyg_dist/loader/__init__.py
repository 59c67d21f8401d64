r"""Loaders on top of :class:`~pyg_dist.DistData`: CM-GCN's cohesive
mini-batches (cost model, batch partitioner, per-batch layer plans) and
DistDGL/ByteGNN's neighbour-sampled mini-batches (feature store, sampler,
pipelined sampling)."""
from pyg_dist.loader.batch_partition import (cohesive_batches, queyranne_bisection,
                                             random_batches, recursive_bisection)
from pyg_dist.loader.batch_plan import BatchGraph, batch_subgraph, sample_layers
from pyg_dist.loader.cohesive import (Batch, CohesiveBatchLoader, load_batches,
                                      save_batches)
from pyg_dist.loader.cost import CostModel, HopGraph
from pyg_dist.loader.feature_store import DistFeatureStore
from pyg_dist.loader.neighbor_loader import DistNeighborLoader, split_seeds
from pyg_dist.loader.neighbor_sampler import DistNeighborSampler, sample_neighbors
from pyg_dist.loader.pipeline import SamplerPool

__all__ = ["Batch", "BatchGraph", "CohesiveBatchLoader", "batch_subgraph", "sample_layers",
           "load_batches", "save_batches", "CostModel", "HopGraph", "cohesive_batches",
           "queyranne_bisection", "random_batches", "recursive_bisection",
           "DistFeatureStore", "DistNeighborLoader", "DistNeighborSampler", "SamplerPool",
           "sample_neighbors", "split_seeds"]
