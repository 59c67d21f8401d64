"""Functions that run inside spawned ranks for tests/cache/test_cache.py."""
import random
import time
from contextlib import nullcontext
import torch
import torch.distributed as dist
import pyg_dist
from pyg_dist.cache import FeatureCache, HaloCache, HistoricalCache, PipelineCache
from pyg_dist.comm import all_to_all
from pyg_dist.comm.halo import halo_exchange
from pyg_dist.nn import HaloContext
from pyg_dist.sampler import build_sampler
from tests.models import summed_grads


FEATURES = 5


def _randn(seed: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _smooth(previous, value, gamma, from_zero: bool = False):
    if previous is None and from_zero:
        previous = torch.zeros_like(value)
    return value if previous is None or gamma is None else \
        gamma * previous + (1 - gamma) * value


def pipeline_checks(root: str, tau: int, gamma, sampled: bool, start: str = "sync",
                    iterations: int = 7):
    r"""The rows and gradients a pipelined fetch uses at every iteration,
    and the exact exchanges of the iteration they must come from (zero
    before iteration τ when :obj:`start` is ``"zero"``)."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    rank = dist.get_rank()
    cache = PipelineCache(tau, smooth_features=gamma, smooth_grads=gamma, start=start)
    ctx, exact = HaloContext(part, cache=cache), HaloContext(part)
    if sampled:
        bns = build_sampler("bns", part, seed=3, p=0.5)
        plans = [bns.plan(t) for t in range(iterations + tau)]
    else:
        plans = [ctx.full_plan] * (iterations + tau)
    xs = [_randn(10 * t + rank, part.num_inner, FEATURES) for t in range(iterations)]
    gs = [_randn(1000 + 10 * t + rank, plans[t].num_recv, FEATURES)
          for t in range(iterations)]
    results, hat_rows, hat_grad = [], None, None
    for t in range(iterations):
        x = xs[t].clone().requires_grad_()
        with ctx.use(plans[t], upcoming=plans[t + 1:t + 1 + tau]):
            halo = ctx.fetch("layer", x)
        (halo * gs[t]).sum().backward()
        cache.step()
        s = max(t - tau, 0)  # the iteration the values must come from
        zero = start == "zero" and t < tau  # nothing has arrived yet
        with exact.use(plans[t]):
            rows = exact.fetch("layer", xs[s])
        hat_rows = _smooth(hat_rows, rows * (not zero), gamma, start == "zero")
        target = torch.zeros(part.num_inner, FEATURES, requires_grad=True)
        with exact.use(plans[s]):
            (exact.fetch("layer", target) * gs[s]).sum().backward()
        hat_grad = _smooth(hat_grad, target.grad * (not zero), gamma, start == "zero")
        results.append((t, halo.detach(), hat_rows.detach(), x.grad, hat_grad))
    cache.finish()
    return results


def _grads(model: torch.nn.Module) -> dict:
    return {k: p.grad.clone() for k, p in model.named_parameters()}


class _Replayed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, rows, cache, key, plan):
        ctx.cache, ctx.key, ctx.plan = cache, key, plan
        return rows.clone()

    @staticmethod
    def backward(ctx, grad_halo):
        return ctx.cache.backward(ctx.key, ctx.plan, grad_halo), None, None, None, None


class ReplayCache(HaloCache):
    r"""The pipelined semantics written out literally, as the oracle of
    :class:`PipelineCache`: at iteration :math:`t` a layer gets the exact
    exchange of the rows its input had at iteration :math:`s = \max(t - \tau,
    0)` and the owners add the halo gradients of iteration :math:`s`, each
    smoothed by :math:`\gamma` over the iterations. Synchronous, keeps
    everything, exact plan only."""
    stale = True  # layers exchange their input, as under PipelineCache

    def __init__(self, tau: int, gamma=None) -> None:
        super().__init__()
        self.tau, self.gamma = tau, gamma
        self.inputs, self.halo_grads, self.hat_rows, self.hat_grads = {}, {}, {}, {}

    def fetch(self, key, x, plan, upcoming=()):
        s = max(self.iteration - self.tau, 0)
        self.inputs.setdefault(key, []).append(x.detach())
        with torch.no_grad():
            rows = halo_exchange(self.inputs[key][s], plan, self.ctx.group)
        self.hat_rows[key] = _smooth(self.hat_rows.get(key), rows, self.gamma)
        return _Replayed.apply(x, self.hat_rows[key], self, key, plan)

    def backward(self, key, plan, grad_halo):
        s = max(self.iteration - self.tau, 0)
        self.halo_grads.setdefault(key, []).append(grad_halo)
        received = all_to_all(self.halo_grads[key][s], plan.recv_counts, plan.send_counts,
                              self.ctx.group)
        self.hat_grads[key] = _smooth(self.hat_grads.get(key), received, self.gamma)
        grad = received.new_zeros((self.ctx.num_inner, ) + tuple(received.shape[1:]))
        return grad.index_add_(0, plan.send_index, self.hat_grads[key])


class _JitteredSends:
    r"""Delays every point-to-point send by a random 0-3 ms, so that the
    peers' rows and gradients arrive in other orders than usual."""

    def __init__(self, seed: int) -> None:
        self.rng, self.isend = random.Random(seed), dist.isend

    def __enter__(self):
        def isend(*args, **kwargs):
            time.sleep(self.rng.uniform(0, 0.003))
            return self.isend(*args, **kwargs)
        dist.isend = isend

    def __exit__(self, *exc):
        dist.isend = self.isend


def _frozen_checks(part, cls, tau: int, gamma):
    r"""A pipelined model with frozen weights and the exact one: outputs
    and weight gradients per iteration (equal once the pipeline is full)."""
    models = []
    for cache in (None, PipelineCache(tau, smooth_features=gamma, smooth_grads=gamma)):
        torch.manual_seed(0)
        models.append(pyg_dist.nn.distribute(cls(part.num_features, 8, 3, 4), part,
                                             cache=cache))
    exact, pipe = models
    out_exact = exact(part.x, part.adj_t)
    out_exact.pow(2).sum().backward()
    steps = []
    for t in range(2 * tau + 2):
        pipe.zero_grad()
        out = pipe(part.x, part.adj_t)
        out.pow(2).sum().backward()
        pipe.dist_context.cache.step()
        steps.append((t, out.detach(), summed_grads(pipe)))
    pipe.dist_context.finish()
    return (out_exact.detach(), summed_grads(exact)), steps


def _training_checks(part, cls, tau: int, gamma, iterations: int = 6):
    r"""A pipelined model and the :class:`ReplayCache` oracle trained side
    by side from the same weights, which change every iteration (SGD), and
    the pipelined model again with jittered sends: outputs and weight
    gradients per iteration."""
    runs = []
    for cache, timing in ((PipelineCache(tau, smooth_features=gamma, smooth_grads=gamma),
                           nullcontext()),
                          (ReplayCache(tau, gamma), nullcontext()),
                          (PipelineCache(tau, smooth_features=gamma, smooth_grads=gamma),
                           _JitteredSends(seed=dist.get_rank()))):
        torch.manual_seed(0)
        model = pyg_dist.nn.distribute(cls(part.num_features, 8, 3, 4), part, cache=cache)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        steps = []
        with timing:
            for _ in range(iterations):
                optimizer.zero_grad()
                out = model(part.x, part.adj_t)
                out.pow(2).mean().backward()
                cache.step()
                steps.append((out.detach(), summed_grads(model)))
                optimizer.step()
            model.dist_context.finish()
        runs.append(steps)
    return runs


def pipelined_model_checks(root: str, tau: int, model_name: str, gamma):
    r"""Whole pipelined models: frozen against exact, training against the
    oracle (one world for both)."""
    from torch_geometric.nn import GCN, GraphSAGE
    part = pyg_dist.DistData.load(root, dist.get_rank())
    cls = {"sage": GraphSAGE, "gcn": GCN}[model_name]
    return {"frozen": _frozen_checks(part, cls, tau, gamma),
            "training": _training_checks(part, cls, tau, gamma)}


def dropout_after_exchange(root: str):
    r"""Under a stale cache a layer sends its peers the rows of its input
    *before* the model's dropout and drops the rows it receives itself."""
    from torch_geometric.nn import GraphSAGE
    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    model = pyg_dist.nn.distribute(GraphSAGE(part.num_features, 64, 2, 4, dropout=0.5),
                                   part, cache=PipelineCache(1))
    ctx, seen, sent, undropped = model.dist_context, {}, {}, []
    ctx.observers.append(lambda key, x_src, plan: seen.__setitem__(
        key, x_src[part.num_inner:].detach()))
    model.dropout.register_forward_hook(lambda m, inputs, out: undropped.append(inputs[0]))
    start = ctx.cache._start

    def record_and_start(key, x, plan):
        sent[key] = x
        return start(key, x, plan)
    ctx.cache._start = record_and_start
    model(part.x, part.adj_t).sum().backward()
    ctx.finish()
    return {"sent_undropped": torch.equal(sent["convs.1.x"], undropped[0].detach()),
            "input_zeros": float((undropped[0] == 0).float().mean()),
            "halo_zeros": float((seen["convs.1.x"] == 0).float().mean())}


def historical_checks(root: str, bound: str, sampled: bool, iterations: int = 9,
                      exchange: str = "halo"):
    r"""Training with SANCUS's cache: per iteration and layer, the bytes
    that travelled, and the cache's age / gap counters and logs."""
    from torch_geometric.nn import GraphSAGE
    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    cache = HistoricalCache(bound, record=True)
    model = pyg_dist.nn.distribute(GraphSAGE(part.num_features, 16, 3, 4), part,
                                   cache=cache, exchange=exchange)
    ctx, stats = model.dist_context, model.comm_stats
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    bns = build_sampler("bns", part, seed=5, p=0.5) if sampled else None
    rounds, saved = [], 0
    for t in range(iterations):
        saved += stats.counts["bytes_saved"]
        stats.reset()
        optimizer.zero_grad()
        with ctx.use(bns.plan(t) if bns else ctx.full_plan):
            model(part.x, part.adj_t).pow(2).mean().backward()
        cache.step()
        optimizer.step()
        rounds.append({k: v for k, v in stats.bytes_recv.items() if not k.endswith(".grad")
                       and k.startswith("convs")})
    logs = {k: h.log for k, h in cache.history.items()}
    return {"rounds": rounds, "max_age": dict(cache.max_age),
            "max_gap": dict(cache.max_gap), "logs": logs, "rank": dist.get_rank(),
            "saved": saved + stats.counts["bytes_saved"]}


def feature_cache_checks(root: str, policy: str, capacity: str, iterations: int = 4):
    r"""A layer served by the feature cache under VR plans against the same
    layer exchanging every row; hits and bytes against the plan."""
    from torch_geometric.nn import SAGEConv
    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    layer = SAGEConv(part.num_features, 4)
    feature_cache = FeatureCache(policy, capacity, seed=1)
    cached_layer = pyg_dist.nn.distribute(layer, part, feature_cache=feature_cache)
    torch.manual_seed(0)
    plain = pyg_dist.nn.distribute(SAGEConv(part.num_features, 4), part)
    plain.project_first = False  # as the cached layer, which exchanges the features as they are
    vr = build_sampler("vr", part, seed=2, rate=0.3)
    feature_cache.attach(cached_layer.dist_context, vr)
    stats, out = cached_layer.comm_stats, []
    for t in range(iterations):
        plan = vr.plan(t)
        stats.reset()
        with cached_layer.dist_context.use(plan):
            a = cached_layer(part.x, part.adj_t)
        with plain.dist_context.use(plan):
            b = plain(part.x, part.adj_t)
        gen = feature_cache.generation
        hits = int(gen.cached[plan.recv_rows()].sum())
        out.append({"out": a.detach(), "want": b.detach(), "hits": stats.counts["cache_hits"],
                    "lookups": stats.counts["cache_lookups"], "want_hits": hits,
                    "num_recv": plan.num_recv, "bytes": stats.bytes_recv["SAGEConv.x"]})
    gen = feature_cache.generation
    cached_ids = part.n_id[part.num_inner + gen.cached.nonzero().view(-1)]
    return {"rounds": out, "cached_ids": cached_ids, "cached_rows": gen.rows,
            "inclusion": vr.inclusion_probability(), "cached": gen.cached,
            "num_rows": feature_cache.num_rows(part.x), "num_features": part.num_features}


def pipeline_exception_checks(root: str):
    r"""An exception raised on every rank in the middle of a pipelined
    iteration: after :meth:`HaloContext.finish` no exchange is in flight and
    the model computes exactly again."""
    from torch_geometric.nn import GraphSAGE
    part = pyg_dist.DistData.load(root, dist.get_rank())
    models = []
    for cache in (None, PipelineCache(2)):
        torch.manual_seed(0)
        models.append(pyg_dist.nn.distribute(GraphSAGE(part.num_features, 8, 3, 4),
                                             part, cache=cache))
    exact, pipe = models

    class Boom(RuntimeError):
        pass

    def boom(module, inputs):
        if pipe.dist_context.cache.iteration == 3:
            raise Boom("injected")
    hook = pipe.convs[2].register_forward_pre_hook(boom)
    raised = False
    try:
        for _ in range(5):
            pipe(part.x, part.adj_t).sum().backward()
            pipe.dist_context.cache.step()
    except Boom:
        raised = True
    pipe.dist_context.finish()
    hook.remove()
    in_flight = sum(len(p.rows) + len(p.grads) for p in pipe.dist_context.cache.pipes.values())
    with torch.no_grad():
        want = exact(part.x, part.adj_t)
        got_eval = pipe(part.x, part.adj_t)
    got_train = pipe(part.x, part.adj_t)  # a fresh pipeline: synchronous first iteration
    got_train.sum().backward()
    pipe.dist_context.finish()
    return {"raised": raised, "in_flight": in_flight,
            "want": want, "eval": got_eval, "train": got_train.detach()}


def prefetch_checks(root: str, iterations: int = 6, lookahead: int = 2):
    r"""Plans drawn ahead in a background thread (their collectives on a
    group of their own) against the same sampler called in order."""
    from pyg_dist.comm.stats import CommStats
    from pyg_dist.loader import PlanPrefetcher
    part = pyg_dist.DistData.load(root, dist.get_rank())
    out = {}
    for name, params in (("bns", {"p": 0.3}), ("vr", {"rate": 0.3})):
        reference = build_sampler(name, part, seed=4, **params)
        want = [reference.plan(t) for t in range(iterations + lookahead)]
        stats = CommStats()
        prefetcher = PlanPrefetcher(build_sampler(name, part, seed=4, **params), lookahead,
                                    background=True, stats=stats)
        same = True
        for t in range(iterations):
            plan, upcoming = prefetcher.next()
            for got, ref in zip([plan] + upcoming, want[t:t + 1 + lookahead]):
                same &= torch.equal(got.halo_index, ref.halo_index) and \
                    torch.equal(got.send_index, ref.send_index)
            same &= len(upcoming) == lookahead
        prefetcher.close()
        out[name] = (same, stats.bytes_sent["plan"])
    return out


def overlap_checks(root: str):
    r"""Every model with and without interior/border overlap, on the exact
    plan, a BNS plan and a cohesive batch: outputs, weight gradients and
    bytes; and how the rows split."""
    from tests.models import build_model
    from pyg_dist.loader import batch_subgraph
    part = pyg_dist.DistData.load(root, dist.get_rank())
    bns = build_sampler("bns", part, seed=1, p=0.5)
    targets = torch.zeros(part.num_inner, dtype=torch.bool)
    targets[::5] = True
    results = {}
    for name in ("GraphSAGE", "GCN", "GIN", "GraphConv", "GAT"):
        runs = []
        for overlap in (False, True):
            torch.manual_seed(0)
            model = pyg_dist.nn.distribute(build_model(name, part.num_features), part,
                                           overlap=overlap)
            ctx, stats = model.dist_context, model.comm_stats
            batch = batch_subgraph(part, targets, ctx.num_layers)
            cases = {"exact": (ctx.full_plan, part.x, part.adj_t),
                     "bns": (bns.plan(0), part.x, part.adj_t),
                     "batch": (batch.plans, part.x[batch.data.inner_id], batch.data.adj_t)}
            run = {}
            for case, (plans, x, adj) in cases.items():
                model.zero_grad()
                stats.reset()
                with ctx.use(plans):
                    out = model(x, adj)
                out.pow(2).sum().backward()
                run[case] = (out.detach(), _grads(model), stats.total_bytes_recv,
                             stats.counts["overlapped_layers"])
            runs.append(run)
        # per case: (plain, overlapped), each (out, grads, bytes, overlapped layers)
        results[name] = {case: (runs[0][case], runs[1][case]) for case in runs[0]}
    # rows of the exact plan's interior and border parts
    parts = pyg_dist.comm.HaloPlan.full(part).split_rows(part.adj_t)
    results["split"] = [int((adj.crow_indices().diff() > 0).sum()) for adj in parts]
    return results


def stale_layer_records(root: str, model_name: str, tau: int, iterations: int = 4):
    r"""A 2-layer model trained under a :math:`\tau`-stale pipeline cache
    with weights that change every iteration (SGD): per iteration and
    layer, the layer's input rows, its output and its weights."""
    from torch_geometric.nn import GCN, GraphSAGE
    part = pyg_dist.DistData.load(root, dist.get_rank())
    cls = {"sage": GraphSAGE, "gcn": GCN}[model_name]
    torch.manual_seed(0)
    cache = PipelineCache(tau)
    model = pyg_dist.nn.distribute(cls(part.num_features, 8, 2, 4), part, cache=cache)
    records: list = []

    def record(conv, inputs, out):
        records[-1].append((inputs[0].detach().clone(), out.detach().clone(),
                            {k: v.detach().clone() for k, v in conv.state_dict().items()}))
    for conv in model.convs:
        conv.register_forward_hook(record)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(iterations):
        records.append([])
        optimizer.zero_grad()
        model(part.x, part.adj_t).pow(2).mean().backward()
        cache.step()
        optimizer.step()
    model.dist_context.finish()
    return {"inner": part.n_id[:part.num_inner], "halo": part.n_id[part.num_inner:],
            "records": records}


def historical_served_rows(root: str, bounds: list, exchange: str, sampled: bool,
                           iterations: int = 8):
    r"""Per bound, a 3-layer GraphSAGE trained under SANCUS's cache with
    weights that change every iteration (SGD); per iteration and layer this
    rank's true rows (its inner rows, what it owns) and what the cache
    served it: the halo rows, which of the partition's halo rows they are,
    and the version the cache recorded for each."""
    from torch_geometric.nn import GraphSAGE
    part = pyg_dist.DistData.load(root, dist.get_rank())
    bns = build_sampler("bns", part, seed=5, p=0.5) if sampled else None
    runs = {}
    for bound in bounds:
        torch.manual_seed(0)
        cache = HistoricalCache(bound)
        model = pyg_dist.nn.distribute(GraphSAGE(part.num_features, 16, 3, 4), part,
                                       cache=cache, exchange=exchange)
        ctx, records = model.dist_context, []

        def observe(key, x_src, plan, records=records, cache=cache):
            rows = plan.recv_rows()
            records[-1][key] = (x_src[:part.num_inner].detach().clone(),
                                x_src[part.num_inner:].detach().clone(), rows.clone(),
                                cache.history[key].version[rows].clone())
        ctx.observers.append(observe)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for t in range(iterations):
            records.append({})
            optimizer.zero_grad()
            with ctx.use(bns.plan(t) if bns else ctx.full_plan):
                model(part.x, part.adj_t).pow(2).mean().backward()
            cache.step()
            optimizer.step()
        runs[bound] = records
    return {"n_id": part.n_id, "num_inner": part.num_inner, "owner": part.halo_owner,
            "runs": runs}
