r"""CM-GCN's computation cost model (Eq. 6–13): what a mini-batch costs to
train, from the sizes of its K-hop computational graph."""
import time
from dataclasses import dataclass, field
from typing import Callable, List, Sequence

import torch
from torch import Tensor


@dataclass
class CostModel:
    r"""The constants of CM-GCN's Table I (seconds per unit) and the layer
    widths :math:`d_0, \dots, d_K`:

    ========  ==============================================================
    α         adding two :math:`d`-vectors: :math:`\alpha d`
    β         a :math:`d_k \times d_{k-1}` matrix times a vector
    γ         an activation over a :math:`d`-vector
    η         a :math:`d_k \times d_{k-1}` matrix times a scalar
    λ         the loss gradient towards a :math:`d`-vector
    ========  ==============================================================

    Per node :math:`v` of in-degree :math:`|N_v|` at layer :math:`k \geq 1`
    (layer 0 holds the input features and costs nothing):

    .. math::
        c_f(v,k) &= \alpha |N_v| d_{k-1} + \beta d_k d_{k-1} + \gamma d_k

        c_b(v,k) &= \begin{cases} (\lambda + \eta) d_k + (2\beta + \eta)
        d_k d_{k-1} & k = K \\ \alpha |N_v| d_k + (\beta + \eta) d_k d_{k-1}
        + \eta d_k & 0 < k < K \end{cases}

    and a batch :math:`B` costs the nodes of its computational graph, where
    layer :math:`k` computes the nodes within :math:`K - k` hops of
    :math:`B` (Eq. 13, with its hop and layer indices made explicit):

    .. math::
        C(B) = \sum_{k=1}^{K} \sum_{v \in N^{\leq K-k}(B)} c_f(v,k) + c_b(v,k).

    The defaults were measured by :meth:`calibrate` on a 2-core CPU with
    PyTorch 2.13 (fp32); the unit cancels in every comparison.
    """
    dims: Sequence[int] = field(default_factory=lambda: [64, 64, 64, 10])
    alpha: float = 1.0e-9
    beta: float = 1.0e-9
    gamma: float = 1.0e-9
    eta: float = 1.0e-9
    lam: float = 1.0e-9

    @property
    def num_layers(self) -> int:
        return len(self.dims) - 1

    def forward_cost(self, deg: Tensor, k: int) -> Tensor:
        r""":math:`c_f(v, k)` for every node of in-degree :obj:`deg` (Eq. 6)."""
        if k == 0:
            return torch.zeros_like(deg, dtype=torch.double)
        d, d_in = self.dims[k], self.dims[k - 1]
        return self.alpha * deg.double() * d_in + self.beta * d * d_in + self.gamma * d

    def backward_cost(self, deg: Tensor, k: int) -> Tensor:
        r""":math:`c_b(v, k)` (Eq. 12)."""
        if k == 0:
            return torch.zeros_like(deg, dtype=torch.double)
        d, d_in = self.dims[k], self.dims[k - 1]
        if k == self.num_layers:
            return torch.full_like(deg, (self.lam + self.eta) * d
                                   + (2 * self.beta + self.eta) * d * d_in, dtype=torch.double)
        return (self.alpha * deg.double() * d + (self.beta + self.eta) * d * d_in
                + self.eta * d)

    def layer_costs(self, deg: Tensor) -> Tensor:
        r"""``[K + 1, N]``: :math:`c_f(v,k) + c_b(v,k)` per layer and node."""
        return torch.stack([self.forward_cost(deg, k) + self.backward_cost(deg, k)
                            for k in range(self.num_layers + 1)])

    def node_cost(self, deg: Tensor) -> Tensor:
        r""":math:`nc(v) = \sum_{k=1}^K c_f(v,k) + c_b(v,k)` (§III-B)."""
        return self.layer_costs(deg)[1:].sum(0)

    @classmethod
    def calibrate(cls, dims: Sequence[int], rows: int = 4096, repeats: int = 5) -> "CostModel":
        r"""Measures the constants on this machine with PyTorch: each is the
        best time of an operation over :obj:`rows` nodes divided by its
        units (vector entries or matrix entries)."""
        d = max(dims)
        x, y = torch.randn(rows, d), torch.randn(rows, d)
        w = torch.randn(d, d)
        target = torch.randint(0, d, (rows, ))

        def best(fn: Callable[[], object]) -> float:
            fn()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return min(times)

        def loss_grad():
            z = x.clone().requires_grad_()
            torch.nn.functional.cross_entropy(z, target, reduction="sum").backward()
        scale = torch.tensor(0.5)
        return cls(dims=list(dims),
                   alpha=best(lambda: x + y) / (rows * d),
                   beta=best(lambda: x @ w) / (rows * d * d),
                   gamma=best(lambda: torch.relu(x)) / (rows * d),
                   eta=best(lambda: [w * scale for _ in range(64)]) / (64 * d * d),
                   lam=best(loss_grad) / (rows * d))


class HopGraph:
    r"""The in-neighbourhoods of a graph, for the K-hop computational graphs
    of mini-batches: ``edge_index`` flows source → target, so a batch needs
    the sources of its nodes' in-edges one layer down."""

    def __init__(self, edge_index: Tensor, num_nodes: int, cost: CostModel) -> None:
        self.src, self.dst = edge_index.cpu()
        self.num_nodes = num_nodes
        self.deg = torch.bincount(self.dst, minlength=num_nodes)
        self.cost = cost
        self.layer_cost = cost.layer_costs(self.deg)  # [K + 1, N]

    def expand(self, mask: Tensor) -> Tensor:
        r"""``mask`` plus the in-neighbours of its nodes."""
        out = mask.clone()
        out[self.src[mask[self.dst]]] = True
        return out

    def hops(self, batch: Tensor) -> List[Tensor]:
        r"""Masks of the nodes within :math:`0, \dots, K-1` hops of the
        node ids :obj:`batch`."""
        mask = torch.zeros(self.num_nodes, dtype=torch.bool)
        mask[batch] = True
        masks = [mask]
        for _ in range(self.cost.num_layers - 1):
            masks.append(self.expand(masks[-1]))
        return masks

    def batch_cost(self, batch: Tensor) -> float:
        r""":math:`C(B)` (Eq. 13)."""
        K = self.cost.num_layers
        return float(sum(self.layer_cost[K - h][mask].sum()
                         for h, mask in enumerate(self.hops(batch))))

    def partition_cost(self, assignment: Tensor, nodes: Tensor) -> float:
        r""":math:`J(P) = \sum_B C(B)` (Eq. 14) of the batches
        ``assignment[i]`` of the nodes :obj:`nodes`."""
        return sum(self.batch_cost(nodes[assignment == b])
                   for b in range(int(assignment.max()) + 1))


def rank_costs(graph: HopGraph, batch: Tensor, part_of: Tensor, num_parts: int) -> Tensor:
    r"""The cost of :obj:`batch`'s computational graph per rank, each node
    counted on the rank that owns it (:obj:`part_of`): the work each rank
    does for the batch (§III-B)."""
    K = graph.cost.num_layers
    out = torch.zeros(num_parts, dtype=torch.double)
    for h, mask in enumerate(graph.hops(batch)):
        out.index_add_(0, part_of[mask], graph.layer_cost[K - h][mask])
    return out


def imbalance(costs: Tensor) -> float:
    r"""``max / mean`` of per-rank costs (1: perfectly balanced)."""
    return float(costs.max() / costs.mean().clamp(min=1e-30))
