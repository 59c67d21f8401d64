r"""Training loaders on top of :class:`~pyg_dist.DistData`. Each yields
:class:`TrainBatch` es; ``--loader NAME`` picks one from :data:`LOADERS`.

========= ================================ =====================================
name      class                            batches per epoch
========= ================================ =====================================
full      :class:`FullGraphLoader`         1: the whole partition (halo plans)
cohesive  :class:`CohesiveBatchLoader`     M: CM-GCN cohesive mini-batches
neighbor  :class:`PartitionNeighborLoader` one per step: DistDGL / ByteGNN
                                           neighbour-sampled mini-batches
========= ================================ =====================================
"""
from typing import Any, Dict, Tuple, Type

from pyg_dist.loader.base import Loader, LoaderInputs
from pyg_dist.loader.batch import TrainBatch
from pyg_dist.loader.cohesive import (BatchGraph, CohesiveBatchLoader, CostModel, HopGraph,
                                      batch_subgraph, cohesive_batches, load_batch_cost,
                                      load_batches, queyranne_bisection, random_batches,
                                      recursive_bisection, sample_layers, save_batches)
from pyg_dist.loader.full import FullGraphLoader, PlanPrefetcher
from pyg_dist.loader.neighbor import (PartitionFeatureStore, PartitionNeighborLoader,
                                      PartitionNeighborSampler, SamplerPool,
                                      sample_neighbors, split_seeds)
from pyg_dist.options import Option, refuse_unknown

LOADERS: Dict[str, Type[Loader]] = {
    "full": FullGraphLoader,
    "cohesive": CohesiveBatchLoader,
    "neighbor": PartitionNeighborLoader,
}


def _loader_class(name: str) -> Type[Loader]:
    if name not in LOADERS:
        raise ValueError(f"Unknown loader '{name}' ({', '.join(LOADERS)})")
    return LOADERS[name]


def loader_options(name: str) -> Tuple[Option, ...]:
    r"""The hyper-parameters loader :obj:`name` takes."""
    return _loader_class(name).options


def check_loader(name: str, params: Dict[str, Any], config: Any) -> None:
    r"""Raises :class:`ValueError` for an unknown loader, a parameter it
    does not take, an invalid value, or an inductive run it does not
    serve (the components it composes with: :func:`pyg_dist.nn.compat.refusals`)."""
    cls = _loader_class(name)
    if config.inductive and not cls.inductive:
        raise ValueError(cls.refusal_inductive)
    refuse_unknown("Loader", name, params, [o.name for o in cls.options])
    cls.check(num_layers=config.num_layers, **params)


def build_loader(name: str, inputs: LoaderInputs, **params: Any) -> Loader:
    r"""The loader registered as :obj:`name`, built for one run."""
    return _loader_class(name).from_inputs(inputs, **params)


__all__ = ["LOADERS", "Loader", "LoaderInputs", "TrainBatch", "build_loader", "check_loader",
           "loader_options", "FullGraphLoader", "PlanPrefetcher", "BatchGraph",
           "CohesiveBatchLoader", "batch_subgraph", "sample_layers", "load_batches",
           "load_batch_cost", "save_batches", "CostModel", "HopGraph", "cohesive_batches",
           "queyranne_bisection", "random_batches", "recursive_bisection",
           "PartitionFeatureStore", "PartitionNeighborLoader", "PartitionNeighborSampler",
           "SamplerPool", "sample_neighbors", "split_seeds"]
