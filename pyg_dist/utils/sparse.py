r"""``torch.sparse`` CSR construction and row gathers, and the distinct
sorted keys edge lists are de-duplicated with."""
import warnings
from contextlib import contextmanager
from typing import Iterator, Optional

import numpy as np
import torch
from torch import Tensor


@contextmanager
def valid_sparse() -> Iterator[None]:
    r"""Silences torch's "Sparse CSR tensor support is in beta" and "Sparse
    invariant checks are implicitly disabled" warnings, for sparse tensors
    this package builds from indices it knows are valid (a user reads them
    as a problem at the end of every run)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly")
        yield


def csr_tensor(crow: Tensor, col: Tensor, value: Tensor, size) -> Tensor:
    r"""``torch.sparse_csr_tensor`` without its invariant check and beta warning."""
    with valid_sparse():
        return torch.sparse_csr_tensor(crow, col, value, size, check_invariants=False)


def csr(edge_index: Tensor, value: Optional[Tensor], num_rows: int, num_cols: int,
        dtype: torch.dtype = torch.float) -> Tensor:
    r"""A ``torch.sparse`` CSR matrix (rows = targets) of an ``edge_index``
    sorted by target; unit values when :obj:`value` is ``None``."""
    src, dst = edge_index
    if value is None:
        value = torch.ones(src.numel(), dtype=dtype, device=src.device)
    return csr_tensor(row_pointers(dst, num_rows), src, value, (num_rows, num_cols))


def row_pointers(row: Tensor, num_rows: int) -> Tensor:
    r"""The CSR row pointers (``crow_indices``) of :obj:`num_rows` rows
    whose entries, sorted by row, lie in rows :obj:`row`."""
    # 64-bit indices: with int32 ones, torch 2.13's CPU backward of PyG's
    # mean aggregation over a 50K x 60K CSR was measured wrong (errors ~5e4).
    crow = torch.zeros(num_rows + 1, dtype=torch.long, device=row.device)
    crow[1:] = torch.bincount(row, minlength=num_rows).cumsum(0)
    return crow


def run_positions(shift: Tensor, count: Tensor, total: int) -> Tensor:
    r"""The positions of runs of entries laid end to end: run :math:`r`
    holds ``count[r]`` entries, and entry :math:`j` (numbered over all
    runs, :obj:`total` of them) of run :math:`r` sits at :math:`j +
    \mathrm{shift}_r`; in :obj:`shift`'s dtype. :obj:`total` spares
    ``repeat_interleave`` sizing its output again."""
    at = torch.repeat_interleave(shift, count, output_size=total)
    return at.add_(torch.arange(total, dtype=at.dtype, device=at.device))


def gather_neighbours(rowptr: Tensor, col: Tensor, nodes: Tensor) -> Tensor:
    r"""``col`` entries of the CSR rows :obj:`nodes`, concatenated."""
    deg = rowptr[nodes + 1] - rowptr[nodes]
    at = run_positions(rowptr[nodes] - (torch.cumsum(deg, 0) - deg), deg, int(deg.sum()))
    return col[at].long()  # col may be uint32 (mapped ParHIP)


def distinct(key: np.ndarray) -> np.ndarray:
    r"""The sorted distinct values of :obj:`key` (sorted in place; sort and
    compare neighbours is ~5x faster than ``np.unique``, which hashes first)."""
    key.sort()
    if key.size == 0:
        return key
    keep = np.empty(key.size, dtype=bool)
    keep[0] = True
    np.not_equal(key[1:], key[:-1], out=keep[1:])
    return key[keep]
