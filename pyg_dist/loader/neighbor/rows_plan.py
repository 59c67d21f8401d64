r"""A mini-batch's first layer projected by the owners of its input rows.

A sampled batch of :math:`n` nodes reads :math:`n` input rows of width
:math:`d_{in}`, about half of them from other ranks, and its first layer
projects them all (:math:`n \times d_{in} \times d_{out}` FLOPs forward and
as many for the weight's gradient). When that layer's aggregation is linear
(SAGE's or GraphConv's mean or sum), projecting first is exact
(:math:`\mathrm{aggr}_j(\mathbf{W} \mathbf{x}_j) = \mathbf{W}\,
\mathrm{aggr}_j \mathbf{x}_j`), so the projection can run where the rows
live: every rank projects the rows of its partition that any rank's batch
reads, **once** (the aggregated and the root projection in one product with
:math:`[\mathbf{W}_{agg}; \mathbf{W}_{root}]`), and sends each requester the
projected rows instead of the raw ones:

.. math::
    \mathbf{P}^{W}_r = \mathbf{X}_r[\mathcal{U}_r]\,\mathbf{W}^{\top}, \qquad
    \mathbf{B}^{W} = [\mathbf{P}^{W}_r \,|\, \mathrm{A2A}(\mathbf{P}^{W}_q[
    \mathrm{send}_{q \to r}])_q], \qquad
    \mathbf{h}_i = \mathrm{aggr}_{j \in \mathcal{N}(i)}
    \mathbf{B}^{W_{agg}}_{c(j)} + \mathbf{B}^{W_{root}}_{c(i)} + \mathbf{b}

with :math:`\mathcal{U}_r` the rows of rank :math:`r` that any batch of the
step reads and :math:`c` the batch row's place in :math:`\mathbf{B}`. In
backward the gradients of the received rows travel back to their owners,
which add them to their own rows' and compute the weight's gradient over
:math:`\mathcal{U}_r` once; the all-reduce then sums what every rank
computed, as it summed every rank's batch gradient before. Batches of
different ranks that read the same rows (most of a small graph) share one
projection, the raw rows are never gathered into a batch, and the rows that
travel are :math:`d_{agg} + d_{root}` wide, both ways, instead of
:math:`d_{in}` once. Outputs and gradients equal the pulled batch's up to
float rounding (tested).

The step's exchange is collective: every rank's trainer runs its batch's
first layer at the same step, as the gradient all-reduce already requires.
"""
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parameter import UninitializedParameter

from pyg_dist.comm.halo import extend_rows
from pyg_dist.comm.request import OwnerRequest
from pyg_dist.comm.stats import CommStats
from pyg_dist.nn.spec import linear_parts
from pyg_dist.nn.trim import trims
from pyg_dist.utils import csr_tensor
from pyg_dist.utils.aggregate import spmm
from pyg_dist.utils.gemm import linear

#: An owner projects its whole partition (no gather) when the step reads at
#: least this share of its rows: a row projected for nothing costs about
#: ten times a row gathered (d_out multiply-adds per value read, against one copy).
WHOLE_PARTITION = 0.9


def projects_on_owners(model: Optional[torch.nn.Module], num_features: int) -> bool:
    r"""Whether the neighbour loader's batches for :obj:`model` (a PyG
    ``BasicGNN`` it trims per layer) leave the first layer's projection
    to the rows' owners: the layer qualifies
    (:func:`~pyg_dist.nn.spec.linear_parts`) and its
    projected rows, sent forward and their gradients back, are narrower
    than the :obj:`num_features` raw ones."""
    if model is None or not trims(model):
        return False
    found = linear_parts(model.convs[0])
    if found is None:
        return False
    lins = [found.aggregated] + ([found.root] if found.root is not None else [])
    if any(isinstance(lin.weight, UninitializedParameter) for lin in lins):
        return False
    return 2 * sum(lin.weight.size(0) for lin in lins) < num_features


