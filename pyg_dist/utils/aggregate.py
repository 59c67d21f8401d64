r"""Sparse aggregation :math:`\mathbf{A}\mathbf{X}` whose backward keeps the
adjacency's transpose.

On the CPU, ``torch.sparse.mm`` over a CSR :math:`\mathbf{A}` (a sum, or
``reduce="mean"``: each row divided by its number of entries
:math:`c_i`) differentiates with respect to :math:`\mathbf{X}` as

.. math::
    \nabla\mathbf{X} = \mathbf{A}^{\top} \nabla\mathbf{Y}
    \quad\text{(sum)}, \qquad
    \nabla\mathbf{X} = \mathbf{A}^{\top} \mathrm{diag}(1 / \max(c, 1))
    \nabla\mathbf{Y} \quad\text{(mean)},

and builds :math:`\mathbf{A}^{\top}` anew in every backward (a sort of
the edges, and edge-sized index buffers that fragment the heap: issue 35).
A plan's adjacency is the same tensor in every layer (and, on the exact
plan, in every step): marked by :func:`keep_transpose` where a plan serves
it, it keeps its transpose (and row counts) for every backward. Any other
graph (a trimmed batch's block, used once) takes torch's path. Which path
a graph takes depends only on where it comes from, never on its history,
so a resumed run computes bit for bit what the uninterrupted one did. The
forward is torch's, the gradient the same sums: equal up to float rounding
(tested against PyG).
"""
import torch
from torch import Tensor
from torch_geometric.utils import spmm as pyg_spmm

from pyg_dist.utils import csr


def spmm(adj, x: Tensor, reduce: str = "sum") -> Tensor:
    r"""PyG's :func:`~torch_geometric.utils.spmm`, with the backward of a
    CPU CSR :obj:`adj` marked by :func:`keep_transpose` (values without
    gradient, sum or mean) served by its kept transpose.

    Any other CPU CSR sum that needs a gradient (a sampled batch's block)
    runs ``torch.sparse.mm(adj, x, "sum")``, torch's reduction kernel,
    where PyG calls ``torch.sparse.mm(adj, x)`` (MKL's sparse product):
    the same sums, forward and backward 2.1x as fast on a sampled block
    (23,600 x 28,000, 5 entries a row, 128 wide: 15.3 against 32.1 ms) and
    1.2x on 100 entries a row (measured, one thread)."""
    reduce = "sum" if reduce == "add" else reduce
    if not (isinstance(adj, Tensor) and adj.layout == torch.sparse_csr
            and adj.device.type == "cpu" and reduce in ("sum", "mean") and x.dim() == 2
            and not adj.requires_grad and x.requires_grad and torch.is_grad_enabled()):
        return pyg_spmm(adj, x, reduce)
    if getattr(adj, "_dist_keep_transpose", False):
        return _Aggregate.apply(x, adj, reduce)
    return torch.sparse.mm(adj, x, "sum") if reduce == "sum" else pyg_spmm(adj, x, reduce)


def keep_transpose(adj):
    r"""Marks :obj:`adj` (a graph every layer of a pass aggregates over, a
    plan's) to keep its transpose for :func:`spmm`'s backward; returns it."""
    if isinstance(adj, Tensor) and adj.layout == torch.sparse_csr:
        adj._dist_keep_transpose = True
    return adj


class _Aggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, adj: Tensor, reduce: str) -> Tensor:
        ctx.adj, ctx.reduce = adj, reduce
        return _sum(adj, x) if reduce == "sum" else torch.sparse.mm(adj, x, "mean")

    @staticmethod
    def backward(ctx, grad: Tensor):
        adj = ctx.adj
        if ctx.reduce == "mean":
            grad = grad / _row_counts(adj)
        return _sum(transposed(adj), grad), None, None


def _sum(adj: Tensor, x: Tensor) -> Tensor:
    r""":math:`\mathbf{A}\mathbf{X}` into one new buffer: ``torch.sparse.mm``
    allocates a zero matrix and then its result (two buffers of the output's
    size per call); ``mm(out=)`` the same sums into one."""
    return torch.mm(adj, x, out=x.new_empty((adj.size(0), x.size(1))))


def transposed(adj: Tensor) -> Tensor:
    r"""The CSR transpose of the CSR :obj:`adj`, kept on it."""
    found = getattr(adj, "_dist_transposed", None)
    if found is None:
        crow, col = adj.crow_indices(), adj.col_indices()
        row = torch.repeat_interleave(torch.arange(adj.size(0), device=col.device),
                                      crow.diff(), output_size=col.numel())
        order = torch.sort(col, stable=True).indices  # by column, rows stay sorted
        # the edges (row -> col) sorted by their new row, col
        found = csr(torch.stack([row[order], col[order]]), adj.values()[order],
                    adj.size(1), adj.size(0))
        adj._dist_transposed = found
    return found


def _row_counts(adj: Tensor) -> Tensor:
    found = getattr(adj, "_dist_row_counts", None)
    if found is None:
        found = adj.crow_indices().diff().clamp(min=1).unsqueeze(1).to(adj.values().dtype)
        adj._dist_row_counts = found
    return found
