r"""DistDGL / ByteGNN neighbour-sampled mini-batches: the owners' sampler,
the feature store, pipelined sampling workers and the loader."""
from pyg_dist.loader.neighbor.feature_store import PartitionFeatureStore
from pyg_dist.loader.neighbor.loader import PartitionNeighborLoader, split_seeds
from pyg_dist.loader.neighbor.pipeline import SamplerPool
from pyg_dist.loader.neighbor.rows_plan import RowsPlan, projects_on_owners
from pyg_dist.loader.neighbor.sampler import PartitionNeighborSampler, sample_neighbors

__all__ = ["PartitionFeatureStore", "PartitionNeighborLoader", "PartitionNeighborSampler",
           "RowsPlan", "SamplerPool", "projects_on_owners", "sample_neighbors",
           "split_seeds"]
