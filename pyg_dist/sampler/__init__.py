r"""Boundary samplers: which halo rows each iteration fetches."""
import inspect
from typing import Any, Dict, List, Optional, Type

from pyg_dist.data import DistData
from pyg_dist.options import Option, refuse_unknown
from pyg_dist.comm.stats import CommStats
from pyg_dist.sampler.base import BoundarySampler
from pyg_dist.sampler.bns import BNSSampler
from pyg_dist.sampler.edge import BoundaryEdgeSampler, DropEdgeSampler
from pyg_dist.sampler.full import FullSampler
from pyg_dist.sampler.variance import (VarianceReductionSampler, sampling_variance,
                                       vr_probabilities)

SAMPLERS: Dict[str, Type[BoundarySampler]] = {
    "full": FullSampler,
    "bns": BNSSampler,
    "vr": VarianceReductionSampler,
    "dropedge": DropEdgeSampler,
    "bes": BoundaryEdgeSampler,
}


def sampler_params(name: str) -> Dict[str, Any]:
    r"""The hyper-parameters of sampler :obj:`name` and their defaults."""
    skip = {"self", "data", "seed", "group", "stats"}
    return {k: p.default for k, p in inspect.signature(SAMPLERS[name]).parameters.items()
            if k not in skip}


def sampler_options(name: str) -> List[Option]:
    r"""The hyper-parameters of sampler :obj:`name`, as the command line
    offers them (from its constructor's signature)."""
    return [Option(param, default, "", type(default))
            for param, default in sampler_params(name).items()]


def check_sampler(name: str, params: Dict[str, Any]) -> None:
    r"""Raises :class:`ValueError` for an unknown sampler, a parameter it
    does not take (never silently ignored) or an invalid value."""
    if name not in SAMPLERS:
        raise ValueError(f"Unknown sampler '{name}' (choose from {', '.join(SAMPLERS)})")
    refuse_unknown("Sampler", name, params, sampler_params(name))
    SAMPLERS[name].check(**params)


def build_sampler(name: str, data: DistData, seed: int = 0, group=None,
                  stats: Optional[CommStats] = None, **params: Any) -> BoundarySampler:
    r"""The sampler registered as :obj:`name` (see :data:`SAMPLERS`)."""
    check_sampler(name, params)
    return SAMPLERS[name](data, seed=seed, group=group, stats=stats, **params)


__all__ = ["BoundarySampler", "FullSampler", "BNSSampler", "VarianceReductionSampler",
           "DropEdgeSampler", "BoundaryEdgeSampler", "SAMPLERS", "build_sampler", "check_sampler",
           "sampler_params", "sampler_options", "vr_probabilities", "sampling_variance"]
