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
the edges, and edge-sized index buffers that fragment the heap).
A plan's adjacency is the same tensor in every layer (and, on the exact
plan, in every step): marked by :func:`keep_transpose` where a plan serves
it, it keeps its transpose for every backward (a mean's with each entry
divided by its row's count: the backward is one sum), built by its first
forward (a sampled plan's graph is new every step: built in backward, its
edge-sized temporaries joined the step's live peak). Any other
graph (a trimmed batch's block, used once) takes torch's path. Which path
a graph takes depends only on where it comes from, never on its history,
so a resumed run computes bit for bit what the uninterrupted one did. The
forward is torch's, the gradient the same sums: equal up to float rounding
(tested against PyG).

A kept graph with more than :data:`BLOCK_COLUMNS` columns multiplies in
column blocks, forward and backward (:func:`column_blocks`): a row-wise
kernel reads the feature rows its entries point at, in no order a cache
can follow; a block's rows (8,192 of them, 4 MiB at 128 features) stay in
the cache while every row of the graph reads them. Each block's product is
torch's reduction kernel; the blocks' outputs are summed in block order,
the same every step.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary
from torch_geometric.utils import spmm as pyg_spmm

from pyg_dist.utils.sparse import csr_tensor, row_pointers


def spmm(adj, x: Tensor, reduce: str = "sum") -> Tensor:
    r"""PyG's :func:`~torch_geometric.utils.spmm`, where :obj:`adj` is a CPU
    CSR matrix without gradient and the reduction a sum or mean, computed
    by torch's reduction kernel (``torch.sparse.mm(adj, x, reduce)``); its
    backward served by the kept transpose where :obj:`adj` is marked by
    :func:`keep_transpose`.

    PyG calls ``torch.sparse.mm(adj, x)`` for a sum (MKL's sparse product,
    which allocates a zero matrix besides its result; ``torch.mm(out=)``
    a temporary of the output's size and 32-bit copies of the indices in
    every call). The reduction kernel writes its output only: the same
    sums, forward and backward 2.1x as fast on a sampled block (23,600 x
    28,000, 5 entries a row, 128 wide: 15.3 against 32.1 ms) and 1.2x on
    100 entries a row; a plan's transposed product 3.1x (4,860 x 18,700
    transposed, 245,000 entries, 64 wide: 2.4 against 7.5 ms), measured
    on one thread. A mean that needs a gradient on an unmarked graph takes
    PyG's path."""
    reduce = "sum" if reduce == "add" else reduce
    if not (isinstance(adj, Tensor) and adj.layout == torch.sparse_csr
            and adj.device.type == "cpu" and reduce in ("sum", "mean") and x.dim() == 2
            and not adj.requires_grad):
        return pyg_spmm(adj, x, reduce)
    grad = x.requires_grad and torch.is_grad_enabled()
    if keeps_transpose(adj):
        if grad:
            return _Aggregate.apply(x, adj, reduce)
        return product(adj, x, reduce)
    if grad and reduce == "mean":
        return pyg_spmm(adj, x, reduce)
    return torch.sparse.mm(adj, x, reduce)


#: What is derived from a CSR graph, kept as long as the graph lives: its
#: transposes (``"sum"``, ``"mean"``) and whether it keeps them (``"keep"``).
_DERIVED = WeakIdKeyDictionary()


def _derived(adj: Tensor) -> dict:
    found = _DERIVED.get(adj)
    if found is None:
        found = _DERIVED[adj] = {}
    return found


def keep_transpose(adj, transpose: Optional[Tensor] = None, blocks: bool = True):
    r"""Marks :obj:`adj` (a graph every layer of a pass aggregates over, a
    plan's) to keep its transpose for :func:`spmm`'s backward (:obj:`transpose`:
    that transpose, known already); returns it. :obj:`blocks`: whether it
    lives long enough to pay for its :func:`column_blocks` (a sampled plan's
    graph, new every step, does not: measured only on the exact plan's), no
    for a piece with its transpose given (used for one round)."""
    if isinstance(adj, Tensor) and adj.layout == torch.sparse_csr:
        derived = _derived(adj)
        derived["keep"] = True
        if transpose is not None:
            derived["sum"] = transpose
            _derived(transpose)["one pass"] = True
        if transpose is not None or not blocks:
            derived["one pass"] = True
    return adj


def kept(adj, reduce: str = "sum") -> Optional[Tensor]:
    r"""The transpose :func:`transposed` keeps for :obj:`adj` and
    :obj:`reduce` (``None``: none is kept)."""
    derived = _DERIVED.get(adj) if isinstance(adj, Tensor) else None
    return None if derived is None else derived.get(reduce)


def keeps_transpose(adj) -> bool:
    r"""Whether :obj:`adj` was marked by :func:`keep_transpose`."""
    derived = _DERIVED.get(adj) if isinstance(adj, Tensor) else None
    return derived is not None and derived.get("keep", False)


class _Aggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, adj: Tensor, reduce: str) -> Tensor:
        # built before the aggregation's output, not in backward beside
        # every activation: its edge-sized temporaries stay off the peak
        ctx.adj_t = transposed(adj, reduce)
        column_blocks(ctx.adj_t, "sum")  # the backward's blocks, for the same reason
        return product(adj, x, reduce)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return product(ctx.adj_t, grad, "sum"), None, None


#: The columns of one block of :func:`column_blocks`: 4 MiB of 128 float
#: features, measured on one thread of an AMD EPYC (1 MiB L2 a core, 32 MiB
#: L3 shared) on ``reddit_shaped(num_nodes=30000)`` (3M entries): 128 wide
#: 2.4x as fast as one pass (61 against 144 ms), 41 wide the same (30
#: against 29 ms). Fixed, not chosen per width, so that a graph keeps one
#: set of blocks and its sums are the same in every use.
BLOCK_COLUMNS = 8192

#: The entries a block's row must hold on average for the block to pay: each
#: block writes a whole output (rows x features) that the next is added to,
#: beside its entries' gathers (a sparse graph of millions of rows, a few
#: entries a row, multiplies in one pass).
BLOCK_ROW_ENTRIES = 8


def product(adj: Tensor, x: Tensor, reduce: str = "sum") -> Tensor:
    r""":math:`\mathbf{A}\mathbf{X}` (a sum, or a mean over each row's
    entries) of a kept graph, by column blocks where they pay
    (:func:`column_blocks`), otherwise in one pass of torch's reduction
    kernel. No gradient flows through it."""
    blocks = column_blocks(adj, reduce)
    if blocks is None:
        return torch.sparse.mm(adj, x, reduce)
    out = None
    for start, block in blocks:
        part = torch.sparse.mm(block, x[start:start + block.size(1)], "sum")
        out = part if out is None else out.add_(part)
    return out


def column_blocks(adj: Tensor, reduce: str = "sum") -> Optional[List[Tuple[int, Tensor]]]:
    r"""The CSR :obj:`adj` cut into blocks of :data:`BLOCK_COLUMNS`
    consecutive columns, ``(first column, block)`` in
    column order, with every entry :math:`a_{ij}` divided by its row's count
    :math:`\max(c_i, 1)` for ``reduce="mean"``: :math:`\mathbf{A}\mathbf{X}
    = \sum_k \mathbf{A}_k \mathbf{X}_k`. ``None`` where blocks do not pay:
    one block, fewer than :data:`BLOCK_ROW_ENTRIES` entries a row and block
    on average, or a graph marked to multiply in one pass
    (:func:`keep_transpose`).

    Built once and kept as long as :obj:`adj` lives; a mean's blocks share
    their indices with a sum's. The
    indices are 32-bit where they fit (torch's forward reduction gives the
    same sums, bit for bit, as with 64-bit ones): a graph's blocks take 8
    bytes an entry besides the graph (4 of column, 4 of value) and 4 a row
    and block (at most half a byte an entry)."""
    num_blocks = -(-adj.size(1) // BLOCK_COLUMNS)
    if num_blocks < 2 or num_blocks * adj.size(0) * BLOCK_ROW_ENTRIES > adj.values().numel():
        return None
    derived = _derived(adj)
    if derived.get("one pass"):
        return None
    found = derived.get(("blocks", reduce))
    if found is None:
        other = derived.get(("blocks", "mean" if reduce == "sum" else "sum"))
        found = derived[("blocks", reduce)] = _cut(adj, _values(adj, reduce), BLOCK_COLUMNS,
                                                   other)
    return found


def _values(adj: Tensor, reduce: str) -> Tensor:
    r""":obj:`adj`'s values, for a mean each divided by its row's count."""
    values = adj.values()
    if reduce != "mean":
        return values
    count = adj.crow_indices().diff()
    return values / count.clamp(min=1).to(values.dtype).repeat_interleave(
        count, output_size=values.numel())


def _cut(adj: Tensor, values: Tensor, columns: int,
         other: Optional[List[Tuple[int, Tensor]]]) -> List[Tuple[int, Tensor]]:
    r"""The column blocks of :obj:`adj` with :obj:`values`; on the indices of
    :obj:`other` (the same graph's blocks for the other reduction) where
    given."""
    crow, col = adj.crow_indices(), adj.col_indices()
    index = torch.int32 if max(adj.size(0), col.numel()) < 2 ** 31 else torch.long
    row = None
    found = []
    for k, start in enumerate(range(0, adj.size(1), columns)):
        stop = min(start + columns, adj.size(1))
        at = ((col >= start) & (col < stop)).nonzero().squeeze(1)  # in row order
        if other is not None:  # the same entries: the other's indices, these values
            block = other[k][1]
            found.append((start, csr_tensor(block.crow_indices(), block.col_indices(),
                                            values[at], block.shape)))
            continue
        if row is None:
            row = torch.repeat_interleave(torch.arange(adj.size(0), dtype=index,
                                                       device=col.device),
                                          crow.diff(), output_size=col.numel())
        found.append((start, csr_tensor(row_pointers(row[at], adj.size(0)).to(index),
                                        (col[at] - start).to(index), values[at],
                                        (adj.size(0), stop - start))))
    return found


def transposed(adj: Tensor, reduce: str = "sum") -> Tensor:
    r"""The CSR transpose of the CSR :obj:`adj`, kept on it; for
    ``reduce="mean"`` with each entry :math:`a_{ij}` divided by its row's
    count :math:`\max(c_i, 1)`, so that the mean's backward is one sum.

    A graph's two transposes share their indices. A mean keeps no plain
    transpose: its values (4 bytes an edge, on a plan's graph for the
    plan's lifetime) would serve no sum. A sum asked of the same graph
    later gets the arrays a first build would have (the same sort), on the
    mean's indices."""
    derived = _derived(adj)
    found = derived.get(reduce)
    if found is not None:
        return found
    if reduce == "sum":
        found = _transpose(adj, derived.get("mean"))
    else:  # mean, from the kept plain transpose or one built for it alone (not kept)
        plain = derived.get("sum")
        plain = _transpose(adj, None) if plain is None else plain
        count = adj.crow_indices().diff().clamp(min=1).to(plain.values().dtype)
        # entry (j, i) of the transpose is a_ij: divided by row i's count
        found = csr_tensor(plain.crow_indices(), plain.col_indices(),
                           plain.values() / count[plain.col_indices()], plain.shape)
    if derived.get("one pass"):  # as the graph it is the transpose of
        _derived(found)["one pass"] = True
    derived[reduce] = found
    return found


def _transpose(adj: Tensor, mean: Optional[Tensor]) -> Tensor:
    r"""The CSR transpose of the CSR :obj:`adj`, on the indices of its kept
    :obj:`mean` transpose where it has one."""
    crow, col = adj.crow_indices(), adj.col_indices()
    order = torch.sort(col, stable=True).indices  # by column, rows stay sorted
    if mean is not None:
        return csr_tensor(mean.crow_indices(), mean.col_indices(), adj.values()[order],
                          mean.shape)
    row = torch.repeat_interleave(torch.arange(adj.size(0), device=col.device),
                                  crow.diff(), output_size=col.numel())
    # the edges (row -> col) sorted by their new row, col; the columns held on
    # their own (a view of a stacked pair kept the pair alive)
    return csr_tensor(row_pointers(col, adj.size(1)), row[order], adj.values()[order],
                      (adj.size(1), adj.size(0)))
