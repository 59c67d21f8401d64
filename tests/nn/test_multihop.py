"""Layers that propagate K times (SGC, APPNP, ...) under distribute(): K
exchanges, each counted and each served by the sampler's plan and the cache,
with the whole graph's normalisation."""
import torch
import torch.distributed as dist

import pyg_dist


def multihop_checks(root: str):
    from torch_geometric.nn import APPNP, SGConv
    from pyg_dist.cache import PipelineCache
    from pyg_dist.sampler import build_sampler
    part = pyg_dist.DistData.load(root, dist.get_rank())
    out = {}
    torch.manual_seed(0)
    sgc = pyg_dist.nn.distribute(SGConv(part.num_features, 4, K=3), part)
    sgc(part.x, part.adj_t)
    out["sgc_keys"] = sorted(sgc.comm_stats.bytes_recv)
    # a sampled plan serves every hop; its normalised graph is the plan's
    appnp = pyg_dist.nn.distribute(APPNP(K=4, alpha=0.1), part)
    bns = build_sampler("bns", part, seed=1, p=0.5)
    stats = appnp.comm_stats
    appnp(part.x, part.adj_t)
    exact_bytes = stats.total_bytes_recv
    stats.reset()
    with appnp.dist_context.use(bns.plan(0)):
        appnp(part.x, part.edge_index)
    out["bns_bytes"], out["exact_bytes"] = stats.total_bytes_recv, exact_bytes
    # a pipelined cache keeps one pipe per hop
    torch.manual_seed(0)
    pipe = pyg_dist.nn.distribute(SGConv(part.num_features, 4, K=2), part,
                                  cache=PipelineCache(1))
    for _ in range(3):
        pipe(part.x, part.adj_t).pow(2).sum().backward()
        pipe.dist_context.cache.step()
    out["pipes"] = sorted(pipe.dist_context.cache.pipes)
    pipe.dist_context.finish()
    # cached=True under a sampler would reuse another plan's graph
    cached = pyg_dist.nn.distribute(APPNP(K=2, alpha=0.1, cached=True), part)
    with cached.dist_context.use(bns.plan(0)):
        cached(part.x, part.edge_index)
    try:
        with cached.dist_context.use(bns.plan(1)):
            cached(part.x, part.edge_index)
        out["cached"] = None
    except ValueError as e:
        out["cached"] = str(e)
    return out


def test_k_hops_are_k_exchanges_served_by_sampler_and_cache(graph, tmp_path):
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    for r in pyg_dist.spawn(multihop_checks, 2, (str(tmp_path), ), timeout=120):
        # one exchange per hop, and the halo degrees once ("gcn_norm")
        assert r["sgc_keys"] == ["SGConv.x", "SGConv.x#1", "SGConv.x#2", "gcn_norm"]
        assert 0 < r["bns_bytes"] < 0.8 * r["exact_bytes"]
        assert r["pipes"] == ["SGConv.x", "SGConv.x#1"]
        assert r["cached"] is not None and "cached=True" in r["cached"]
