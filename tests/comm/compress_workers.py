"""Functions that run inside spawned ranks for tests/comm/test_compress.py."""
import torch
import torch.distributed as dist
import pyg_dist


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
