"""Functions that run inside spawned ranks for tests/sampler/test_sampler.py."""
import torch
import torch.distributed as dist
import pyg_dist


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
    r"""Outputs and layer-0 bytes with and without ``precompute_layer0``
    (the halo exchange; and with ``overlap``), and the layers aggregated
    piece by piece in the precomputing models' first passes."""
    from torch_geometric.nn import GCN, GraphSAGE
    from pyg_dist.sampler import build_sampler
    part = pyg_dist.DistData.load(root, dist.get_rank())
    out = {}
    # max folds over the pieces; std does not (its precomputation takes the whole halo)
    for name, cls, kw in (("gcn", GCN, {}), ("sage", GraphSAGE, {}),
                          ("sage max", GraphSAGE, {"aggr": "max"}),
                          ("sage std", GraphSAGE, {"aggr": "std"})):
        torch.manual_seed(0)
        plain = pyg_dist.nn.distribute(cls(part.num_features, 8, 3, 4, **kw), part)
        torch.manual_seed(0)
        pre = pyg_dist.nn.distribute(cls(part.num_features, 8, 3, 4, **kw), part,
                                     precompute_layer0=True)
        a = plain(part.x, part.adj_t)
        b = pre(part.x, part.adj_t)
        # the precomputation's one pass, one peer's rows at a time
        pieces = pre.comm_stats.counts.get("sequential_layers", 0)
        b.sum().backward()
        grads_finite = all(p.grad is not None for p in pre.parameters())
        pre.comm_stats.reset()
        sampler = build_sampler("bns", part, p=0.5)
        for t in range(3):
            with pre.dist_context.use(sampler.plan(t)):
                pre(part.x, part.adj_t)
        layer0 = {k: v for k, v in pre.comm_stats.bytes_recv.items() if k.startswith("convs.0")}
        torch.manual_seed(0)
        overlapped = pyg_dist.nn.distribute(cls(part.num_features, 8, 3, 4, **kw), part,
                                            precompute_layer0=True, overlap="layers")
        c = overlapped(part.x, part.adj_t).detach()
        pieces = (pieces, overlapped.comm_stats.counts.get("sequential_layers", 0))
        out[name] = (b.detach(), a.detach(), grads_finite, layer0,
                     pre.comm_stats.total_bytes_recv, pieces, c)
    return out
