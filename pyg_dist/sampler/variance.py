"""PSC-GCN: variance-reduction neighbour sampling."""
import math
from typing import Any, Callable, Dict, Optional

import torch
from torch import Tensor

from pyg_dist.comm import HaloPlan
from pyg_dist.data import DistData
from pyg_dist.comm.stats import CommStats
from pyg_dist.sampler.base import BoundarySampler, validate_probability


def vr_probabilities(weight: Tensor, index: Tensor, num_targets: int,
                     rate: float) -> Tensor:
    r"""The edge keep-probabilities minimising the sampling variance of
    every target's aggregation (PSC-GCN, Eq. 17–19):

    .. math::
        \min_{\mathbf p_i} \sum_{j \in \mathcal N_i} \frac{w_{ij}^2}{p_{ij}}
        \quad \text{s.t.} \quad \sum_{j \in \mathcal N_i} p_{ij} =
        \varepsilon |\mathcal N_i|, \quad 0 < p_{ij} \le 1,

    with :math:`w_{ij} = \sqrt{a_j} \|\mathbf y_{ij}\|`. With the
    neighbours of :math:`i` sorted by ascending :math:`w` and :math:`k` the
    largest position where :math:`(B_i + k - |\mathcal N_i|)\, w_{ik} \le
    \sum_{l \le k} w_{il}`, the :math:`k` smallest get
    :math:`p_{ij} = (B_i + k - |\mathcal N_i|)\, w_{ij} / \sum_{l\le k}
    w_{il}` and the others 1 (water-filling). Vectorised over all targets:
    two stable sorts and segment scans, :math:`O(|E| \log |E|)`.

    Args:
        weight: :math:`w` per edge (non-negative).
        index: the target of every edge.
        num_targets: the number of targets.
        rate: :math:`\varepsilon \in (0, 1]`.
    """
    num_edges = weight.numel()
    if num_edges == 0:
        return weight.new_empty(0)
    w = weight.double()
    # A zero weight gets the smallest positive probability instead of 0: its
    # contribution is zero anyway, and p > 0 keeps the estimate unbiased.
    w = w.clamp(min=max(float(w.max()) * 1e-9, 1e-300))
    # One sort by (target, weight): the weight, scaled into [0, 0.5), is the
    # fraction of the key (ties closer than ~1e-10 of the largest weight may
    # swap, which moves no probability by more than that).
    order = torch.argsort(index.double() + w / (2 * float(w.max())))
    w, idx = w[order], index[order]
    deg = torch.bincount(idx, minlength=num_targets)
    start = deg.cumsum(0) - deg
    pos = torch.arange(1, num_edges + 1, device=w.device) - start[idx]  # k, 1-based
    csum = w.cumsum(0)
    before = torch.cat([csum.new_zeros(1), csum])[start]  # sum before each segment
    prefix = csum - before[idx]  # Σ_{l ≤ k} w_l
    budget = rate * deg.double()
    lead = budget[idx] + pos - deg[idx]  # B_i + k - |N_i|
    fits = lead * w <= prefix * (1 + 1e-12)
    k = torch.zeros(num_targets, dtype=torch.long, device=w.device)
    k.scatter_reduce_(0, idx, torch.where(fits, pos, 0), "amax")
    below = pos <= k[idx]  # the entries with p < 1
    # Σ_{l ≤ k} w_l again, per segment: the global scan above loses the
    # precision of segments whose weights are tiny next to the running total.
    total = torch.zeros(num_targets, dtype=w.dtype, device=w.device)
    total.index_add_(0, idx[below], w[below])
    scale = (budget + k - deg) / total
    p_sorted = torch.where(below, scale[idx] * w, torch.ones_like(w))
    p = torch.empty_like(p_sorted)
    p[order] = p_sorted
    return p.clamp_(min=torch.finfo(torch.double).tiny, max=1.0)


def sampling_variance(p: Tensor, weight: Tensor) -> Tensor:
    r""":math:`\sum_{j} (1/p_{ij} - 1)\, w_{ij}^2` over all edges: the
    (rescaled) variance of the sampled aggregations (PSC-GCN, Eq. 16–17)."""
    return ((p.double().reciprocal() - 1) * weight.double().pow(2)).sum()


