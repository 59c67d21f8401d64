r"""``TrainBatch``: what one training step consumes, whichever loader made it."""
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Optional, Sequence

import torch
from torch import Tensor

from pyg_dist.comm.plan import Plans
from pyg_dist.data import DistData


@dataclass
class TrainBatch:
    r"""One training step's input on this rank.

    The model runs as ``model(batch.x, batch.adj_t)`` (or on
    :obj:`edge_index` when it takes no sparse adjacency), under
    ``ctx.use(batch.plans, batch.upcoming, batch.input_features)`` when
    :obj:`plans` is set (distributed layers), as plain PyG otherwise. Its
    first output rows are the rows of :obj:`targets`'s length; the loss is
    the summed node loss of the rows :obj:`targets` marks, divided by
    :obj:`loss_count`, the number of such rows on all ranks, so that the
    gradients summed over the ranks are those of the step's global mean.

    Args:
        x: input rows (this rank's inner rows of the batch's graph).
        adj_t: the batch's graph as a CSR ``adj_t``.
        y: labels of the output rows.
        targets: mask of the output rows the loss covers.
        loss_count: rows of :obj:`targets` summed over the ranks.
        loss_weight: this step's share of the epoch's loss metric.
        plans: the layer plans (``None``: the model is not distributed).
        upcoming: the plans of the next iterations (caches exchanging ahead).
        input_features: :obj:`x` is the partition's input features, so the
            layer-0 precompute and the feature cache apply.
        halo_rows: rows this rank's first layer receives.
        edge_index: the graph as ``edge_index`` (neighbour → node).
        data: the (sub-)partition the plans are on.
        n_id: original ids of :obj:`x`'s rows.
        extra: what else the loader tells about the batch (e.g.
            ``num_sampled_nodes``), also readable as attributes.
    """
    x: Tensor
    adj_t: Tensor
    y: Tensor
    targets: Tensor
    loss_count: float
    loss_weight: float = 1.0
    plans: Optional[Plans] = None
    upcoming: Sequence[Plans] = ()
    input_features: bool = False
    halo_rows: int = 0
    edge_index: Optional[Tensor] = None
    data: Optional[DistData] = None
    n_id: Optional[Tensor] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        r"""The rows the loss covers on this rank."""
        return int(self.targets.sum())

    def __getattr__(self, name: str) -> Any:
        extra = self.__dict__.get("extra", {})
        if name in extra:
            return extra[name]
        raise AttributeError(f"'TrainBatch' has no attribute '{name}'")

    def to(self, device: torch.device, non_blocking: bool = False) -> "TrainBatch":
        r"""The batch with its tensors on :obj:`device` (plans stay)."""
        moved = {f.name: _to(getattr(self, f.name), device, non_blocking)
                 for f in fields(self) if f.name not in ("plans", "upcoming", "data")}
        moved["extra"] = {k: _to(v, device, non_blocking) for k, v in self.extra.items()}
        return TrainBatch(**{**self.__dict__, **moved})

    def pin_memory(self) -> "TrainBatch":
        pinned = {f.name: getattr(self, f.name).pin_memory() for f in fields(self)
                  if isinstance(getattr(self, f.name), Tensor)
                  and getattr(self, f.name).layout == torch.strided}
        return TrainBatch(**{**self.__dict__, **pinned})


def _to(value: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(value, Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, list):
        return [_to(v, device, non_blocking) for v in value]
    return value
