r"""CM-GCN's asynchronous computation across layers (§III-C), forward and
backward: every node row of every layer is computed as soon as the rows it
reads have arrived, with no barrier between layers.

**Readiness.** Exchange :math:`j` (the one layer :math:`j` reads) carries
layer :math:`j-1`'s rows of the nodes peers read. Row :math:`v` of layer
:math:`\ell` is *ready after exchange* :math:`r_\ell(v)`:

.. math::
    r_0(v) = 0, \qquad
    r_\ell(v) = \max\Big(r_{\ell-1}(v),\;
    \max_{u \in \mathcal N_\ell(v)\ \text{inner}} r_{\ell-1}(u),\;
    \ell \cdot [\exists\, \text{halo } u \in \mathcal N_\ell(v)]\Big)

(:math:`\mathcal N_\ell` the in-neighbours in layer :math:`\ell`'s plan; a
row reads its own previous row through the layer's root or self-loop
term). On one graph for every layer this is
:math:`r_\ell(v) = \max(0, \ell - d(v) + 1)` with :math:`d(v)` the length
of the shortest path from any halo node to :math:`v`: the deep interior is
ready before anything arrived. *Stage* :math:`s` of layer :math:`\ell` are
its rows with :math:`r_\ell = s`.

**Forward schedule.** Post exchange 1; compute stage 0 of every layer
(:math:`\ell = 1..K`); then for :math:`s = 1..K`: wait for exchange
:math:`s`, compute layer :math:`s`'s stage :math:`s` (its border), post
exchange :math:`s+1` (layer :math:`s` is complete), compute stage
:math:`s` of the layers above while it travels. Rows are ordered per layer
by stage, so a stage is a contiguous row range of its layer's buffer and
the rows it reads are a prefix of the layer below's buffer (plus the
received halo rows, stored after it, for the border): each stage is
written into its buffer once and read there in place, never concatenated.

**Backward schedule**, the mirror image. The gradient of a layer's halo
rows (from its border stage) travels to their owners while every stage
whose output gradient is complete without it runs: stage :math:`(\ell, s)`
waits for the gradient exchanges of layers :math:`j > \ell` that reach it
(its rows include rows layer :math:`\ell+1` sends, or a stage that reads
it waits), and nothing else. Gradient exchanges start in the order
:math:`K, K-1, \dots, 1` on every rank. Each stage is its own autograd
graph, differentiated in this order inside one
:class:`torch.autograd.Function` (its ``backward`` drives them), so the
order is the schedule's, not the autograd engine's. A stage's sum or mean
aggregation adds its gradient :math:`A^\top \nabla` into the layer
below's gradient buffer in place, with :math:`A^\top` built once per
schedule (one more copy of each layer's graph, kept with the plan).

Every row is computed by the same operations on the same inputs as with a
barrier per layer: the result equals single-process PyG up to the order of
floating-point sums. Dropout draws one mask per stage (a valid dropout, not
the same draws as a whole layer's).

Applies to PyG's :class:`~torch_geometric.nn.models.basic_gnn.BasicGNN`
chains (``jk=None``, ``forward`` not overridden) of
:class:`~torch_geometric.nn.SAGEConv`, :class:`~torch_geometric.nn.GINConv`,
:class:`~torch_geometric.nn.GraphConv` and
:class:`~torch_geometric.nn.GCNConv` on the fused sparse path, with row-wise
modules between layers; :func:`refusal` says why anything else is refused.
"""
import time
from contextlib import nullcontext
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch_geometric.nn.models.basic_gnn import BasicGNN
from torch_geometric.utils import spmm

from pyg_dist.comm import HaloPlan, Transfer
from pyg_dist.nn.conv.gcn_conv import gcn_graph
from pyg_dist.nn.engine import OverlapEngine
from pyg_dist.nn.norm import NORMS
from pyg_dist.nn.spec import ROW_WISE_NORMS, layer_names, spec_of
from pyg_dist.nn.state import LayerState, state_of
from pyg_dist.utils import csr_tensor
from pyg_dist.utils.sparse import run_positions, valid_sparse

#: Aggregations whose backward is a scaled transposed product (see _Aggregate).
SCALED = ("sum", "add", "mean")


