r"""CM-GCN's computation cost model (Eq. 6–13): what a mini-batch costs to
train, from the sizes of its K-hop computational graph."""
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.utils import spmm

from pyg_dist.integrity import CorruptFileError, read_json, save_json, sum64
from pyg_dist.utils.sparse import csr

CONSTANTS = ("alpha", "beta", "gamma", "eta", "lam")


def _values_sum64(item: Dict[str, Any]) -> int:
    r""":func:`~pyg_dist.integrity.sum64` of :obj:`item` as compact JSON with
    sorted keys: the same for the values :meth:`CostModel.save` wrote and
    those JSON reads back (floats round-trip exactly), whatever the layout."""
    return sum64(json.dumps(item, sort_keys=True, separators=(",", ":")).encode())

# How each model kind of ``pyg-dist train --model`` aggregates, and the
# weight matrices one node meets per layer as (rows, cols) of
# ("in", "out") = (d_{k-1}, d_k): the operations :meth:`CostModel.calibrate`
# times, so that the constants are those of the model that will train.
MODEL_KINDS: Dict[str, Tuple[str, Tuple[Tuple[str, str], ...]]] = {
    "gcn": ("sum", (("in", "out"), )),
    "sage": ("mean", (("in", "out"), ("in", "out"))),  # lin_l(aggregate) + lin_r(root)
    "gin": ("sum", (("in", "out"), ("out", "out"))),  # its MLP: d_{k-1} -> d_k -> d_k
    "gat": ("messages", (("in", "out"), )),  # per-edge messages, attention-weighted
}


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

    The defaults (:math:`10^{-9}` each) are placeholders that weigh every
    operation alike; they were never measured. :meth:`calibrate` measures
    the constants on this machine for the model that will train (what
    ``pyg-dist partition --num-batches`` and
    :class:`~pyg_dist.loader.CohesiveBatchLoader` use), :meth:`load` reads
    constants measured elsewhere (``pyg-dist calibrate --out FILE``).
    :obj:`measured` says where and how the constants were measured
    (``None``: not measured).
    """
    dims: Sequence[int] = field(default_factory=lambda: [64, 64, 64, 10])
    alpha: float = 1.0e-9
    beta: float = 1.0e-9
    gamma: float = 1.0e-9
    eta: float = 1.0e-9
    lam: float = 1.0e-9
    measured: Optional[Dict[str, Any]] = None

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

    def to_dict(self) -> Dict[str, Any]:
        r"""The widths, the constants and :obj:`measured` as plain JSON
        values (what ``batches.pt`` and ``--cost-constants`` files hold)."""
        return {"dims": [int(d) for d in self.dims],
                **{k: float(getattr(self, k)) for k in CONSTANTS},
                "measured": self.measured}

    @classmethod
    def from_dict(cls, item: Any, dims: Optional[Sequence[int]] = None,
                  where: str = "cost constants") -> "CostModel":
        r"""The cost model of :meth:`to_dict`'s :obj:`item` (widths
        :obj:`dims` instead of the item's when given), refused with a
        :class:`ValueError` naming :obj:`where` unless every constant is a
        finite number > 0."""
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a JSON object with the keys "
                             f"{', '.join(CONSTANTS)}, got {type(item).__name__}")
        missing = [k for k in CONSTANTS if k not in item]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)} (a cost constants file "
                             f"holds {', '.join(CONSTANTS)}; write one with "
                             f"pyg-dist calibrate --out FILE)")
        values = {}
        for k in CONSTANTS:
            value = item[k]
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{where}: {k} must be a finite number > 0 (got {value!r})")
            values[k] = float(value)
        if dims is None:
            dims = item.get("dims")
            if not isinstance(dims, list) or len(dims) < 2 or not all(
                    isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
                raise ValueError(f"{where}: dims must be a list of at least 2 widths > 0 "
                                 f"(got {dims!r})")
        measured = item.get("measured")
        return cls(dims=list(dims), measured=measured if isinstance(measured, dict) else None,
                   **values)

    def save(self, path: str) -> str:
        r"""Writes :meth:`to_dict` as JSON to :obj:`path` with ``sum64``,
        the checksum of its values (:func:`_values_sum64`) that
        :meth:`load` verifies."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        item = self.to_dict()
        save_json({**item, "sum64": _values_sum64(item)}, path)
        return path

    @classmethod
    def load(cls, path: str, dims: Optional[Sequence[int]] = None) -> "CostModel":
        r"""The constants of a JSON file written by :meth:`save` (e.g.
        measured on the machine or GPU that will train), with the widths
        :obj:`dims` when given; a missing, unreadable or invalid file raises
        :class:`FileNotFoundError`, :class:`~pyg_dist.integrity.UnreadableFileError`
        or :class:`ValueError` naming it, and one whose values do not match
        its checksum (or that has none) :class:`~pyg_dist.integrity.CorruptFileError`."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"cost constants file '{path}' does not exist (write one "
                                    f"with pyg-dist calibrate --out FILE)")
        try:
            item = read_json(path)
        except CorruptFileError as e:
            raise ValueError(f"cost constants file '{path}' is not readable JSON "
                             f"({e.__cause__})") from e
        where = f"cost constants file '{path}'"
        cost = cls.from_dict(item, dims, where=where)  # names a missing or bad field first
        values = {k: v for k, v in item.items() if k != "sum64"}
        if "sum64" not in item:
            raise CorruptFileError(f"{where} holds no checksum (sum64): it cannot be checked "
                                   f"(write it with pyg-dist calibrate --out FILE)")
        if item["sum64"] != _values_sum64(values):
            raise CorruptFileError(f"{where} is corrupt or was edited: its values differ "
                                   f"from those its checksum (sum64) records")
        return cost

    def describe(self) -> str:
        r"""One line: the constants, :math:`\alpha / \beta` and where they
        were measured."""
        values = ", ".join(f"{k} {getattr(self, k):.3g}" for k in CONSTANTS)
        m = self.measured
        where = ("placeholders, not measured" if not m else
                 f"measured for {m.get('model')} on {m.get('device')} with "
                 f"{m.get('threads')} thread(s), widths {m.get('dims')}")
        return (f"{values} s/unit (alpha/beta {self.alpha / self.beta:.3g}; {where}); "
                f"widths {list(self.dims)}")

    @classmethod
    def calibrate(cls, dims: Sequence[int], rows: int = 4096, repeats: int = 10,
                  model: str = "sage", degree: float = 10.0,
                  threads: Optional[int] = None,
                  device: Union[str, torch.device] = "cpu", seed: int = 0) -> "CostModel":
        r"""Measures the constants on this machine (on :obj:`device`, with
        :obj:`threads` intra-op threads) on the operations a
        :obj:`model`-kind layer of widths :obj:`dims` runs in training, over
        :obj:`rows` nodes of in-degree :obj:`degree` (random sources, fp32).
        Each constant is the best time of :obj:`repeats` (after a warm-up
        round; the repeats go round all operations in turn), summed over the
        layers :math:`k = 1, \dots, K`, divided by the units its term
        counts:

        ========  ============================================================
        α         the model's aggregation (:data:`MODEL_KINDS`: PyG's
                  ``spmm`` over a CSR adjacency, with the model's reduce;
                  GAT: per-edge messages gathered, scaled by given
                  coefficients and scattered; the attention softmax is
                  not timed),
                  forward :math:`A X` and backward :math:`A^\top G` both, per
                  edge, feature and direction (:math:`2 |E| d_{k-1}`)
        β         the model's dense transform of a node (all its weight
                  matrices, e.g. two for GraphSAGE), per :math:`d_k d_{k-1}`
        γ         ReLU over a :math:`d_k`-vector, per entry
        η         a :math:`d_k`-vector times a per-node scalar, per entry
        λ         cross-entropy and its gradient over :math:`d_K` logits,
                  per logit
        ========  ============================================================

        The aggregation is timed in both directions because :math:`C(B)`
        charges :math:`\alpha` for both (Eq. 6 and 12) and its backward (the
        transposed product) is the slower one: 1.7–6× the forward on this
        2-core CPU with torch 2.13. :obj:`measured` records the machine,
        threads, device, model and widths."""
        if model not in MODEL_KINDS:
            raise ValueError(f"Unknown model kind '{model}' (choose from "
                             f"{', '.join(MODEL_KINDS)})")
        if len(dims) < 2 or any(int(d) < 1 for d in dims):
            raise ValueError(f"dims must hold at least 2 widths >= 1 (got {list(dims)})")
        if rows < 2 or repeats < 1 or not degree > 0:
            raise ValueError(f"rows must be >= 2, repeats >= 1 and degree > 0 (got {rows}, "
                             f"{repeats}, {degree})")
        device = torch.device(device)
        previous = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            totals = _measure(list(map(int, dims)), rows, repeats, model, degree, device, seed)
        finally:
            torch.set_num_threads(previous)
        measured = {"how": "CostModel.calibrate", "model": model, "dims": list(map(int, dims)),
                    "rows": rows, "degree": float(degree), "repeats": repeats,
                    "threads": threads or previous,
                    "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                               else f"cpu ({platform.processor() or platform.machine()}, "
                                    f"{os.cpu_count()} cores)"),
                    "platform": platform.platform(), "torch": str(torch.__version__),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
        return cls(dims=list(dims), measured=measured,
                   **{k: seconds / units for k, (seconds, units) in totals.items()})


def calibration_ops(dims: Sequence[int], rows: int, model: str, degree: float,
                    device: torch.device, seed: int = 0
                    ) -> Dict[str, List[Tuple[Callable[[], Tensor], float]]]:
    r"""Per constant of :meth:`CostModel.calibrate`, one ``(operation,
    units)`` per layer: the operation (returning its result) and the units
    of the constant it performs."""
    aggregation, matrices = MODEL_KINDS[model]
    g = torch.Generator().manual_seed(seed)
    num_edges = max(int(round(rows * degree)), 1)
    dst = (torch.arange(num_edges) % rows).sort().values
    src = torch.randint(0, rows, (num_edges, ), generator=g)
    adj = csr(torch.stack([src, dst]), None, rows, rows).to(device)
    src, dst = src.to(device), dst.to(device)
    weight = torch.rand(num_edges, 1, generator=g).to(device)
    K = len(dims) - 1
    ops: Dict[str, List[Tuple[Callable[[], Tensor], float]]] = {k: [] for k in CONSTANTS}

    def randn(*shape: int, grad: bool = False) -> Tensor:
        return torch.randn(*shape, generator=g).to(device).requires_grad_(grad)

    for k in range(1, K + 1):
        d_in, d_out = dims[k - 1], dims[k]
        x, grad = randn(rows, d_in, grad=True), randn(rows, d_in)
        if aggregation == "messages":
            def aggregate(x=x, grad=grad, d=d_in):
                out = torch.zeros(rows, d, device=device).index_add_(
                    0, dst, x.index_select(0, src) * weight)
                return torch.autograd.grad(out, x, grad)[0]
        else:
            def aggregate(x=x, grad=grad, reduce=aggregation):
                return torch.autograd.grad(spmm(adj, x, reduce=reduce), x, grad)[0]
        ops["alpha"].append((aggregate, 2.0 * num_edges * d_in))
        width = {"in": d_in, "out": d_out}
        weights = [randn(width[a], width[b]) for a, b in matrices]
        inputs = [randn(rows, width[a]) for a, _ in matrices]
        ops["beta"].append((lambda ws=weights, xs=inputs: _transform(xs, ws),
                            float(rows * d_out * d_in)))
        h, scale = randn(rows, d_out), randn(rows, 1)
        ops["gamma"].append((lambda h=h: torch.relu(h), float(rows * d_out)))
        ops["eta"].append((lambda h=h, s=scale: h * s, float(rows * d_out)))
    logits = randn(rows, dims[-1])
    target = torch.randint(0, dims[-1], (rows, ), generator=g).to(device)

    def loss_grad() -> Tensor:
        z = logits.detach().requires_grad_()
        torch.nn.functional.cross_entropy(z, target, reduction="sum").backward()
        return z.grad
    ops["lam"].append((loss_grad, float(rows * dims[-1])))
    return ops


def _transform(xs: List[Tensor], ws: List[Tensor]) -> Tensor:
    out = xs[0] @ ws[0]
    for x, w in zip(xs[1:], ws[1:]):
        out = out + x @ w
    return out


def _measure(dims: List[int], rows: int, repeats: int, model: str, degree: float,
             device: torch.device, seed: int) -> Dict[str, Tuple[float, float]]:
    r"""Per constant: (best seconds summed over its operations, units).
    The repeats go round all operations in turn, so that a stretch of load
    from other processes slows every constant alike, not one."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    ops = calibration_ops(dims, rows, model, degree, device, seed)
    flat = [(name, fn) for name, items in ops.items() for fn, _ in items]
    best = [float("inf")] * len(flat)
    for repeat in range(repeats + 1):  # the first is a warm-up
        for i, (_, fn) in enumerate(flat):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            if repeat:
                best[i] = min(best[i], time.perf_counter() - start)
    return {name: (sum(t for (n, _), t in zip(flat, best) if n == name),
                   sum(units for _, units in items)) for name, items in ops.items()}


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
