r"""``Exchange``: how a layer's halo rows travel and are aggregated.

A distributed layer needs, besides its inner rows, the rows of its halo
(owned by peers), and sends their gradients back. An exchange decides how:
:meth:`Exchange.fetch` returns the halo rows of a plan (differentiably),
:meth:`Exchange.start_fetch` the same split in two (the rows travel while
the caller computes), :meth:`Exchange.start` moves raw rows without
autograd, and :meth:`Exchange.aggregate_pieces` aggregates a layer one
peer's rows at a time. How a layer aggregates with the rows is its
engine's (:mod:`pyg_dist.nn.engine`); every method an engine calls is
declared here.
Implementations (registered in :data:`pyg_dist.comm.EXCHANGES`):

* :class:`~pyg_dist.comm.halo.PointToPoint` (``"halo"``): each rank sends
  its peers exactly the rows they need; overlaps the transfer with the
  interior targets' aggregation on request;
* :class:`~pyg_dist.comm.broadcast.Broadcast` (``"broadcast"``): CAGNET's
  1-D whole blocks;
* :class:`~pyg_dist.comm.sequential.Sequential` (``"sequential"``): SAR, one
  peer's rows at a time, aggregated piece by piece and never all held.

Each declares, as class attributes, what it does (its capabilities);
:func:`pyg_dist.nn.compat.refusals` is the one place that reads them. A new
exchange is one file with a subclass and one line in the registry.
"""
from typing import Callable, ClassVar, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_dist.comm.compress import RowCodec
from pyg_dist.comm.plan import HaloPlan
from pyg_dist.comm.transfer import Transfer


class Exchange:
    r"""How halo rows travel (see the module). One instance per
    :class:`~pyg_dist.nn.HaloContext`; every method takes the context, whose
    ``group``, ``codec`` and ``stats`` it uses."""
    #: Its key in :data:`pyg_dist.comm.EXCHANGES`.
    name: str = ""
    #: What it does, for refusals ("... moves every rank's whole block").
    summary: ClassVar[str] = ""
    #: Runs on the plans a halo sampler draws (else on the exact plan only).
    sampled_plans: ClassVar[bool] = True
    #: Runs on mini-batch loaders' plans (else on the rank's whole partition).
    minibatch: ClassVar[bool] = True
    #: Serves caches whose rows are stale (PipeGCN, PSC-GCN, SANCUS).
    stale_caches: ClassVar[bool] = True
    #: Serves a feature cache of the input features' halo rows.
    feature_cache: ClassVar[bool] = True
    #: A layer holds its whole halo at once (samplers that learn from the
    #: exchanged rows observe it there).
    holds_halo: ClassVar[bool] = True
    #: Rows travel as the owners' whole blocks (caches then refresh blocks).
    whole_blocks: ClassVar[bool] = False
    #: Rows travel point to point, only to the ranks that need them (a pass
    #: may then take one peer's rows at a time through a sequential exchange
    #: on the same group: the layer-0 precomputation does).
    point_to_point: ClassVar[bool] = False
    #: Layers aggregate piece by piece through :meth:`aggregate_pieces`
    #: (their propagate is run per piece).
    piecewise: ClassVar[bool] = False
    #: Rows travel while the caller computes (:meth:`start_fetch` and
    #: :meth:`start` return before they arrive).
    asynchronous: ClassVar[bool] = False
    #: The aggregations a layer may use on it (``None``: any).
    aggregations: ClassVar[Optional[Tuple[str, ...]]] = None

    def fetch(self, ctx, key: str, x: Tensor, plan: HaloPlan,
              codec: Optional[RowCodec]) -> Tensor:
        r"""The halo rows of :obj:`x` (the plan's inner rows) that
        :obj:`plan` receives, now and differentiably: their gradients
        travel back to the owners. Encoded by :obj:`codec` on the wire
        (``None``: as they are); counted under :obj:`key`."""
        raise NotImplementedError

    def extend(self, ctx, key: str, x: Tensor, plan: HaloPlan) -> Tensor:
        r"""``[x | the halo rows of x]``, exchanged now, exactly and in full
        precision, differentiably: the sources of :obj:`plan`'s graph. By
        default the rows of :meth:`fetch` after :obj:`x`; an exchange may
        build them in one buffer."""
        return torch.cat([x, self.fetch(ctx, key, x, plan, None)], dim=0)

    def start_fetch(self, ctx, key: str, x: Tensor, plan: HaloPlan,
                    codec: Optional[RowCodec]) -> Callable[[], Tensor]:
        r""":meth:`fetch` split in two: the rows leave now and the returned
        function waits for them (differentiably). By default the whole
        fetch happens now (not :attr:`asynchronous`)."""
        rows = self.fetch(ctx, key, x, plan, codec)
        return lambda: rows

    def start(self, ctx, key: str, rows: Tensor, send_counts: List[int],
              recv_counts: List[int], backward: bool = False) -> Transfer:
        r"""Starts moving :obj:`rows` (no autograd): :obj:`send_counts` to
        each peer, :obj:`recv_counts` from each; counted under :obj:`key`
        (:obj:`backward`: as gradients). The per-node engine's transfers."""
        raise NotImplementedError(f"exchange '{self.name}' does not move raw rows")

    def aggregate_pieces(self, ctx, key: str, graph, sources: List[Tensor],
                         others: List[Tensor], run: Callable, aggr: str,
                         module: torch.nn.Module, params: Sequence[Tensor],
                         linear: bool = False) -> Tensor:
        r"""The aggregation of a :attr:`piecewise` exchange: :obj:`run`
        ``(piece, rows, others)`` aggregates one piece of :obj:`graph`
        given its rows of each of :obj:`sources` (see
        :mod:`pyg_dist.comm.sequential`); :obj:`linear`: the aggregation is
        a weighted sum of the one source's rows (its backward recomputes
        nothing)."""
        raise NotImplementedError(f"exchange '{self.name}' does not aggregate piece by piece")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