def refusal(model: torch.nn.Module) -> Optional[str]:
    r"""Why :obj:`model` cannot run asynchronously across layers
    (``None``: it can)."""
    if not isinstance(model, BasicGNN):
        return (f"'{type(model).__name__}' is not a PyG BasicGNN (GraphSAGE, GCN, GIN, ...): "
                f"only a chain of layers can be scheduled across layers")
    if type(model).forward is not BasicGNN.forward:
        return f"'{type(model).__name__}' overrides BasicGNN.forward"
    if model.jk_mode is not None or hasattr(model, "lin"):
        return "jumping knowledge (jk) reads every layer's rows at the end"
    for i, conv in enumerate(model.convs):
        spec = spec_of(conv)
        if spec is None or not spec.node_schedule or not conv.fuse:
            return (f"layer convs.{i} ({type(conv).__name__}) is not one of "
                    f"{', '.join(sorted(layer_names(node_schedule=True)))} on the fused "
                    f"sparse path (per-edge layers such as GAT exchange first)")
        for name, m in conv.named_modules():
            if type(m) in NORMS or isinstance(m, tuple(NORMS.values())):
                return (f"'convs.{i}.{name}' ({type(m).__name__}) takes statistics over all "
                        f"rows of a layer")
    for i, norm in enumerate(model.norms):
        if not isinstance(norm, ROW_WISE_NORMS):
            return (f"'norms.{i}' ({type(norm).__name__}) is not row-wise: it needs every row "
                    f"of a layer before any row of the next (supported: none, torch.nn "
                    f"LayerNorm, RMSNorm)")
    if not isinstance(model.dropout, torch.nn.Dropout):
        return "the dropout is not a torch.nn.Dropout"
    return None


_TWICE = ("overlap='nodes': a pass is differentiated once (backward with retain_graph=True "
          "cannot run it again)")


class ScheduledGNN:
    r"""Mixed into the class of a BasicGNN distributed with
    ``overlap="nodes"``: its forward runs asynchronously across layers
    where :meth:`NodesEngine.applies`, else as BasicGNN's."""

    def forward(self, x: Tensor, edge_index, edge_weight=None, edge_attr=None, batch=None,
                batch_size=None, num_sampled_nodes_per_hop=None,
                num_sampled_edges_per_hop=None) -> Tensor:
        extras = (edge_weight, edge_attr, batch, batch_size, num_sampled_nodes_per_hop,
                  num_sampled_edges_per_hop)
        engine: NodesEngine = self.dist_engine
        if all(e is None for e in extras) and engine.applies(x, edge_index):
            return engine.run(x, edge_index)
        return super().forward(x, edge_index, *extras)


_SCHEDULED: Dict[type, type] = {}


def scheduled_class(cls: type) -> type:
    r""":obj:`cls` (a BasicGNN class) with :class:`ScheduledGNN` first, made
    once per class and named as :obj:`cls`."""
    if issubclass(cls, ScheduledGNN):
        return cls
    made = _SCHEDULED.get(cls)
    if made is None:
        made = _SCHEDULED[cls] = type(cls.__name__, (ScheduledGNN, cls), {
            "__module__": __name__, "__qualname__": cls.__qualname__})
    return made


class Layer(NamedTuple):
    r"""One layer's rows ordered by stage (layer 0: the input rows)."""
    num_rows: int
    num_recv: int  # halo rows the next layer's exchange brings (after num_rows)
    order: Tensor  # sorted position -> row
    position: Tensor  # row -> sorted position
    ptr: List[int]  # stage s: sorted positions ptr[s]..ptr[s+1]
    identity: bool  # order is 0..num_rows-1


class Stage(NamedTuple):
    r"""Rows ``start..end`` (sorted) of layer ``layer`` at stage ``stage``:
    their CSR block over the first ``width`` rows of the layer below's
    buffer, and where their own previous rows are in it."""
    layer: int
    stage: int
    start: int
    end: int
    block: Tensor
    width: int
    self_rows: Union[slice, Tensor]


