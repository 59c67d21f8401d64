r"""The layer-wise computational graph of a mini-batch, distributed: which
inner nodes each layer computes and which halo rows it exchanges, as a
partition of its own (the batch's sub-partition) so that a batch costs
what its computational graph costs, not what the rank's partition costs."""
from typing import List, NamedTuple, Optional

import torch
from torch import Tensor

from pyg_dist.comm import HaloPlan
from pyg_dist.comm.bitmask import tell_owners
from pyg_dist.data import DistData
from pyg_dist.comm.stats import CommStats


class LayerSelection(NamedTuple):
    r"""What one layer of a batch touches, as masks over the partition."""
    targets: Tensor  # the inner nodes the layer computes
    edge_keep: Tensor  # their in-edges
    halo_keep: Tensor  # halo rows they read
    send_keep: Tensor  # rows of send_index peers read


def walk_layers(data: DistData, targets: Tensor, num_layers: int, group=None,
                stats: Optional[CommStats] = None):
    r"""Walks the batch's computational graph down from layer :math:`K`:
    each layer keeps the in-edges of its targets, receives the halo rows
    they read and tells their owners with one bitmask ``all_to_all``; the
    targets of the layer below are this layer's targets and sources, local
    or asked for by a peer. Returns the selections in model order and the
    inner nodes layer 1 reads (every node the batch touches here)."""
    src, dst = data.edge_index
    num_inner = data.num_inner
    layers: List[LayerSelection] = []
    active = targets.clone()
    for _ in range(num_layers):
        edge_keep = active[dst]
        sources = src[edge_keep]
        halo_keep = torch.zeros(data.num_halo, dtype=torch.bool, device=src.device)
        halo_keep[sources[sources >= num_inner] - num_inner] = True
        send_keep = tell_owners(data, halo_keep, group, stats, key="batch_plan")
        layers.append(LayerSelection(active, edge_keep, halo_keep, send_keep))
        below = active.clone()
        below[sources[sources < num_inner]] = True
        below[data.send_index[send_keep]] = True
        active = below
    return layers[::-1], active


class BatchGraph(NamedTuple):
    r"""A batch's computational graph on this rank: :obj:`data` is the
    sub-partition of the nodes it touches (a :class:`~pyg_dist.DistData`
    whose ``inner_id`` / ``halo_id`` are the partition's ids of its inner
    and halo rows), :obj:`plans` its layer plans, :obj:`targets` the
    batch's nodes among its inner rows (the first ones)."""
    data: DistData
    plans: List[HaloPlan]
    targets: Tensor


