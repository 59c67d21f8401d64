r"""``Loader``: what every training loader is, and what it is built from."""
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

import torch

from pyg_dist.comm.stats import CommStats
from pyg_dist.data import DistData
from pyg_dist.loader.batch import TrainBatch
from pyg_dist.options import Option
from pyg_dist.sampler import BoundarySampler


@dataclass
class LoaderInputs:
    r"""What a run hands a loader: this rank's partition (:obj:`root` on
    disk), the model's depth, the run's seed and device, the counters, and
    for distributed loaders the model's
    :class:`~pyg_dist.nn.HaloContext` and halo sampler (attached to it),
    plus :obj:`make_sampler`, which builds the run's sampler for another
    partition (``None``: the run exchanges every halo row), and the
    :obj:`model` trained on the batches."""
    root: str
    data: DistData
    num_layers: int
    seed: int
    device: torch.device
    stats: CommStats
    context: Any = None
    sampler: Optional[BoundarySampler] = None
    make_sampler: Optional[Callable[[DistData], BoundarySampler]] = None
    feature_cache_capacity: Union[int, str, None] = None  # None: no feature cache
    model: Optional[torch.nn.Module] = None  # the model the batches are for


class Loader:
    r"""A training loader: per epoch, an iterable of
    :class:`~pyg_dist.loader.TrainBatch` that every rank iterates in step.

    A subclass declares :attr:`options` (its hyper-parameters), validates
    them in :meth:`check`, declares which samplers, caches and layer options
    it runs with (its capabilities, read by :func:`pyg_dist.nn.compat.refusals`;
    :attr:`refusal` says why not), and builds itself in :meth:`from_inputs`. Registering it in
    :data:`pyg_dist.loader.LOADERS` makes it a ``--loader`` choice with its
    flags.
    """
    #: The model runs distributed layers on the batches' plans (else it is
    #: a plain PyG model and the partition stays on the CPU for the loader).
    distributed: bool = True
    #: Its batches are the rank's whole partition (full-graph plans); else
    #: mini-batches on sub-partitions.
    full_graph: bool = False
    #: Trains on the train nodes' subgraph when the run is inductive.
    inductive: bool = True
    #: Capabilities: it runs with halo samplers' plans, with samplers that
    #: learn from the exchanged rows, with stale caches, with the feature
    #: caches named (``None``: any), with ``precompute_layer0``, with
    #: ``overlap`` and with compressed exchanges.
    sampled_plans: bool = True
    observing_samplers: bool = True
    stale_caches: bool = True
    feature_caches: Optional[Tuple[str, ...]] = None
    precompute: bool = True
    overlap: bool = True
    exchange_dtypes: bool = True
    options: Tuple[Option, ...] = ()
    refusal: str = ""  # why a run it does not compose with is refused
    refusal_inductive: str = ""

    @classmethod
    def check(cls, num_layers: Optional[int] = None, **params: Any) -> None:
        r"""Raises :class:`ValueError` for invalid hyper-parameters (for a
        model of :obj:`num_layers` layers, when given)."""

    @classmethod
    def from_inputs(cls, inputs: LoaderInputs, **params: Any) -> "Loader":
        raise NotImplementedError

    def __iter__(self) -> Iterator[TrainBatch]:
        raise NotImplementedError

    #: Fields of :meth:`row_fields` that a run's summary averages.
    summary_keys: Tuple[str, ...] = ()

    def metrics(self) -> Tuple[Dict[str, float], Dict[str, float]]:
        r"""This epoch's counters of the loader's own work (since
        :meth:`reset_metrics`): ``(sums, maxes)``, added to the run's
        counters of the same name before they are summed, respectively
        maximised, over the ranks (e.g. ``bytes_sent``, ``time_sample``)."""
        return {}, {}

    def reset_metrics(self) -> None:
        pass

    def row_fields(self, sums: Dict[str, float], row: Dict[str, Any],
                   world: int) -> Dict[str, Any]:
        r"""Fields the loader adds to an epoch's metrics :obj:`row` from
        the counters summed over the ranks."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        r"""Releases what runs in the background (every rank, after the
        same number of batches)."""