class Schedule:
    r"""What a pass on a set of layer plans needs, built once per set of
    plans: each layer's stages, their blocks, the rows each exchange
    sends, and which stages hold sent rows."""

    def __init__(self, layers: List[Layer], stages: Dict[Tuple[int, int], Stage],
                 send_position: List[Tensor], plans: List[HaloPlan], keys: List[str],
                 adjacency: List[Tensor]) -> None:
        self.layers, self.stages, self.send_position = layers, stages, send_position
        self.plans, self.keys, self.adjacency = plans, keys, adjacency
        self.num_layers = len(plans)
        self.aggr: List[Optional[str]] = [None] * self.num_layers  # set by NodesEngine
        self._transposed: Dict[Tuple[int, int], Tuple[Tensor, Optional[Tensor]]] = {}
        # (l, s) -> whether stage s of layer l (l < K) holds rows exchange l+1 sends
        self.sends: Dict[Tuple[int, int], bool] = {}
        for l in range(self.num_layers):
            ptr, pos = layers[l].ptr, send_position[l + 1]
            for s in range(len(ptr) - 1):
                self.sends[l, s] = bool(((pos >= ptr[s]) & (pos < ptr[s + 1])).any())

    def transposed(self, l: int, stage: int) -> Tuple[Tensor, Optional[Tensor]]:
        r"""Stage ``(l, stage)``'s block transposed (CSR) and, for a mean
        aggregation, one over each target row's entries (a column)."""
        hit = self._transposed.get((l, stage))
        if hit is None:
            block = self.stages[l, stage].block
            scale = None
            if self.aggr[l - 1] == "mean":
                scale = 1 / block.crow_indices().diff().clamp(min=1).to(block.dtype)
                scale = scale.unsqueeze(1)
            with valid_sparse():  # the transpose of a valid CSR block
                transposed = block.transpose(0, 1).to_sparse_csr()
            hit = self._transposed[l, stage] = (transposed, scale)
        return hit

    def rows_per_stage(self) -> List[List[int]]:
        r"""Rows of each stage of each layer ``1..K``."""
        return [[b - a for a, b in zip(layer.ptr[:-1], layer.ptr[1:])]
                for layer in self.layers[1:]]

    @classmethod
    def build(cls, plans: List[HaloPlan], adjacency: List[Tensor],
              keys: List[str]) -> "Schedule":
        num_layers = len(plans)
        sizes = [a.size(0) for a in adjacency]
        device = adjacency[0].device
        # readiness r_l per layer
        ready = [torch.zeros(sizes[0], dtype=torch.long, device=device)]
        for l, adj in enumerate(adjacency, 1):
            n, below = adj.size(0), ready[-1]
            crow, col = adj.crow_indices(), adj.col_indices()
            row = torch.repeat_interleave(torch.arange(n, device=device), crow.diff(),
                                          output_size=col.numel())
            halo = col >= n
            value = torch.where(halo, l, below[col.clamp(max=max(n - 1, 0))])
            r = below[:n].clone()
            ready.append(r.scatter_reduce_(0, row, value, "amax"))
        # One base order (the last layer's stage most significant) from which
        # each layer's order is a stable sort by its own stage: on one graph
        # for all layers every layer gets the same order (depth descending).
        base_key = torch.zeros(sizes[0], dtype=torch.long, device=device)
        radix = num_layers + 2
        for l in range(1, num_layers + 1):
            full = torch.full((sizes[0], ), l + 1, dtype=torch.long, device=device)
            full[:sizes[l - 1]] = ready[l]
            base_key += full * radix ** (l - 1)
        base = torch.argsort(base_key, stable=True)
        layers: List[Layer] = []
        for l in range(num_layers + 1):
            n = sizes[0] if l == 0 else sizes[l - 1]
            rows = base if l == 0 else base[base < n]
            order = rows[torch.argsort(ready[l][rows], stable=True)]
            if layers and layers[-1].num_rows == n and torch.equal(layers[-1].order, order):
                order, position = layers[-1].order, layers[-1].position  # shared: one block matrix
            else:
                position = torch.empty_like(order)
                position[order] = torch.arange(n, device=device)
            counts = torch.bincount(ready[l], minlength=l + 1).tolist()
            ptr = [0]
            for c in counts:
                ptr.append(ptr[-1] + c)
            num_recv = plans[l].num_recv if l < num_layers else 0
            identity = bool(torch.equal(order, torch.arange(n, device=device)))
            layers.append(Layer(n, num_recv, order, position, ptr, identity))
        stages: Dict[Tuple[int, int], Stage] = {}
        memo: Dict[Any, Tuple[Tensor, Tensor, Tensor]] = {}
        for l in range(1, num_layers + 1):
            layer, below = layers[l], layers[l - 1]
            matrix = cls._sorted_matrix(adjacency[l - 1], layer, below, memo)
            crow, col, value = matrix
            for s in range(l + 1):
                a, b = layer.ptr[s], layer.ptr[s + 1]
                width = below.ptr[s + 1] if s < l else below.num_rows + below.num_recv
                e0, e1 = int(crow[a]), int(crow[b])
                block = csr_tensor(crow[a:b + 1] - e0, col[e0:e1], value[e0:e1],
                                   (b - a, width))
                if e1 > e0 and int(col[e0:e1].max()) >= width:  # the readiness argument
                    raise RuntimeError(f"layer {l} stage {s} reads rows not ready yet")
                mine = below.position[layer.order[a:b]]
                if b > a and int(mine.max()) >= width:
                    raise RuntimeError(f"layer {l} stage {s}: its own rows are not ready")
                first = int(mine[0]) if b > a else 0
                contiguous = b == a or torch.equal(
                    mine, torch.arange(first, first + b - a, device=device))
                stages[l, s] = Stage(l, s, a, b, block, width,
                                     slice(first, first + b - a) if contiguous else mine)
        send_position = [torch.empty(0, dtype=torch.long, device=device)]
        for l in range(1, num_layers + 1):
            send_position.append(layers[l - 1].position[plans[l - 1].send_index])
        return cls(layers, stages, send_position, plans, keys, adjacency)

    @staticmethod
    def _sorted_matrix(adj: Tensor, layer: Layer, below: Layer, memo: Dict):
        r"""``adj`` with rows in :obj:`layer`'s order, inner columns in
        :obj:`below`'s and halo columns after :obj:`below`'s rows,
        columns sorted within each row (shared by layers with the same
        graph and orders)."""
        key = (id(adj), id(layer.order), id(below.position), below.num_rows)
        if key in memo:
            return memo[key][1:]
        crow, col, value = adj.crow_indices(), adj.col_indices(), adj.values()
        n = adj.size(0)
        deg = crow.diff()[layer.order]
        new_crow = torch.zeros(n + 1, dtype=crow.dtype, device=crow.device)
        new_crow[1:] = deg.cumsum(0)
        total = int(new_crow[-1])
        entry = run_positions(crow[layer.order] - new_crow[:-1], deg, total)
        old = col[entry]
        new_col = torch.where(old < n, below.position[old.clamp(max=max(n - 1, 0))],
                              old - n + below.num_rows)
        row = torch.repeat_interleave(torch.arange(n, device=crow.device), deg,
                                      output_size=total)
        sort = torch.argsort(row * (below.num_rows + below.num_recv) + new_col)
        out = (new_crow, new_col[sort], value[entry][sort])
        memo[key] = (adj, ) + out  # keeps adj alive: its id stays its own
        return out


