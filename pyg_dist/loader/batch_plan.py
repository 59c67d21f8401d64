r"""The layer-wise computational graph of a mini-batch, distributed: which
inner nodes each layer computes and which halo rows it exchanges."""
from typing import List, Optional

import torch
from torch import Tensor

from pyg_dist.comm import HaloPlan
from pyg_dist.comm.bitmask import tell_owners
from pyg_dist.data import DistData
from pyg_dist.metrics import CommStats


def batch_plans(data: DistData, targets: Tensor, num_layers: int, group=None,
                stats: Optional[CommStats] = None) -> List[HaloPlan]:
    r"""One :class:`~pyg_dist.comm.HaloPlan` per layer for the mini-batch
    whose inner nodes on this rank are :obj:`targets` (a mask over the inner
    nodes; the batch's nodes on other ranks are theirs).

    Layer :math:`K` computes the batch; layer :math:`\ell` computes the
    nodes within :math:`K - \ell` hops of it. Walking down from layer
    :math:`K`, each layer keeps the in-edges of its targets, receives the
    halo rows they read and tells their owners with one bitmask
    ``all_to_all``; the targets of the layer below are this layer's targets
    and sources, local or asked for by a peer. Exact: every kept target
    aggregates all its in-edges, unscaled."""
    src, dst = data.edge_index
    num_inner = data.num_inner
    plans: List[HaloPlan] = []
    active = targets.clone()
    for _ in range(num_layers):
        edge_keep = active[dst]
        sources = src[edge_keep]
        halo_keep = torch.zeros(data.num_halo, dtype=torch.bool, device=src.device)
        halo_keep[sources[sources >= num_inner] - num_inner] = True
        send_keep = tell_owners(data, halo_keep, group, stats, key="batch_plan")
        plans.append(HaloPlan.sampled(data, send_keep, halo_keep, edge_keep=edge_keep))
        below = active.clone()
        below[sources[sources < num_inner]] = True
        below[data.send_index[send_keep]] = True
        active = below
    return plans[::-1]