class VarianceReductionSampler(BoundarySampler):
    r"""The variance-reduction sampler of `"Communication-Efficient Sampling
    for Distributed Graph Convolutional Network Training"` (PSC-GCN, §IV,
    Alg. 2).

    Every edge :math:`j \to i` of the partition survives with probability
    :math:`p_{ij}` (:func:`vr_probabilities`, budget :math:`\varepsilon
    |\mathcal N_i|` per target) and is scaled by :math:`1/p_{ij}`. The
    weights :math:`w_{ij} = \sqrt{a_j}\, \|\mathbf y_{ij}\|` favour
    inner neighbours (:math:`a_j` = :obj:`inner_weight` vs
    :obj:`halo_weight`), so fewer halo rows travel. :math:`\mathbf y_{ij} =
    [P_{ij} W^{(1)} \mathbf h_j^{(0)}, \dots, P_{ij} W^{(L)} \mathbf
    h_j^{(L-1)}]` is Eq. 16's concatenation of the terms node :math:`j`
    adds to :math:`i`'s aggregations, so

    .. math::
        \|\mathbf y_{ij}\|^2 = c_{ij}^2 \sum_{\ell} \|W^{(\ell)}
        \mathbf h_j^{(\ell-1)}\|^2,

    with :math:`c_{ij}` the part of :math:`P_{ij}` that depends on
    :math:`j` (the part that depends on :math:`i` only scales target
    :math:`i`'s problem and leaves its probabilities unchanged):
    ``"gcn"``: :math:`1/\sqrt{\hat d_j}`; ``"uniform"``: 1, e.g. for
    mean/sum aggregation. :math:`W^{(\ell)}` is the matrix layer
    :math:`\ell` applies to the rows it aggregates
    (:meth:`~pyg_dist.nn.HaloContext.neighbour_weight`: GCN's
    :math:`\Theta`, SAGE's and GraphConv's :math:`W_2`), applied to the
    rows as aggregated, whatever order the layer computes in; a layer
    whose aggregated rows go through no single matrix (e.g. GIN's MLP
    after the sum) contributes :math:`\|\mathbf h_j^{(\ell-1)}\|^2`. The
    norms are estimated from the source rows the layers recently
    aggregated (halo rows not fetched keep their last value; rows never
    seen get the mean of those seen). Until embeddings have been seen every edge has
    :math:`p = \varepsilon` (Alg. 2, line 2); afterwards the probabilities
    are recomputed every :obj:`refresh` iterations ("semi-dynamic"), from
    the embeddings of the iteration before, which is the only one whose
    layers are observed.

    The halo rows fetched are those kept by at least one edge; owners learn
    them from one ``all_to_all`` of bitmasks per iteration.
    """
    observes = True

    def __init__(self, data: DistData, rate: float = 0.1, refresh: int = 100,
                 inner_weight: float = 1.1, halo_weight: float = 1.0,
                 coefficient: str = "gcn", seed: int = 0, group=None,
                 stats: Optional[CommStats] = None) -> None:
        super().__init__(data, seed, group, stats)
        self.check(rate=rate, refresh=refresh, inner_weight=inner_weight,
                   halo_weight=halo_weight, coefficient=coefficient)
        self.rate = float(rate)
        self.refresh, self.coefficient = refresh, coefficient
        self.inner_weight, self.halo_weight = inner_weight, halo_weight
        src = data.edge_index[0]
        prior = torch.where(self.halo_edge, math.sqrt(halo_weight),
                            math.sqrt(inner_weight)).double()
        if coefficient == "gcn":  # 1/sqrt(d̂_j) with the self-loop
            prior = prior * (data.deg_in[src].double() + 1).rsqrt()
        self.prior = prior
        self.set_edge_probability(torch.full_like(prior, self.rate))
        self.refreshed_at: Optional[int] = None
        self._ctx = None
        self.observing = True  # whether the layers' rows are recorded now
        # Per layer: ‖h_j‖² of every source row, and which rows were seen.
        self._row_norms: Dict[str, Tensor] = {}
        self._seen: Dict[str, Tensor] = {}

    @classmethod
    def check(cls, rate: float = 0.1, refresh: int = 100, inner_weight: float = 1.1,
              halo_weight: float = 1.0, coefficient: str = "gcn") -> None:
        validate_probability("rate", rate, allow_zero=False)
        if refresh < 1:
            raise ValueError(f"refresh must be >= 1 (got {refresh})")
        if inner_weight <= 0 or halo_weight <= 0:
            raise ValueError(f"inner_weight and halo_weight must be > 0 "
                             f"(got {inner_weight}, {halo_weight})")
        if coefficient not in ("gcn", "uniform"):
            raise ValueError(f"coefficient must be 'gcn' or 'uniform' (got {coefficient!r})")

    def attach(self, ctx) -> None:
        self._ctx = ctx
        ctx.observers.append(self.observe)

    @torch.no_grad()
    def observe(self, key: str, x_src: Tensor, plan: HaloPlan) -> None:
        r"""Records :math:`\|W h_j\|^2` of the source rows :math:`h_j` a
        layer aggregated (:math:`\|h_j\|^2` without a :math:`W`)."""
        if not self.observing:
            return
        x = x_src.detach().flatten(1)
        weight = None if self._ctx is None else self._ctx.neighbour_weight()
        if weight is not None and weight.size(1) == x.size(1):
            x = x @ weight.detach().t()
        sq = torch.linalg.vector_norm(x, dim=1).double().pow(2)
        num_inner, num_src = self.data.num_inner, self.data.num_inner + self.data.num_halo
        if key not in self._row_norms:
            self._row_norms[key] = sq.new_zeros(num_src)
            self._seen[key] = torch.zeros(num_src, dtype=torch.bool, device=sq.device)
        rows, seen = self._row_norms[key], self._seen[key]
        if plan.halo_index is None:
            rows.copy_(sq)
            seen.fill_(True)
        else:
            rows[:num_inner] = sq[:num_inner]
            rows[num_inner + plan.halo_index] = sq[num_inner:]
            seen[:num_inner] = True
            seen[num_inner + plan.halo_index] = True

    def _due(self, iteration: int) -> bool:
        return self.refreshed_at is None or iteration - self.refreshed_at >= self.refresh

    def plan(self, iteration: int) -> HaloPlan:
        return self.prepare(iteration)()

    def prepare(self, iteration: int) -> Callable[[], HaloPlan]:
        if self._row_norms and self._due(iteration):
            self.update_probabilities()
            self.refreshed_at = iteration
        self.observing = self._due(iteration + 1)
        probability, scale = self.edge_probability, self.edge_scale  # replaced, never mutated
        return lambda: self.sample_edges(iteration, probability=probability, scale=scale)

    def state_dict(self) -> Dict[str, Any]:
        return {"edge_probability": self.edge_probability, "edge_scale": self.edge_scale,
                "probability_version": self.probability_version,
                "refreshed_at": self.refreshed_at, "observing": self.observing,
                "row_norms": dict(self._row_norms), "seen": dict(self._seen)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.edge_probability, self.edge_scale = state["edge_probability"], state["edge_scale"]
        self.probability_version = state["probability_version"]
        self.refreshed_at, self.observing = state["refreshed_at"], state["observing"]
        self._row_norms, self._seen = dict(state["row_norms"]), dict(state["seen"])

    def edge_weights(self) -> Tensor:
        r""":math:`w_{ij} = \sqrt{a_j}\, \|\mathbf y_{ij}\|` per edge."""
        total = 0
        for key, rows in self._row_norms.items():
            seen = self._seen[key]
            total = total + torch.where(seen, rows, rows[seen].mean())
        return self.prior * total.sqrt()[self.data.edge_index[0]]

    def update_probabilities(self) -> None:
        self.set_edge_probability(vr_probabilities(
            self.edge_weights(), self.data.edge_index[1], self.data.num_inner, self.rate))

    def extra_repr(self) -> str:
        return (f"rate={self.rate}, refresh={self.refresh}, inner_weight="
                f"{self.inner_weight}, halo_weight={self.halo_weight}, "
                f"coefficient={self.coefficient!r}")