class NodesEngine(OverlapEngine):
    r"""``"nodes"``: runs a distributed BasicGNN's passes asynchronously
    across layers (see the module's docstring); a pass it does not apply
    to (:meth:`applies`) runs layer by layer as :class:`OverlapEngine`.

    :attr:`trace`: set to a list to record every pass's events in order,
    each ``(event, layer or exchange, stage, rows, start, end)`` with
    ``time.perf_counter`` times: ``"stage"`` (a stage computed),
    ``"post"`` / ``"wait"`` (an exchange started / waited for) and, in
    the backward, ``"stage_backward"``, ``"grad_post"``, ``"grad_wait"``.
    """
    name = "nodes"
    summary = ("every row of every layer is computed as soon as the rows it reads arrived "
               "(CM-GCN across layers)")
    stale_caches = False  # their rows are exchanged on the cache's own schedule
    feature_cache = False  # it exchanges every layer's rows itself
    precompute = False
    asynchronous_exchange = True

    def __init__(self, ctx, model: torch.nn.Module,
                 memory_budget: Optional[int] = None) -> None:
        super().__init__(ctx, model, memory_budget)
        self.trace: Optional[List[Tuple]] = None

    @classmethod
    def check(cls, model: torch.nn.Module, exchange) -> None:
        r"""Refuses, before any work, a model ``overlap="nodes"`` cannot
        schedule exactly (:func:`refusal`; :class:`NotImplementedError`)."""
        why = refusal(model)
        if why is not None:
            raise NotImplementedError(f"overlap='nodes' cannot schedule this model across "
                                      f"layers: {why}")

    def model_class(self, module: torch.nn.Module) -> Optional[type]:
        return scheduled_class(type(module)) if module is self.model else None

    def may_project(self, layer: torch.nn.Module, x_src: Tensor) -> bool:
        r"""Only where PyG's order projects first (GCN): the schedule's
        buffers hold what PyG's order exchanges."""
        return state_of(layer).spec.transform_first and super().may_project(layer, x_src)

    @property
    def convs(self) -> List[LayerState]:
        return [state_of(conv) for conv in self.model.convs]

    def applies(self, x: Any, edge_index) -> bool:
        r"""Whether this pass runs asynchronously: the model is given
        this rank's rows and the partition's (or the batch's) graph, more
        than one rank exchanges, the cache is exact, and no layer carries
        a hook of the user's (its output could depend on being called
        once per layer)."""
        ctx = self.ctx
        if not isinstance(x, Tensor) or ctx.world_size == 1 or not dist.is_initialized() \
                or not ctx.is_local_graph(edge_index) or ctx.active_cache.stale:
            return False
        plans = self._plans()
        if any(p.skip_exchange for p in plans):
            return False
        first = plans[0]
        if x.size(0) != first.num_inner and not (first.trim_input
                                                 and x.size(0) > first.num_inner):
            return False  # the usual forward raises the usual error
        for state in self.convs:
            conv, mine = state.module, {handle.id for handle in state.hooks}
            if conv._forward_hooks.keys() - mine or conv._forward_pre_hooks.keys() - mine:
                return False
        return True

    def _plans(self) -> List[HaloPlan]:
        ctx = self.ctx
        out = []
        for state in self.convs:
            ctx.enter(state)
            out.append(ctx.plan)
        return out

    def schedule(self, edge_index, dtype: torch.dtype) -> Schedule:
        r"""The :class:`Schedule` of the current plans (built once per set
        of plans and graph; building a sampled plan's counts as sampling)."""
        ctx = self.ctx
        plans = self._plans()
        # kept with the first layer's plan: it lives as long as the plans
        key = ("async_schedule", id(self), tuple(id(p) for p in plans), id(edge_index), dtype)
        hit = plans[0].cache.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], plans + [edge_index])):
            return hit[1]
        exact = all(p.is_exact for p in plans)
        with ctx.stats.timer("sample") if not exact else nullcontext():
            adjacency, keys = [], []
            for state in self.convs:
                ctx.enter(state)
                adjacency.append(_layer_adjacency(ctx, state, edge_index, dtype))
                # the keys the layer-by-layer engines count its exchange under
                keys.append(state.key if state.spec.normalisation == "gcn"
                            else f"{state.key}.x")
            built = Schedule.build(plans, adjacency, keys)
            built.aggr = [state.module.aggr for state in self.convs]
        plans[0].cache[key] = (plans + [edge_index], built)
        return built

    def run(self, x: Tensor, edge_index) -> Tensor:
        r"""One asynchronous pass of the model on :obj:`x`."""
        schedule = self.schedule(edge_index, x.dtype)
        ctx = self.ctx
        ctx.stats.count("async_layers", schedule.num_layers)
        params = [p for p in self.model.parameters() if p.requires_grad]
        run = _Pass(self, schedule, params)
        if torch.is_grad_enabled() and (x.requires_grad or params):
            return _AsyncPass.apply(run, x, *params)
        return run.forward(x)


