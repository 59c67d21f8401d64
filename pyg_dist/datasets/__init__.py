r"""Datasets: the embedded offline default graph, generated graphs in the
papers' regime (:func:`rmat`, :func:`reddit_shaped`), and the OGB and PyG
datasets of the papers, read from disk (:func:`load`)."""
from pyg_dist.datasets.real import (DATASETS, GENERATED, DatasetNotFound, evaluate,
                                    load)
from pyg_dist.datasets.regime import (load_reddit_shaped, load_rmat, reddit_shaped,
                                      rmat)
from pyg_dist.datasets.synthetic import load_default, synthetic_communities

__all__ = ["DATASETS", "GENERATED", "DatasetNotFound", "evaluate", "load",
           "load_default", "load_reddit_shaped", "load_rmat", "reddit_shaped",
           "rmat", "synthetic_communities"]
