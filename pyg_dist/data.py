"""``DistData``: one rank's partition as a PyG ``Data`` object."""
import os.path as osp
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data

from pyg_dist.utils import csr
from pyg_dist.integrity import CorruptFileError, load_checked, verify
from pyg_dist.partition.book import FORMAT_VERSION, described, part_file, read_meta

# Per-partition bookkeeping kept as attributes but not node/edge features.
_PLAN_KEYS = ("global_id", "n_id", "halo_owner", "halo_remote_id", "deg_in",
              "deg_out", "send_index", "send_counts", "recv_counts", "partptr")


class DistData(Data):
    r"""The partition of one rank: its *inner* nodes (local ids
    ``0..num_inner-1``) and the *halo* nodes other ranks own
    (``num_inner..num_inner+num_halo-1``).

    * ``x``, ``y`` and the masks hold inner rows only.
    * ``edge_index`` is the local bipartite graph of every in-edge of an
      inner node: sources in ``[0, num_inner + num_halo)``, targets in
      ``[0, num_inner)``, sorted by (target, source).
    * ``adj_t`` is the same graph as a ``torch.sparse`` CSR matrix of shape
      ``[num_inner, num_inner + num_halo]``, the form PyG's fused
      ``message_and_aggregate`` path consumes.
    * ``global_id`` (relabelled, contiguous per part) and ``n_id`` (original
      ids, PyG's convention) cover inner and halo nodes; ``halo_owner`` and
      ``halo_remote_id`` say where each halo row lives; ``deg_in`` /
      ``deg_out`` are degrees in the whole graph (exact GCN normalisation).
    * ``send_index`` / ``send_counts`` / ``recv_counts`` are the halo
      exchange plan: the inner rows sent to each peer, and the number of
      halo rows received from each (halo rows are grouped by owner).
    """

    @property
    def num_inner(self) -> int:
        return int(self["num_inner"])

    @property
    def num_halo(self) -> int:
        return int(self["num_halo"])

    @property
    def num_parts(self) -> int:
        return int(self["num_parts"])

    @property
    def rank(self) -> int:
        return int(self["rank"])

    @classmethod
    def load(cls, root: str, rank: int, world_size: Optional[int] = None) -> "DistData":
        r"""Loads partition :obj:`rank` from :obj:`root`.

        Refuses, with a message that says which, a world size different from
        the number of parts (checked against the default process group when
        one exists), an unknown format version, and a part file that belongs
        to another partitioning (graph hash or part count differ).
        """
        meta = read_meta(root)
        num_parts = meta["num_parts"]
        if world_size is None and dist.is_available() and dist.is_initialized():
            world_size = dist.get_world_size()
        if world_size is not None and world_size != num_parts:
            raise RuntimeError(
                f"'{root}' holds {num_parts} partitions but the world size is "
                f"{world_size}: launch {num_parts} processes or re-partition "
                f"with num_parts={world_size}")
        if not 0 <= rank < num_parts:
            raise ValueError(f"rank {rank} is out of range for {num_parts} partitions")
        path = part_file(root, rank)
        if not osp.exists(path):
            raise FileNotFoundError(f"Partition file '{path}' is missing "
                                    f"(meta.json lists {num_parts} parts)")
        partitioning = ({"partitioning_id": meta["partitioning_id"]}
                        if "partitioning_id" in meta else {})
        return cls.read(path, root, meta, rank=rank, **partitioning)

    @classmethod
    def read(cls, path: str, root: str, meta: dict, **expected) -> "DistData":
        r"""The part file :obj:`path` of the partitioning in :obj:`root`
        (whose ``meta.json`` is :obj:`meta`), refused unless its format
        version, graph hash, part count and the :obj:`expected` keys match."""
        recorded = described(root, meta, osp.relpath(path, root))
        corrupt = None
        try:
            item = load_checked(path, recorded, mmap=True)
        except CorruptFileError as e:
            corrupt, item = e, _readable(path)  # a whole file of another partitioning
            if not isinstance(item, dict):      # says so below
                raise
        if not isinstance(item, dict):
            raise RuntimeError(f"'{path}' is not a pyg_dist partition file")
        for key, value in (("format_version", FORMAT_VERSION),
                           ("graph_hash", meta["graph_hash"]),
                           ("num_parts", meta["num_parts"]), *expected.items()):
            if item.get(key) != value:
                raise RuntimeError(
                    f"'{path}' does not match '{osp.join(root, 'meta.json')}': "
                    f"{key} is {item.get(key)!r}, expected {value!r} "
                    f"(files from different partitionings mixed?)")
        if corrupt is not None:  # of this partitioning, yet not the bytes it recorded
            raise corrupt
        for key in ("x", "edge_index"):  # written apart (partition --from): mapped
            if f"{key}_file" in item:
                item[key] = _mapped(root, meta, item.pop(f"{key}_file"))
        _validate(item, path)
        data = cls(**item)
        data.num_nodes = data.num_inner
        data.num_global_nodes = meta["num_nodes"]
        data.adj_t = data.csr_adj_t()
        return data

    def csr_adj_t(self, edge_index: Optional[Tensor] = None,
                  value: Optional[Tensor] = None) -> Tensor:
        r"""The transposed local adjacency (rows = inner targets) as a
        ``torch.sparse`` CSR matrix; :obj:`edge_index` must be sorted by
        (target, source) like :obj:`self.edge_index`."""
        edge_index = self.edge_index if edge_index is None else edge_index
        dtype = self.x.dtype if self.x is not None else torch.float
        return csr(edge_index, value, self.num_inner, self.num_inner + self.num_halo, dtype)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(rank={self.rank}/{self.num_parts}, "
                f"num_inner={self.num_inner}, num_halo={self.num_halo}, "
                f"num_edges={self.edge_index.size(1)}, "
                f"num_features={self.num_features})")


