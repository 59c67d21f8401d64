"""Functions that run inside spawned ranks (importable, as spawn requires)."""
import os
import time

import torch
import torch.distributed as dist

import pyg_dist
from tests.models import MODELS, build_model


def _loss_weight(n_id: torch.Tensor, width: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(123)
    largest = int(n_id.max()) if n_id.numel() else 0
    return torch.randn(largest + 10_000, width, generator=gen)[n_id]


def linear_loss(out: torch.Tensor, n_id: torch.Tensor) -> torch.Tensor:
    r"""A loss that is a sum over nodes with fixed per-node weights, so the
    distributed total is the sum of the ranks' parts."""
    return (out * _loss_weight(n_id, out.size(1))).sum() / 100.0


def linear_loss_magnitude(out: torch.Tensor, n_id: torch.Tensor) -> float:
    r"""The sum of the magnitudes of :func:`linear_loss`'s terms: the scale
    of its rounding (the signed sum may cancel to far less)."""
    return float((out * _loss_weight(n_id, out.size(1))).abs().sum() / 100.0)


def summed_grads(model: torch.nn.Module) -> dict:
    r"""Copies of the weight gradients, summed over the ranks (what the
    all-reduce trains with)."""
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    for grad in grads.values():
        dist.all_reduce(grad)
    return grads


def forward_backward_all(root: str, seed: int):
    r"""Every model of tests/models.py, through edge_index and adj_t: inner
    outputs keyed by original id, the global loss and the summed gradients."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    results = {}
    for name in MODELS:
        for form in ("edge_index", "adj_t"):
            torch.manual_seed(seed)
            model = build_model(name, part.num_features)
            pyg_dist.nn.distribute(model, part)
            out = model(part.x, part[form])
            loss = linear_loss(out, part.n_id[:part.num_inner])
            loss.backward()
            total = loss.detach().clone()
            dist.all_reduce(total)
            grads = summed_grads(model)
            results[name, form] = {"n_id": part.n_id[:part.num_inner],
                                   "out": out.detach(), "loss": float(total),
                                   "grads": grads}
    return results


def die_mid_epoch(root: str, victim: int):
    r"""Trains; the victim rank exits abruptly after its first forward."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    model = pyg_dist.nn.distribute(build_model("GraphSAGE", part.num_features), part)
    for step in range(100):
        out = model(part.x, part.adj_t)
        if step == 1 and dist.get_rank() == victim:
            os._exit(3)
        out.sum().backward()
    return time.time()


def wrong_world_size(root: str):
    pyg_dist.DistData.load(root, dist.get_rank())


SAMPLER_CASES = {"bns": {"p": 0.3}, "vr": {"rate": 0.3, "refresh": 10**9},
                 "dropedge": {"p": 0.3}, "bes": {"p": 0.3}}


def _layer(name: str, in_channels: int) -> torch.nn.Module:
    from torch_geometric.nn import GCNConv, GraphConv, SAGEConv
    torch.manual_seed(0)
    return {"mean": lambda: SAGEConv(in_channels, 4),
            "sum": lambda: GraphConv(in_channels, 4, aggr="add"),
            "gcn": lambda: GCNConv(in_channels, 4)}[name]()


def sampler_checks(root: str, iterations: int):
    r"""Everything the sampler tests assert, from one spawned world."""
    from pyg_dist.comm import HaloPlan, all_to_all
    from pyg_dist.sampler import build_sampler
    part = pyg_dist.DistData.load(root, dist.get_rank())
    out = {"num_halo": part.num_halo, "agree": [], "deterministic": {}, "moments": {}}

    # Sender/receiver agreement: owners send exactly the rows receivers expect.
    for name, params in SAMPLER_CASES.items():
        a = build_sampler(name, part, seed=7, **params)
        b = build_sampler(name, part, seed=7, **params)
        c = build_sampler(name, part, seed=8, **params)
        same, differs = True, False
        for t in range(5):
            plan = a.plan(t)
            got = all_to_all(part.global_id[plan.send_index], plan.send_counts,
                             plan.recv_counts)
            halo = torch.arange(part.num_halo) if plan.halo_index is None else plan.halo_index
            want = part.global_id[part.num_inner + halo]
            used = torch.zeros(plan.num_src, dtype=torch.bool)
            used[plan.edge_index[0]] = True
            out["agree"].append((name, t, torch.equal(got, want),
                                 bool(used[part.num_inner:].all()),
                                 bool((plan.edge_index[0] < plan.num_src).all())))
            plan_b, plan_c = b.plan(t), c.plan(t)
            edge_id = plan.compact().edge_id
            same &= torch.equal(plan.halo_index, plan_b.halo_index) and \
                torch.equal(edge_id, plan_b.compact().edge_id)
            differs |= not torch.equal(edge_id, plan_c.compact().edge_id)
        out["deterministic"][name] = (same, differs)

    # BNS rows exchanged per iteration, and the bytes the exchange counts.
    layer = pyg_dist.nn.distribute(_layer("mean", part.num_features), part)
    ctx, stats = layer.dist_context, layer.comm_stats
    bns = build_sampler("bns", part, seed=1, p=0.1)
    rows, byte_ok = [], True
    with torch.no_grad():
        for t in range(iterations):
            plan = bns.plan(t)
            stats.reset()
            with ctx.use(plan):
                layer(part.x, part.adj_t)
            rows.append(plan.num_recv)
            # SAGEConv(F, 4) aggregates W x_j: the rows travel projected, 4 wide
            byte_ok &= stats.total_bytes_recv == plan.num_recv * 4 * 4
        stats.reset()
        exact = layer(part.x, part.adj_t)
        full_bytes = stats.total_bytes_recv
        stats.reset()
        with ctx.use(build_sampler("bns", part, p=1.0).plan(0)):
            one = layer(part.x, part.adj_t)
        out["p1"] = (torch.equal(exact, one), stats.total_bytes_recv == full_bytes)
        stats.reset()
        with ctx.use(build_sampler("bns", part, p=0.0).plan(0)):
            zero = layer(part.x, part.adj_t)
        isolated = _layer("mean", part.num_features)
        inner = part.edge_index[:, part.edge_index[0] < part.num_inner]
        ref = isolated(part.x, inner, size=(part.num_inner, part.num_inner))
        out["p0"] = (zero, ref, stats.total_bytes_recv)
    out["bns_rows"], out["bns_bytes_ok"] = rows, byte_ok

    # Mean and variance of sampled outputs against the exact output.
    for aggr in ("mean", "sum", "gcn"):
        for form in ("adj_t", "edge_index"):
            layer = pyg_dist.nn.distribute(_layer(aggr, part.num_features), part)
            ctx = layer.dist_context
            with torch.no_grad():
                exact = layer(part.x, part[form])
                for name, params in SAMPLER_CASES.items():
                    sampler = build_sampler(name, part, seed=11, **params)
                    sampler.attach(ctx)
                    layer(part.x, part[form])  # lets VR observe embeddings
                    total = torch.zeros_like(exact)
                    square = torch.zeros_like(exact)
                    for t in range(iterations):
                        with ctx.use(sampler.plan(t)):
                            o = layer(part.x, part[form]).double()
                        total += o
                        square += o * o
                    ctx.observers.clear()
                    mean = total / iterations
                    var = (square / iterations - mean * mean).clamp(min=0)
                    out["moments"][aggr, form, name] = (exact, mean, var)
                if aggr == "sum" and form == "adj_t":  # BNS without its 1/p
                    sampler = build_sampler("bns", part, seed=11, p=0.3)
                    total.zero_()
                    for t in range(iterations):
                        plan = sampler.plan(t)
                        plan = HaloPlan(part, plan.send_index, plan.send_counts,
                                        plan.recv_counts, halo_index=plan.halo_index)
                        with ctx.use(plan):
                            total += layer(part.x, part.adj_t)
                    mean = total / iterations
                    out["moments"][aggr, form, "bns-unscaled"] = (exact, mean, var)
    return out


def precompute_checks(root: str):
    r"""Outputs and layer-0 bytes with and without ``precompute_layer0``."""
    from torch_geometric.nn import GCN, GraphSAGE
    from pyg_dist.sampler import build_sampler
    part = pyg_dist.DistData.load(root, dist.get_rank())
    out = {}
    for name, cls in (("gcn", GCN), ("sage", GraphSAGE)):
        torch.manual_seed(0)
        plain = pyg_dist.nn.distribute(cls(part.num_features, 8, 3, 4), part)
        torch.manual_seed(0)
        pre = pyg_dist.nn.distribute(cls(part.num_features, 8, 3, 4), part,
                                     precompute_layer0=True)
        a = plain(part.x, part.adj_t)
        b = pre(part.x, part.adj_t)
        b.sum().backward()
        grads_finite = all(p.grad is not None for p in pre.parameters())
        pre.comm_stats.reset()
        sampler = build_sampler("bns", part, p=0.5)
        for t in range(3):
            with pre.dist_context.use(sampler.plan(t)):
                pre(part.x, part.adj_t)
        layer0 = {k: v for k, v in pre.comm_stats.bytes_recv.items() if k.startswith("convs.0")}
        out[name] = (b.detach(), a.detach(), grads_finite, layer0,
                     pre.comm_stats.total_bytes_recv)
    return out


def compressed_exchange(root: str):
    r"""Outputs, gradients and bytes of one forward/backward per exchange dtype."""
    from torch_geometric.nn import GraphSAGE
    part = pyg_dist.DistData.load(root, dist.get_rank())
    out = {}
    for dtype in ("fp32", "bf16", "fp16", "int8"):
        torch.manual_seed(0)
        model = pyg_dist.nn.distribute(GraphSAGE(part.num_features, 16, 2, 4), part,
                                       exchange_dtype=dtype)
        for conv in model.convs:  # rows of 12 and 16 (not 4, projected): the codecs' widths
            conv.project_first = False
        y = model(part.x, part.adj_t)
        y.pow(2).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(grads)
        stats = model.comm_stats
        out[dtype] = (y.detach(), grads, dict(stats.bytes_recv))
    return out


def _params(out_dir: str) -> dict:
    return torch.load(os.path.join(out_dir, "model.pt"), weights_only=True)


def resume_runs(root: str, out: str, configs: dict):
    r"""Per config: an uninterrupted run, and the same run stopped after
    half its epochs (checkpointing) then resumed. Returns both runs'
    parameters and losses."""
    import dataclasses
    from pyg_dist.train import train
    results = {}
    for name, config in configs.items():
        whole, parts = f"{out}/{name}-whole", f"{out}/{name}-parts"
        a = train(root, config, whole)
        half = dataclasses.replace(config, epochs=config.epochs // 2, checkpoint_every=1)
        train(root, half, parts)
        b = train(root, dataclasses.replace(config, resume=True, checkpoint_every=1), parts)
        if dist.get_rank() == 0:  # rank 0 wrote the models (the others may be ahead)
            results[name] = (_params(whole), _params(parts), a["final_loss"],
                             b["final_loss"], a["epochs"], b["epochs"])
    return results


def train_and_die(root: str, out: str, config, victim: int, epoch: int):
    r"""Trains; the victim rank exits abruptly in the middle of :obj:`epoch`
    (before it waits for its gradient all-reduce)."""
    import pyg_dist.train as train_module
    from pyg_dist.reducer import GradientReducer
    wait, calls = GradientReducer.wait, [0]

    def dying_wait(self):
        calls[0] += 1
        if calls[0] == epoch and dist.get_rank() == victim:
            os._exit(3)
        return wait(self)

    GradientReducer.wait = dying_wait
    return train_module.train(root, config, out)


def stop_mid_epoch(root: str, victim: int):
    r"""Trains; the victim rank stops itself (SIGSTOP, as a hung device
    would look) after its first forward."""
    import signal
    part = pyg_dist.DistData.load(root, dist.get_rank())
    model = pyg_dist.nn.distribute(build_model("GraphSAGE", part.num_features), part)
    for step in range(100):
        out = model(part.x, part.adj_t)
        if step == 1 and dist.get_rank() == victim:
            os.kill(os.getpid(), signal.SIGSTOP)
        out.sum().backward()


def fail_beside_a_collective(how: str, mark: str):
    r"""Rank 1 fails as :obj:`how` says (``raise``: ``ValueError("boom")``;
    ``kill``: SIGKILL; ``stop``: SIGSTOP; ``sleep``: sleeps ten minutes)
    while rank 0 waits for it in an all-reduce. Each rank first writes the
    time it got there to ``{mark}.{rank}``."""
    import signal
    dist.barrier()  # both ranks are up
    with open(f"{mark}.{dist.get_rank()}", "w") as f:
        f.write(repr(time.time()))
    if dist.get_rank() == 1:
        if how == "raise":
            raise ValueError("boom")
        if how == "sleep":
            time.sleep(600)
        os.kill(os.getpid(), {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}[how])
    dist.all_reduce(torch.ones(1))
