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
from pyg_dist.metrics import CommStats


class LayerSelection(NamedTuple):
    r"""What one layer of a batch touches, as masks over the partition."""
    edge_keep: Tensor  # in-edges of the layer's targets
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
        layers.append(LayerSelection(edge_keep, halo_keep, send_keep))
        below = active.clone()
        below[sources[sources < num_inner]] = True
        below[data.send_index[send_keep]] = True
        active = below
    return layers[::-1], active


def batch_plans(data: DistData, targets: Tensor, num_layers: int, group=None,
                stats: Optional[CommStats] = None) -> List[HaloPlan]:
    r"""One :class:`~pyg_dist.comm.HaloPlan` per layer, over the whole
    partition, for the mini-batch whose inner nodes on this rank are
    :obj:`targets` (a mask over the inner nodes; the batch's nodes on other
    ranks are theirs). Exact: every kept target aggregates all its
    in-edges, unscaled. :func:`batch_subgraph` is the same graph on the
    batch's own sub-partition."""
    layers, _ = walk_layers(data, targets, num_layers, group, stats)
    return [HaloPlan.sampled(data, s.send_keep, s.halo_keep, edge_keep=s.edge_keep)
            for s in layers]


class BatchGraph(NamedTuple):
    r"""A batch's computational graph on this rank: :obj:`data` is the
    sub-partition of the nodes it touches (a :class:`~pyg_dist.DistData`
    whose ``inner_id`` / ``halo_id`` are the partition's ids of its inner
    and halo rows), :obj:`plans` its layer plans, :obj:`targets` the
    batch's nodes among its inner rows."""
    data: DistData
    plans: List[HaloPlan]
    targets: Tensor


def batch_subgraph(data: DistData, targets: Tensor, num_layers: int, group=None,
                   stats: Optional[CommStats] = None) -> BatchGraph:
    r"""The batch's computational graph as a sub-partition: its inner rows
    are the inner nodes the batch touches here, its halo rows those any
    layer receives, its edges those any layer aggregates, all relabelled in
    the partition's order (so edges stay sorted by target, halo rows
    grouped by owner). Peers' sub-partitions agree row for row: a peer
    sends exactly the rows of the union of its per-layer send masks, which
    match this rank's halo masks layer by layer.

    Every layer computes the sub-partition's inner rows (a GNN's dense
    transforms run over the batch's nodes, not the rank's); rows a layer
    does not target aggregate nothing and are never read above it.
    ``x`` is not stored (take ``parent.x[graph.data.inner_id]``), so caching
    every batch's graph costs indices only."""
    layers, inner_keep = walk_layers(data, targets, num_layers, group, stats)
    halo_keep = torch.stack([s.halo_keep for s in layers]).any(0)
    send_keep = torch.stack([s.send_keep for s in layers]).any(0)
    edge_keep = torch.stack([s.edge_keep for s in layers]).any(0)
    num_inner = data.num_inner
    inner_id = inner_keep.nonzero().view(-1)
    halo_id = halo_keep.nonzero().view(-1)
    new_id = torch.full((num_inner + data.num_halo, ), -1, dtype=torch.long,
                        device=inner_id.device)
    new_id[inner_id] = torch.arange(inner_id.numel(), device=inner_id.device)
    new_id[num_inner + halo_id] = inner_id.numel() + torch.arange(
        halo_id.numel(), device=inner_id.device)
    node_id = torch.cat([inner_id, num_inner + halo_id])
    send_owner = torch.repeat_interleave(
        torch.arange(data.num_parts, device=inner_id.device), data.send_counts,
        output_size=data.send_index.numel())
    sub = DistData(
        edge_index=new_id[data.edge_index[:, edge_keep]],
        y=data.y[inner_id] if data.y is not None else None,
        **{f"{m}_mask": data[f"{m}_mask"][inner_id] for m in ("train", "val", "test")
           if f"{m}_mask" in data},
        inner_id=inner_id, halo_id=halo_id, n_id=data.n_id[node_id],
        global_id=data.global_id[node_id], halo_owner=data.halo_owner[halo_id],
        deg_in=data.deg_in[node_id], deg_out=data.deg_out[node_id],
        send_index=new_id[data.send_index[send_keep]],
        send_counts=torch.bincount(send_owner[send_keep], minlength=data.num_parts),
        recv_counts=torch.bincount(data.halo_owner[halo_id], minlength=data.num_parts),
        num_inner=inner_id.numel(), num_halo=halo_id.numel(),
        num_parts=data.num_parts, rank=data.rank)
    sub.num_nodes = inner_id.numel()
    sub.num_global_nodes = data.num_global_nodes
    sub.adj_t = sub.csr_adj_t(value=torch.ones(sub.edge_index.size(1), dtype=data.adj_t.dtype,
                                               device=inner_id.device))
    plans = [HaloPlan.sampled(sub, s.send_keep[send_keep], s.halo_keep[halo_keep],
                              edge_keep=s.edge_keep[edge_keep]) for s in layers]
    return BatchGraph(sub, plans, targets[inner_id])


def sample_layers(plans: List[HaloPlan], sampled: HaloPlan) -> List[HaloPlan]:
    r"""A batch's layer plans restricted to :obj:`sampled`, a plan that a
    :mod:`~pyg_dist.sampler` drew on the batch's (sub-)partition (e.g. BNS
    on the batch's halo): each layer receives the halo rows it needs that
    the sample kept and aggregates its edges that survive, scaled as the
    sample scales them (unbiased, as on the full graph)."""
    factor = sampled.edge_factor()
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
        out.append(HaloPlan.sampled(data, plan.send_keep & send, halo_keep & halo,
                                    edge_keep=plan.edge_keep & (factor > 0),
                                    edge_scale=factor))
    return out