class RowsPlan:
    r"""Where a batch's input rows are projected and how the projections
    travel (see the module). Built by
    :meth:`~pyg_dist.loader.neighbor.feature_store.PartitionFeatureStore.pull_plan`
    from the batch's feature request:

    * ``own``: the partition rows this rank projects (``None``: all of them);
    * ``send_index``, ``send_counts``, ``recv_counts``: the projected rows
      each peer asked for, as positions in ``own``, and the split sizes of
      the all-to-all (a :class:`~pyg_dist.comm.HaloPlan`'s exchange);
    * ``position``: each batch row's place in ``[own | received]``.

    Calling it, ``plan(conv, block)``, runs the batch's first layer
    :obj:`conv` over :obj:`block` (the rows of the batch's ``adj_t`` the
    layer outputs, columns in batch order), once :meth:`attach` gave it the
    partition's features and the step's process group.
    """
    skip_exchange = False

    def __init__(self, own: Optional[Tensor], num_own: int, position: Tensor,
                 send_index: Tensor, send_counts: List[int], recv_counts: List[int]) -> None:
        self.own, self.num_own, self.position = own, num_own, position
        self.send_index, self.send_counts, self.recv_counts = \
            send_index, send_counts, recv_counts
        self.num_recv = sum(recv_counts)
        self.x: Optional[Tensor] = None
        self.group, self.stats = None, None

    @classmethod
    def of(cls, num_rows: int, local: Tensor, local_rows: Tensor, remote: Tensor,
           served: Tensor, request: OwnerRequest, num_part: int) -> "RowsPlan":
        r"""The plan of a batch of :obj:`num_rows` rows: at :obj:`local` the
        partition rows :obj:`local_rows`, at :obj:`remote` the rows the
        owners answer :obj:`request` with (in its reply order); the owners
        asked this rank for its rows :obj:`served`."""
        read = torch.zeros(num_part, dtype=torch.bool)
        read[local_rows] = True
        read[served] = True
        num_read = int(read.sum())
        if num_read >= WHOLE_PARTITION * num_part:
            own, num_own, place = None, num_part, None
        else:
            own, num_own = read.nonzero().view(-1), num_read
            place = read.cumsum(0) - 1  # a read row's position in own

        def at(rows: Tensor) -> Tensor:
            return rows if place is None else place.index_select(0, rows)

        position = torch.empty(num_rows, dtype=torch.long)
        position[local] = at(local_rows)
        position[remote] = num_own + torch.arange(remote.numel())
        return cls(own, num_own, position, at(served), request.recv_counts,
                   request.send_counts)

    def attach(self, x: Tensor, group, stats: Optional[CommStats]) -> "RowsPlan":
        r"""The partition's input rows :obj:`x` and the step's :obj:`group`
        (bytes counted in :obj:`stats`)."""
        self.x, self.group, self.stats = x, group, stats
        return self

    def __call__(self, conv: torch.nn.Module, block: Tensor) -> Tensor:
        maps = linear_parts(conv)
        if maps is None or self.x is None:
            raise RuntimeError("this batch's first layer is projected by the rows' owners: "
                               "run a model pyg_dist.loader.neighbor.projects_on_owners "
                               "accepts, through a loader that attached the features")
        x_own = self.x if self.own is None else self.x.index_select(0, self.own)
        lins = [maps.aggregated] + ([maps.root] if maps.root is not None else [])
        # one GEMM for both maps ([W_agg; W_root] read x_own once), then one
        # exchange per map: one exchange of both would cost a copy of the
        # whole [own | received] buffer in backward (measured slower)
        weight = torch.cat([lin.weight for lin in lins]) if len(lins) > 1 else lins[0].weight
        parts = [extend_rows(projected, self, self.group, self.stats, "features.rows")
                 for projected in linear(x_own, weight).split(
                     [lin.weight.size(0) for lin in lins], dim=1)]  # [own | received]
        out = spmm(self._columns(block, self.num_own + self.num_recv), parts[0],
                   reduce=conv.aggr)
        if maps.root is not None:
            out = _AddRows.apply(out, parts[1], self.position[:block.size(0)])
        for lin in lins:
            if lin.bias is not None:
                out = out.add_(lin.bias)  # the aggregation's output, not saved by it
        return F.normalize(out, p=2., dim=-1) if maps.normalize else out

    def _columns(self, block: Tensor, num_cols: int) -> Tensor:
        r""":obj:`block` (CSR, columns in batch order) over ``[own | received]``."""
        columns = self.position.index_select(0, block.col_indices())
        return csr_tensor(block.crow_indices(), columns, block.values(),
                          (block.size(0), num_cols))


class _AddRows(torch.autograd.Function):
    r"""``out += rows[index]`` in place. Its backward scatters the gradient
    into a zero buffer with ``index_add_``: autograd's backward of
    ``index_select`` scatters through an index expanded to the gradient's
    shape, 64 bits per value (measured: 5.0 against 2.9 ms, 23,600 of
    28,000 rows of 128, one thread)."""

    @staticmethod
    def forward(ctx, out: Tensor, rows: Tensor, index: Tensor) -> Tensor:
        ctx.mark_dirty(out)
        ctx.save_for_backward(index)
        ctx.num_rows = rows.size(0)
        return out.add_(rows.index_select(0, index))

    @staticmethod
    def backward(ctx, grad: Tensor):
        index, = ctx.saved_tensors
        grad_rows = grad.new_zeros((ctx.num_rows, ) + tuple(grad.shape[1:]))
        return grad, grad_rows.index_add_(0, index, grad), None