def batch_subgraph(data: DistData, targets: Tensor, num_layers: int, group=None,
                   stats: Optional[CommStats] = None) -> BatchGraph:
    r"""The batch's computational graph as a sub-partition: its inner rows
    are the inner nodes the batch touches here, its halo rows those any
    layer receives, its edges those any layer aggregates. Peers'
    sub-partitions agree row for row: a peer sends exactly the rows of the
    union of its per-layer send masks, which match this rank's halo masks
    layer by layer (halo rows keep the partition's order, so stay grouped
    by owner).

    Inner rows are ordered by depth: the batch first, then the nodes the
    layer below it adds, down to the nodes only read as input features. So
    each layer's inputs are a prefix of the rows, and layer :math:`\ell`
    runs on a partition of its own (a *view*: the first rows its targets
    and local sources need, the shared halo, its own edges): it computes
    one row per input row (dense transforms included), and the next layer
    keeps the prefix it needs as it starts (``HaloPlan.trim_input``; the
    layers must form a chain, as PyG's ``BasicGNN`` without ``jk``). The
    model's output has one row per input row of the last layer, the
    batch's nodes first; rows past the batch are not meaningful. Give the
    model ``graph.data.adj_t`` as its graph; per-edge tensors are not
    supported.

    ``x`` is not stored (take ``parent.x[graph.data.inner_id]``), so caching
    every batch's graph costs indices only."""
    layers, inputs = walk_layers(data, targets, num_layers, group, stats)
    device = inputs.device
    num_inner = data.num_inner
    computed_by = torch.stack([s.targets for s in layers]).sum(0)  # nested sets
    candidates = inputs.nonzero().view(-1)
    inner_id = candidates[torch.argsort(-computed_by[candidates] * num_inner + candidates)]
    halo_id = torch.stack([s.halo_keep for s in layers]).any(0).nonzero().view(-1)
    send_keep = torch.stack([s.send_keep for s in layers]).any(0)
    n0 = inner_id.numel()
    new_id = torch.full((num_inner + data.num_halo, ), -1, dtype=torch.long, device=device)
    new_id[inner_id] = torch.arange(n0, device=device)
    new_id[num_inner + halo_id] = n0 + torch.arange(halo_id.numel(), device=device)
    node_id = torch.cat([inner_id, num_inner + halo_id])
    send_owner = torch.repeat_interleave(
        torch.arange(data.num_parts, device=device), data.send_counts,
        output_size=data.send_index.numel())
    fields = dict(
        n_id=data.n_id[node_id], global_id=data.global_id[node_id],
        deg_in=data.deg_in[node_id], deg_out=data.deg_out[node_id],
        **({"has_loop": data.has_loop[node_id]} if "has_loop" in data else {}),
        halo_id=halo_id, halo_owner=data.halo_owner[halo_id],
        send_index=new_id[data.send_index[send_keep]],
        send_counts=torch.bincount(send_owner[send_keep], minlength=data.num_parts),
        recv_counts=torch.bincount(data.halo_owner[halo_id], minlength=data.num_parts),
        num_halo=halo_id.numel(), num_parts=data.num_parts, rank=data.rank)
    union = torch.stack([s.edge_keep for s in layers]).any(0).nonzero().view(-1)
    src, dst = new_id[data.edge_index[:, union]]
    order = torch.argsort(dst * (n0 + halo_id.numel()) + src)
    sub = DistData(edge_index=torch.stack([src[order], dst[order]]), inner_id=inner_id,
                   num_inner=n0, **fields,
                   **{k: data[k][inner_id] for k in ("y", "train_mask", "val_mask",
                                                     "test_mask") if k in data})
    sub.num_nodes = n0
    sub.num_global_nodes = data.num_global_nodes
    sub.adj_t = sub.csr_adj_t(value=torch.ones(order.numel(), dtype=data.adj_t.dtype,
                                               device=device))
    sub_edge = torch.full((data.edge_index.size(1), ), -1, dtype=torch.long, device=device)
    sub_edge[union[order]] = torch.arange(order.numel(), device=device)

    plans = []
    for i, layer in enumerate(layers):
        n = n0 if i == 0 else int(layers[i - 1].targets.sum())  # the layer's input rows
        edges = layer.edge_keep.nonzero().view(-1)
        src, dst = new_id[data.edge_index[:, edges]]
        src = torch.where(src >= n0, src - n0 + n, src)  # halo rows follow the n inputs
        order = torch.argsort(dst * (n + halo_id.numel()) + src)
        view = DistData(edge_index=torch.stack([src[order], dst[order]]),
                        sub_edge=sub_edge[edges[order]], inner_id=inner_id[:n], num_inner=n,
                        **{k: (torch.cat([v[:n], v[n0:]]) if k in ("n_id", "global_id",
                                                                   "deg_in", "deg_out",
                                                                   "has_loop") else v)
                           for k, v in fields.items()})
        view.num_nodes = n
        view.num_global_nodes = data.num_global_nodes
        view.adj_t = sub.adj_t  # the graph a model is given: is_local_graph knows it
        plan = HaloPlan.sampled(view, layer.send_keep[send_keep], layer.halo_keep[halo_id])
        plan.trim_input = True
        plans.append(plan)
    return BatchGraph(sub, plans, torch.arange(n0, device=device) < int(targets.sum()))


def sample_layers(plans: List[HaloPlan], sampled: HaloPlan) -> List[HaloPlan]:
    r"""A batch's layer plans restricted to :obj:`sampled`, a plan that a
    :mod:`~pyg_dist.sampler` drew on the batch's (sub-)partition (e.g. BNS
    on the batch's halo): each layer receives the halo rows it needs that
    the sample kept and aggregates its edges that survive, scaled as the
    sample scales them (unbiased, as on the full graph)."""
    factor = sampled.edge_factor()  # per edge of the batch's sub-partition
    if factor is None:  # the exact plan: nothing dropped
        return plans
    data = sampled.data
    halo = torch.zeros(data.num_halo, dtype=torch.bool, device=factor.device)
    halo[sampled.recv_rows()] = True
    send = torch.zeros(data.send_index.numel(), dtype=torch.bool, device=factor.device)
    send[sampled.send_rows()] = True
    out = []
    for plan in plans:
        halo_keep = torch.zeros_like(halo)
        halo_keep[plan.recv_rows()] = True
        view_factor = factor[plan.data.sub_edge]
        sampled_plan = HaloPlan.sampled(plan.data, plan.send_keep & send, halo_keep & halo,
                                        edge_keep=view_factor > 0, edge_scale=view_factor)
        sampled_plan.trim_input = plan.trim_input
        out.append(sampled_plan)
    return out
