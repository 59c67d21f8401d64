r"""pyg_dist: partition-parallel full-graph training for PyTorch Geometric."""

from pyg_dist.version import __version__  # noqa: E402
from pyg_dist import nn  # noqa: E402
from pyg_dist.data import DistData  # noqa: E402
from pyg_dist.distributed import SpawnError, device, init, spawn  # noqa: E402
from pyg_dist.inference import predict  # noqa: E402
from pyg_dist.partition import PartitionBook, partition_graph  # noqa: E402



def __getattr__(name: str):
    if name == "notebook":  # imported on first use: pyg_dist.notebook.start(...)
        import importlib
        return importlib.import_module("pyg_dist.notebook")
    raise AttributeError(f"module 'pyg_dist' has no attribute '{name}'")


__all__ = ["DistData", "PartitionBook", "partition_graph", "init", "spawn", "SpawnError",
           "device", "nn", "predict", "__version__"]