def _layer_adjacency(ctx, state: LayerState, edge_index, dtype: torch.dtype) -> Tensor:
    r"""The CSR a layer aggregates over in the current plan, as the
    layer-by-layer engines build it."""
    conv = state.module
    if state.spec.normalisation == "gcn":
        adj, _ = gcn_graph(ctx, conv, edge_index, None, dtype)
    else:
        adj = ctx.adjacency(edge_index, True, conv.aggr if isinstance(conv.aggr, str) else None)
    if not (isinstance(adj, Tensor) and adj.layout == torch.sparse_csr):
        raise NotImplementedError(f"layer '{state.key}' aggregates over "
                                  f"{type(adj).__name__}, not a CSR adj_t")
    return adj


class _Pass:
    r"""One forward (and its backward) on a :class:`Schedule`."""

    def __init__(self, owner: NodesEngine, schedule: Schedule, params: List[Tensor]) -> None:
        self.owner, self.s = owner, schedule
        self.ctx = owner.ctx
        self.stats = self.ctx.stats
        self.params = params
        self.convs = owner.convs  # the layers' states
        self.buffers: List[Optional[Tensor]] = [None] * (schedule.num_layers + 1)
        # (l, s) -> the rows it read and its own rows (views or a gather of the buffer)
        self.sources: Dict[Tuple[int, int], Tuple[Tensor, Tensor]] = {}
        self.outputs: Dict[Tuple[int, int], Tensor] = {}  # (l, s) -> graph output
        self.pending: Dict[int, Transfer] = {}
        self.x_leaf: Optional[Tensor] = None
        self.grads: List[Optional[Tensor]] = []  # per layer, the gradient of its buffer
        self.x_rows = 0
        self.differentiable = False
        self.done = False

    def _event(self, *event) -> None:
        if self.owner.trace is not None:
            self.owner.trace.append(event)

    # ---- forward -------------------------------------------------------------
    def forward(self, x: Tensor, differentiable: bool = False) -> Tensor:
        s, K = self.s, self.s.num_layers
        self.differentiable = differentiable
        self.x_rows = x.size(0)
        self._input(x)
        self._post(1)
        for l in range(1, K + 1):
            self._stage(l, 0)
        for stage in range(1, K + 1):
            self._wait(stage)
            self._stage(stage, stage)
            if stage < K:
                self._post(stage + 1)
            for l in range(stage + 1, K + 1):
                self._stage(l, stage)
        last = s.layers[K]
        out = self.buffers[K][:last.num_rows]
        with torch.no_grad():
            return out.clone() if last.identity else out.index_select(0, last.position)

    def _input(self, x: Tensor) -> None:
        layer = self.s.layers[0]
        x = x[:layer.num_rows]
        if self.differentiable and x.requires_grad:
            self.x_leaf = x.detach().requires_grad_()
            x = self.x_leaf
        rows = x if layer.identity else x.index_select(0, layer.order)
        out = self._transform(0, rows)
        self._store(0, 0, out, layer)

    def _transform(self, l: int, rows: Tensor) -> Tensor:
        r"""What layer ``l + 1`` exchanges and aggregates of its input rows:
        GCN's :math:`X\Theta`, the rows themselves otherwise."""
        if l < self.s.num_layers and self.convs[l].spec.transform_first:
            state = self.convs[l]
            return getattr(state.module, state.spec.neighbour_weight)(rows)
        return rows

    def _store(self, l: int, stage: int, out: Tensor, layer: Layer) -> None:
        buf = self.buffers[l]
        if buf is None:
            buf = out.new_empty((layer.num_rows + layer.num_recv, ) + tuple(out.shape[1:]))
            if self.differentiable and out.requires_grad:
                buf.requires_grad_()
            self.buffers[l] = buf
        a, b = layer.ptr[stage], layer.ptr[stage + 1]
        # Through .data: rows are written once, before anything reads them,
        # so the views earlier stages saved for backward stay valid.
        buf.data[a:b].copy_(out.detach())
        if self.differentiable and out.requires_grad:
            self.outputs[l, stage] = out

    def _stage(self, l: int, stage: int) -> None:
        st = self.s.stages[l, stage]
        if st.end == st.start and stage > 0:
            return  # stage 0 always runs: it sizes the layer's buffer
        start = time.perf_counter()
        buf = self.buffers[l - 1]
        # The rows read and the targets' own rows, each a view (or gather)
        # of the buffer itself: their gradients go to the buffer's rows,
        # never through a dense gradient of the whole prefix.
        src = buf[:st.width]
        own = buf[st.self_rows] if isinstance(st.self_rows, slice) else \
            buf.index_select(0, st.self_rows)
        state = self.convs[l - 1]
        conv = state.module
        differentiable = self.differentiable and buf.requires_grad
        if differentiable and conv.aggr in SCALED:
            state.aggregation = self._aggregation(l, stage, conv, src)
        try:
            if state.spec.transform_first:  # its rows are transformed: aggregate, add the bias
                out = self.owner.plain(state, st.block, None, x=src, edge_weight=None)
                if conv.bias is not None:
                    out = out + conv.bias
            else:
                state.prepared = True
                try:
                    out = conv.forward((src, own), st.block)
                finally:
                    state.prepared = False
        finally:
            state.aggregation = None
        out = self._between(l, out)
        self._store(l, stage, out, self.s.layers[l])
        if differentiable:
            self.sources[l, stage] = (src, own)
        self._event("stage", l, stage, st.end - st.start, start, time.perf_counter())

    def _aggregation(self, l: int, stage: int, conv, src: Tensor):
        r"""The layer's fused aggregation for one stage: PyG's
        ``spmm(adj_t, x, reduce)``, whose backward adds
        :math:`A^\top (\nabla / |\mathcal N|)` into the gradient of the
        layer below's buffer in place (:class:`_Aggregate`)."""
        def message_and_aggregate(adj_t, x, edge_weight=None):
            rows = x[0] if isinstance(x, (tuple, list)) else x
            if rows is not src or edge_weight is not None:  # e.g. SAGE's project
                return spmm(adj_t, rows, reduce=conv.aggr)
            return _Aggregate.apply(rows, adj_t, conv.aggr, self, l, stage)
        return message_and_aggregate

    def _between(self, l: int, out: Tensor) -> Tensor:
        r"""BasicGNN's row-wise work after layer ``l`` (not the last), then
        the next layer's transform."""
        model = self.owner.model
        if l == self.s.num_layers:
            return out
        if model.act is not None and model.act_first:
            out = model.act(out)
        out = model.norms[l - 1](out)
        if model.act is not None and not model.act_first:
            out = model.act(out)
        out = model.dropout(out)
        return self._transform(l, out)

    def _observe(self, l: int) -> None:
        r"""Samplers that learn from embeddings see layer ``l``'s source
        rows in the plan's order, as without this schedule."""
        ctx = self.ctx
        if not ctx.observers:
            return
        below, plan = self.s.layers[l - 1], self.s.plans[l - 1]
        buf = self.buffers[l - 1].detach()
        inner = buf[below.position[:plan.num_inner]]
        x_src = torch.cat([inner, buf[below.num_rows:below.num_rows + below.num_recv]])
        ctx.enter(self.convs[l - 1])
        ctx.observe(self.s.keys[l - 1], x_src)

    def _post(self, j: int) -> None:
        r"""Starts exchange ``j``: layer ``j - 1``'s rows that peers' layer
        ``j`` reads."""
        plan, key = self.s.plans[j - 1], self.s.keys[j - 1]
        start = time.perf_counter()
        with self.stats.timer("comm"):
            rows = self.buffers[j - 1].detach().index_select(0, self.s.send_position[j])
        self.pending[j] = self.ctx.exchange.start(self.ctx, key, rows, plan.send_counts,
                                                  plan.recv_counts)
        self._event("post", j, None, plan.num_send, start, time.perf_counter())

    def _wait(self, j: int) -> None:
        start = time.perf_counter()
        rows = self.pending.pop(j).wait()
        below = self.s.layers[j - 1]
        self.buffers[j - 1].data[below.num_rows:below.num_rows + below.num_recv].copy_(rows)
        self._event("wait", j, None, below.num_recv, start, time.perf_counter())
        self._observe(j)

    # ---- backward ------------------------------------------------------------
    def backward(self, grad_out: Tensor):
        if self.done:
            raise RuntimeError(_TWICE)
        self.done = True
        s, K = self.s, self.s.num_layers
        grads: List[Optional[Tensor]] = [
            None if buf is None or not buf.requires_grad else torch.zeros_like(buf)
            for buf in self.buffers]
        self.grads = grads  # _Aggregate adds into them
        last = s.layers[K]
        grads[K][:last.num_rows] = grad_out if last.identity else \
            grad_out.index_select(0, last.order)
        exchanged = [j for j in range(1, K + 1) if grads[j - 1] is not None]
        # which gradient exchanges each stage's output gradient waits for
        needs: Dict[Tuple[int, int], set] = {}
        for l in range(K, -1, -1):
            for stage in range(len(s.layers[l].ptr) - 1):
                need = set()
                if l < K:
                    if l + 1 in exchanged and s.sends[l, stage]:
                        need.add(l + 1)
                    for later in range(stage, l + 2):
                        need |= needs[l + 1, later]
                needs[l, stage] = need
        phases: Dict[int, List[Tuple[int, int]]] = {}
        for (l, stage) in self.outputs:
            phase = min(needs[l, stage]) if needs[l, stage] else K + 1
            phases.setdefault(phase, []).append((l, stage))
        param_grads: List[Optional[Tensor]] = [None] * len(self.params)
        x_grad: List[Optional[Tensor]] = [None]
        posted = [K + 1]  # the gradient exchanges from here up have started

        def post_ready() -> None:
            # exchange j leaves once layer j's border stage (the only reader
            # of its halo rows) is differentiated, after every later one
            while posted[0] > 1:
                j = posted[0] - 1
                if j in exchanged and (j, j) in self.outputs:
                    return
                if j in exchanged:
                    self._grad_post(j, grads[j - 1])
                posted[0] = j

        post_ready()
        for phase in range(K + 1, 0, -1):
            if phase <= K and phase in exchanged:
                assert posted[0] <= phase, "gradient exchanges start in order"
                self._grad_wait(phase, grads[phase - 1])
            for l, stage in sorted(phases.get(phase, []), key=lambda t: (-t[0], -t[1])):
                self._stage_backward(l, stage, grads, param_grads, x_grad)
                post_ready()
        self.outputs.clear()
        self.sources.clear()
        self.grads = []
        grad_x = None
        if x_grad[0] is not None:
            grad_x = x_grad[0]
            if self.x_rows > grad_x.size(0):  # a batch's rows past the first layer's
                grad_x = torch.cat([grad_x, grad_x.new_zeros(
                    (self.x_rows - grad_x.size(0), ) + tuple(grad_x.shape[1:]))])
        return grad_x, param_grads

    def _stage_backward(self, l: int, stage: int, grads, param_grads, x_grad) -> None:
        start = time.perf_counter()
        layer = self.s.layers[l]
        a, b = layer.ptr[stage], layer.ptr[stage + 1]
        out = self.outputs.pop((l, stage))
        st = self.s.stages.get((l, stage))
        src, own = (self.x_leaf, None) if l == 0 else self.sources.pop((l, stage), (None, None))
        reads = [t for t in (src, own) if t is not None]
        got = torch.autograd.grad(out, reads + self.params, grads[l][a:b], allow_unused=True)
        got_src = got[0] if src is not None else None
        got_own = got[len(reads) - 1] if own is not None else None
        if got_src is not None:
            if l == 0:
                x_grad[0] = got_src
            else:
                grads[l - 1][:got_src.size(0)] += got_src
        if got_own is not None:
            if isinstance(st.self_rows, slice):
                grads[l - 1][st.self_rows] += got_own
            else:
                grads[l - 1].index_add_(0, st.self_rows, got_own)
        for i, g in enumerate(got[len(reads):]):
            if g is not None:
                param_grads[i] = g if param_grads[i] is None else param_grads[i] + g
        self._event("stage_backward", l, stage, b - a, start, time.perf_counter())

    def _grad_post(self, j: int, grad_below: Tensor) -> None:
        r"""Starts the return of layer ``j``'s halo-row gradients to their
        owners."""
        plan, key = self.s.plans[j - 1], self.s.keys[j - 1]
        below = self.s.layers[j - 1]
        start = time.perf_counter()
        halo = grad_below[below.num_rows:below.num_rows + below.num_recv]
        self.pending[j] = self.ctx.exchange.start(self.ctx, key + ".grad", halo,
                                                  plan.recv_counts, plan.send_counts,
                                                  backward=True)
        self._event("grad_post", j, None, plan.num_recv, start, time.perf_counter())

    def _grad_wait(self, j: int, grad_below: Tensor) -> None:
        r"""Adds the gradients peers return for the rows exchange ``j``
        sent into layer ``j - 1``'s gradient."""
        start = time.perf_counter()
        rows = self.pending.pop(j).wait()
        grad_below.index_add_(0, self.s.send_position[j], rows)
        self._event("grad_wait", j, None, rows.size(0), start, time.perf_counter())