def _mapped(root: str, meta: dict, name: str) -> Tensor:
    r"""The array in ``root/name``, checked against ``meta.json`` (read once
    in chunks) and then memory-mapped copy-on-write: the rank's memory holds
    the pages it touches, shared with the page cache."""
    path = osp.join(root, name)
    verify(path, described(root, meta, name))
    return torch.from_numpy(np.load(path, mmap_mode="c"))


def _readable(path: str):
    r"""The unchecked contents of :obj:`path`, or ``None`` if unreadable."""
    try:
        return load_checked(path)
    except CorruptFileError:
        return None


def _validate(item: dict, path: str) -> None:
    r"""Shapes, dtypes and index ranges of a part file's tensors, so that no
    inconsistent file reaches a kernel (where a bad index may crash)."""
    def bad(what: str):
        return CorruptFileError(f"'{path}' is corrupt: {what}")

    try:
        inner, halo, parts = int(item["num_inner"]), int(item["num_halo"]), int(item["num_parts"])
        edge_index, send_index = item["edge_index"], item["send_index"]
    except (KeyError, TypeError, ValueError) as e:
        raise bad(f"missing or malformed field ({e})") from e
    for name, value in item.items():  # node features, labels and masks: inner rows
        if (name in ("x", "y") or name.endswith("_mask")) and isinstance(value, Tensor) \
                and value.size(0) != inner:
            raise bad(f"'{name}' has {value.size(0)} rows, the part {inner} inner nodes")
    if edge_index.dtype != torch.long or edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise bad("edge_index is not a [2, E] tensor of int64")
    if edge_index.numel() and not (0 <= int(edge_index.min()) and
                                   int(edge_index[0].max()) < inner + halo and
                                   int(edge_index[1].max()) < inner):
        raise bad("edge_index points outside the part's inner and halo nodes")
    if send_index.numel() and not (0 <= int(send_index.min()) and
                                   int(send_index.max()) < inner):
        raise bad("send_index points outside the part's inner nodes")
    if int(item["send_counts"].sum()) != send_index.numel() or \
            int(item["recv_counts"].sum()) != halo or item["global_id"].numel() != inner + halo:
        raise bad("the exchange plan's counts disagree with its rows")
    owner = item["halo_owner"]
    if owner.numel() and not (0 <= int(owner.min()) and int(owner.max()) < parts):
        raise bad("halo_owner names a part that does not exist")
