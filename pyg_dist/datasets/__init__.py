r"""Datasets: the embedded offline default graph, and the OGB and PyG
datasets of the papers, read from disk (:func:`load`)."""
from pyg_dist.datasets.real import DATASETS, DatasetNotFound, evaluate, load
from pyg_dist.datasets.synthetic import load_default, synthetic_communities

__all__ = ["DATASETS", "DatasetNotFound", "evaluate", "load", "load_default",
           "synthetic_communities"]
