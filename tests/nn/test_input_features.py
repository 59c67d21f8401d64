"""When the layer-0 precompute (and the feature cache) apply is decided by
what the model was given, not by tensor identity: a copy of the partition's
features still qualifies, a transform of them never does."""
import torch
import torch.distributed as dist
from torch_geometric.nn import GCN

import pyg_dist
from tests.conftest import small_graph
from tests.numeric import assert_fp32_close


def precompute_by_input(root: str):
    r"""Per input: the precomputing model's output, the plain model's, and
    the bytes the precomputing model's first layer received."""
    part = pyg_dist.DistData.load(root, dist.get_rank())
    torch.manual_seed(0)
    plain = pyg_dist.nn.distribute(GCN(part.num_features, 8, 2, 4), part)
    torch.manual_seed(0)
    pre = pyg_dist.nn.distribute(GCN(part.num_features, 8, 2, 4), part,
                                 precompute_layer0=True)
    ctx = pre.dist_context
    pre(part.x, part.adj_t)  # aggregates the features once (that exchange is counted here)
    out = {}
    for name, x, declared in (("itself", part.x, None), ("copy", part.x.clone(), None),
                              ("transformed", part.x * 2, None),
                              ("declared features", part.x.clone(), True),
                              ("declared other", part.x, False)):
        pre.comm_stats.reset()
        with ctx.use(ctx.full_plan, input_features=declared):
            y = pre(x, part.adj_t)
        layer0 = sum(v for k, v in pre.comm_stats.bytes_recv.items()
                     if k.startswith("convs.0"))
        out[name] = (y.detach(), plain(x, part.adj_t).detach(), layer0)
    return out, part.num_halo


def test_precompute_follows_the_input_not_its_identity(tmp_path):
    pyg_dist.partition_graph(small_graph(), 2, root=str(tmp_path))
    for results, num_halo in pyg_dist.spawn(precompute_by_input, 2, (str(tmp_path), ),
                                            timeout=120):
        assert num_halo > 0
        for name, (out, want, layer0_bytes) in results.items():
            assert_fp32_close(out, want, msg=name)  # exact whichever path it took
            precomputed = name in ("itself", "copy", "declared features")
            assert (layer0_bytes == 0) == precomputed, (name, layer0_bytes)
