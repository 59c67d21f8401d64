r"""KaMinPar (TeraPart) as a node-to-part assignment backend: it reads the
symmetrised graph from a ParHIP file and compresses it while loading, so
graphs whose uncompressed CSR would not fit beside METIS' work arrays
still partition on one machine."""
import os.path as osp
import tempfile
from typing import Optional

import numpy as np
import torch
from torch import Tensor


def kaminpar_assignment(parhip_path: str, num_parts: int, seed: int = 0,
                        tolerance: float = 0.03, threads: int = 0) -> Tensor:
    r"""Partitions the graph in :obj:`parhip_path` (see
    :mod:`~pyg_dist.partition.parhip`) into :obj:`num_parts` parts of at
    most :math:`(1 + \epsilon) \lceil N / K \rceil` nodes (:obj:`tolerance`
    :math:`\epsilon`) minimising the edge cut, with KaMinPar's memory-efficient
    ``terapart`` configuration on :obj:`threads` threads (0: torch's
    intra-op thread count)."""
    try:
        import kaminpar
    except ImportError:
        raise ImportError("--method kaminpar needs the 'kaminpar' package "
                          "(pip install kaminpar)") from None
    if num_parts == 1:  # the header's node count: nothing to partition
        return torch.zeros(int(np.fromfile(parhip_path, dtype="<u8", count=2)[1]),
                           dtype=torch.long)
    kaminpar.reseed(int(seed))
    graph = kaminpar.load_graph(parhip_path, kaminpar.GraphFileFormat.PARHIP, compress=True)
    partitioner = kaminpar.KaMinPar(threads or torch.get_num_threads(),
                                    kaminpar.terapart_context())
    parts = partitioner.compute_partition(graph, num_parts, tolerance)
    del graph, partitioner  # before the list is copied: not beside it
    return torch.from_numpy(np.fromiter(parts, dtype=np.int64, count=len(parts)))


def kaminpar_graph_assignment(edge_index: Tensor, num_nodes: int, num_parts: int,
                              balance_masks: Optional[Tensor] = None, seed: int = 0,
                              tolerance: float = 0.03) -> Tensor:
    r""":func:`kaminpar_assignment` of a graph in memory (written to a
    temporary ParHIP file), refined (:func:`~pyg_dist.partition.refine.refine`)
    as the out-of-core path refines it, with the columns of
    :obj:`balance_masks` balanced afterwards as
    :func:`~pyg_dist.partition.metis.metis_assignment` balances them."""
    from pyg_dist.partition.metis import rebalance, symmetric_csr
    from pyg_dist.partition.parhip import write_csr
    from pyg_dist.partition.refine import refine
    rowptr, col = symmetric_csr(edge_index, num_nodes)
    with tempfile.TemporaryDirectory() as work:
        path = osp.join(work, "graph.parhip")
        write_csr(rowptr.numpy(), col.numpy(), path)
        part = kaminpar_assignment(path, num_parts, seed, tolerance).numpy()
        assignment = torch.from_numpy(refine(path, part, num_parts, tolerance))
    if balance_masks is not None and num_parts > 1:
        rebalance(assignment, rowptr, col, balance_masks, num_parts, tolerance)
    return assignment
