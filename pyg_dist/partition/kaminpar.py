r"""KaMinPar (TeraPart) as a node-to-part assignment backend: it reads the
symmetrised graph from a ParHIP file and compresses it while loading, so
graphs whose uncompressed CSR would not fit beside METIS' work arrays
still partition on one machine.

KaMinPar runs in a child process: it holds the interpreter lock for the
whole partitioning (a minute and more on millions of nodes), which would
keep this process from acting on a signal until it returns; the parent
waits on the child instead, ends it at once when interrupted, and the
partitioner's memory leaves with it."""
import importlib.util
import os
import os.path as osp
import signal
import subprocess
import sys
import tempfile
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from pyg_dist.partition.staging import signals_deferred


def kaminpar_assignment(parhip_path: str, num_parts: int, seed: int = 0,
                        tolerance: float = 0.03, threads: int = 0) -> Tensor:
    r"""Partitions the graph in :obj:`parhip_path` (see
    :mod:`~pyg_dist.partition.parhip`) into :obj:`num_parts` parts of at
    most :math:`(1 + \epsilon) \lceil N / K \rceil` nodes (:obj:`tolerance`
    :math:`\epsilon`) minimising the edge cut, with KaMinPar's memory-efficient
    ``terapart`` configuration on :obj:`threads` threads (0: torch's
    intra-op thread count)."""
    if importlib.util.find_spec("kaminpar") is None:  # the child imports it
        raise ImportError("--method kaminpar needs the 'kaminpar' package "
                          "(pip install kaminpar)")
    if num_parts == 1:  # the header's node count: nothing to partition
        return torch.zeros(int(np.fromfile(parhip_path, dtype="<u8", count=2)[1]),
                           dtype=torch.long)
    out = parhip_path + ".parts.npy"
    args = [parhip_path, out, num_parts, seed, tolerance, threads or torch.get_num_threads(),
            os.getpid()]
    child = None
    try:
        with signals_deferred():  # started whole, so that it can be ended
            child = subprocess.Popen([sys.executable, "-c", _CHILD, *map(str, args)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        _, err = child.communicate()  # a signal's handler may raise here
    except BaseException:
        if child is not None:
            child.kill()
            child.wait()
        if osp.exists(out):
            os.remove(out)
        raise
    if child.returncode != 0:
        raise RuntimeError(f"KaMinPar failed on '{parhip_path}': {_child_failure(child, err)}")
    parts = np.load(out)
    os.remove(out)
    return torch.from_numpy(parts.astype(np.int64))


# The child: KaMinPar on the ParHIP file argv[1], the assignment to the
# .npy file argv[2]. It leaves Ctrl-C to its parent (a terminal signals the
# whole process group) and dies with it (PR_SET_PDEATHSIG; Linux).
_CHILD = """
import ctypes, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except (OSError, AttributeError):
    pass
path, out, k, seed, tolerance, threads, parent = sys.argv[1:]
if os.getppid() != int(parent):
    sys.exit("its parent has exited")
import numpy as np, kaminpar
kaminpar.reseed(int(seed))
graph = kaminpar.load_graph(path, kaminpar.GraphFileFormat.PARHIP, compress=True)
partitioner = kaminpar.KaMinPar(int(threads), kaminpar.terapart_context())
parts = partitioner.compute_partition(graph, int(k), float(tolerance))
del graph, partitioner  # before the list is copied: not beside it
np.save(out + ".tmp.npy", np.fromiter(parts, dtype=np.int32 if int(k) < 2**31 else np.int64,
                                      count=len(parts)))
os.replace(out + ".tmp.npy", out)
"""


def _child_failure(child: subprocess.Popen, err: str) -> str:
    r"""Why the KaMinPar child failed, in one line."""
    if child.returncode < 0:
        try:
            name = signal.Signals(-child.returncode).name
        except ValueError:
            name = f"signal {-child.returncode}"
        return f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    lines = err.strip().splitlines()
    return lines[-1] if lines else f"exit code {child.returncode}"


def kaminpar_graph_assignment(edge_index: Tensor, num_nodes: int, num_parts: int,
                              weights: Optional[np.ndarray] = None,
                              edges: Optional[int] = None, seed: int = 0,
                              tolerance: float = 0.03) -> Tensor:
    r""":func:`kaminpar_assignment` of a graph in memory (written to a
    temporary ParHIP file, with the nodes weighed by their in-edges where
    :obj:`edges` names that column of :obj:`weights`), refined
    (:func:`~pyg_dist.partition.refine.refine`) as the out-of-core path
    refines it, with the columns of :obj:`weights` balanced afterwards as
    :func:`~pyg_dist.partition.metis.metis_assignment` balances them."""
    from pyg_dist.partition.balance import balance, partitioner_weights
    from pyg_dist.partition.metis import symmetric_csr
    from pyg_dist.partition.parhip import add_node_weights, write_csr
    from pyg_dist.partition.refine import refine
    rowptr, col = symmetric_csr(edge_index, num_nodes)
    rowptr, col = rowptr.numpy(), col.numpy()
    with tempfile.TemporaryDirectory() as work:
        path = osp.join(work, "graph.parhip")
        write_csr(rowptr, col, path)
        if edges is not None and num_parts > 1:
            add_node_weights(path, partitioner_weights(weights[:, edges]))
        part = kaminpar_assignment(path, num_parts, seed, tolerance).numpy()
        assignment = torch.from_numpy(refine(path, part, num_parts, tolerance))
    if weights is not None and num_parts > 1:
        balance(assignment.numpy(), rowptr, col, weights, num_parts, tolerance, edges)
    return assignment
