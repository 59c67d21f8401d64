from pyg_dist.partition.book import PartitionBook
from pyg_dist.partition.partition import graph_hash, partition_graph

__all__ = ["PartitionBook", "partition_graph", "graph_hash"]