class _Aggregate(torch.autograd.Function):
    r"""``spmm(block, rows, reduce)`` of one stage (PyG's fused
    aggregation) whose backward adds the gradient of :obj:`rows` straight
    into the gradient of the layer below's buffer,
    :math:`\nabla H_{:w} \mathrel{+}= A^\top \operatorname{diag}(s)\,\nabla Y`
    (:math:`s`: 1, or one over each row's entries for a mean), with the
    transposed block built once per schedule; it returns no gradient for
    :obj:`rows` (the pass differentiates stages itself and asks for it)."""

    @staticmethod
    def forward(ctx, rows: Tensor, block: Tensor, reduce: str, run: "_Pass", l: int,
                stage: int) -> Tensor:
        ctx.run, ctx.key = run, (l, stage)
        return spmm(block, rows, reduce=reduce)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        run, (l, stage) = ctx.run, ctx.key
        transposed, scale = run.s.transposed(l, stage)
        if scale is not None:
            grad = grad * scale
        run.grads[l - 1][:transposed.size(0)].addmm_(transposed, grad)
        return None, None, None, None, None, None


class _AsyncPass(torch.autograd.Function):
    r"""A :class:`_Pass` as one autograd node: forward runs the stages
    (each recording its own graph), backward differentiates them in the
    backward schedule and returns the gradients of the input and the
    parameters."""

    @staticmethod
    def forward(ctx, run: _Pass, x: Tensor, *params: Tensor) -> Tensor:
        ctx.run = run
        with torch.enable_grad():
            return run.forward(x, differentiable=True)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        if ctx.run is None:
            raise RuntimeError(_TWICE)
        grad_x, grad_params = ctx.run.backward(grad_out)
        ctx.run = None  # its stages' graphs are freed
        return (None, grad_x, *grad_params)
