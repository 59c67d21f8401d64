"""``BoundarySampler``: the base of every halo sampler."""
from typing import Any, Callable, Dict, Optional

import torch
from torch import Tensor

from pyg_dist.comm import HaloPlan
from pyg_dist.comm.bitmask import tell_owners
from pyg_dist.comm.plan import EdgePatch
from pyg_dist.comm.stats import CommStats
from pyg_dist.data import DistData
from pyg_dist.utils import mix_seeds



class BoundarySampler:
    r"""Decides, for every training iteration, which halo rows a rank
    receives, which of its local edges survive and by how much each
    surviving contribution is scaled: :meth:`plan` returns that iteration's
    :class:`~pyg_dist.comm.HaloPlan`, which the layers, the exchange and
    the trainer use as given. Evaluation always uses :attr:`full_plan`.

    All ranks call :meth:`plan` with the same iteration in step (samplers
    whose receivers decide alone tell the owners in one collective).

    Subclasses implement :meth:`plan` and :meth:`check`; those that learn
    from the embeddings the layers exchange override :meth:`attach`.

    Args:
        data: this rank's partition.
        seed: every random draw is a function of ``(seed, iteration, ...)``,
            so a run is reproducible.
        group: the process group (default: the default group).
        stats: counters for the bytes the sampler itself sends (key ``"plan"``).
    """

    #: Its plans drop halo rows or edges (else it returns the exact plan).
    samples: bool = True
    #: It learns from the rows the layers exchange (:meth:`attach` registers
    #: an observer), so it needs an exchange that holds a layer's whole halo.
    observes: bool = False

    def __init__(self, data: DistData, seed: int = 0, group=None,
                 stats: Optional[CommStats] = None) -> None:
        self.data = data
        self.seed = seed
        self.group = group
        self.stats = stats
        self.full_plan = HaloPlan.full(data)
        self.rank = data.rank
        self.device = data.edge_index.device
        src = data.edge_index[0]
        self.halo_edge = src >= data.num_inner  # cut edges: from a halo source
        self.cut_edge = self.halo_edge.nonzero().view(-1)
        self.cut_src = src[self.cut_edge] - data.num_inner  # their halo row
        self.probability_version = 0  # bumped when the edge probabilities change

    @classmethod
    def check(cls, **params) -> None:
        r"""Raises :class:`ValueError` for invalid hyper-parameters (called
        before any partition is loaded, so a bad flag fails fast)."""

    def plan(self, iteration: int) -> HaloPlan:
        raise NotImplementedError

    def prepare(self, iteration: int) -> Callable[[], HaloPlan]:
        r"""Splits :meth:`plan` for drawing in another thread: what must run
        in the training loop's order (e.g. refreshing probabilities from
        observed embeddings) runs now; the returned function draws the plan
        and touches no state the training loop changes."""
        return lambda: self.plan(iteration)

    def attach(self, ctx) -> None:
        r"""Called once with the model's :class:`~pyg_dist.nn.HaloContext`."""

    def state_dict(self) -> Dict[str, Any]:
        r"""What the sampler has learned, for a checkpoint (plans themselves
        are functions of ``(seed, iteration)`` and need no state)."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        r"""Restores :meth:`state_dict` (resuming a run)."""

    def generator(self, iteration: int, *keys: int) -> torch.Generator:
        r"""A CPU generator seeded by ``(seed, iteration, *keys)``: two ranks
        that pass the same keys draw the same numbers."""
        g = torch.Generator()
        g.manual_seed(mix_seeds(self.seed, iteration, *keys))
        return g

    def uniform(self, n: int, iteration: int, *keys: int) -> Tensor:
        return torch.rand(n, generator=self.generator(iteration, *keys)).to(self.device)

    def set_edge_probability(self, probability: Tensor) -> None:
        r"""The keep-probability of every partition edge that
        :meth:`sample_edges` draws with (kept edges are scaled by its inverse)."""
        self.edge_probability = probability.float()  # compared with float32 draws
        self.edge_scale = probability.double().reciprocal().to(self.data.adj_t.dtype)
        self.probability_version += 1

    def inclusion_probability(self) -> Tensor:
        r"""Per halo row, the probability that a plan receives it:
        :math:`1 - \prod_i (1 - p_{ij})` over the edges :math:`j \to i` it
        has here (1 for a sampler that keeps every row)."""
        data = self.data
        if not hasattr(self, "edge_probability"):
            return torch.ones(data.num_halo, device=self.device)
        log_miss = torch.zeros(data.num_halo, dtype=torch.double, device=self.device)
        log_miss.index_add_(0, self.cut_src,
                            torch.log1p(-self.edge_probability[self.cut_edge].double()))
        return (1 - log_miss.exp()).float()

    def sample_edges(self, iteration: int, cut_only: bool = False,
                     probability: Optional[Tensor] = None,
                     scale: Optional[Tensor] = None) -> HaloPlan:
        r"""Keeps each edge with its :meth:`set_edge_probability` (or the
        given :obj:`probability` and :obj:`scale`) and returns the plan of
        the survivors (see :meth:`plan_from_edges`)."""
        if probability is None:
            probability, scale = self.edge_probability, self.edge_scale
        draw = self.uniform(probability.numel(), iteration, self.rank)
        return self.plan_from_edges(draw < probability, scale, cut_only)

    def cut_patch(self, halo_keep: Tensor, kept: Tensor, scale: Tensor) -> EdgePatch:
        r"""The cut edges as a patch of the partition's graph: the
        :obj:`kept` ones point at their received halo row with weight
        :obj:`scale`, the others are dropped."""
        new_id = self.data.num_inner + halo_keep.cumsum(0) - 1
        return EdgePatch(self.cut_edge, torch.where(kept, new_id[self.cut_src], 0),
                         kept * scale)

    def plan_from_edges(self, edge_keep: Tensor, edge_scale: Optional[Tensor] = None,
                        cut_only: bool = False) -> HaloPlan:
        r"""The plan of a sampled edge set decided by the receiver alone:
        a halo row travels iff at least one of its edges survives. Owners
        learn which of their rows to send from one ``all_to_all`` of
        bitmasks (one bit per halo row, so it is never larger than a list of
        ids once more than 1/32 of the rows are kept). With
        :obj:`cut_only` (only cut edges are ever dropped) the plan is a
        :meth:`cut_patch`, which costs :math:`O(|E_{\mathrm{cut}}|)`."""
        data = self.data
        kept_cut = edge_keep[self.cut_edge]
        halo_keep = torch.zeros(data.num_halo, dtype=torch.bool, device=self.device)
        halo_keep[self.cut_src[kept_cut]] = True
        send_keep = tell_owners(data, halo_keep, self.group, self.stats)
        if cut_only:
            scale = 1.0 if edge_scale is None else edge_scale[self.cut_edge]
            return HaloPlan.sampled(data, send_keep, halo_keep,
                                    patch=self.cut_patch(halo_keep, kept_cut, scale))
        return HaloPlan.sampled(data, send_keep, halo_keep, edge_keep, edge_scale)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.extra_repr()})"

    def extra_repr(self) -> str:
        return ""


def validate_probability(name: str, value: float, allow_zero: bool = True) -> float:
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value <= 1):
        raise ValueError(f"{name} must be in {'[' if allow_zero else '('}0, 1] "
                         f"(got {value})")
    return float(value)
