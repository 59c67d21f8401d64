"""The partition book: which global ids each part owns, and the on-disk
metadata that every rank checks before it trusts a partition file."""
import hashlib
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from pyg_dist.integrity import CorruptFileError, load_checked, read_json, save_checked, save_json

FORMAT_VERSION = 1
META_FILE = "meta.json"
BOOK_FILE = "book.pt"


def part_file(root: str, rank: int) -> str:
    return osp.join(root, f"part_{rank}.pt")


def features_file(rank: int) -> str:
    r"""The name of part :obj:`rank`'s feature rows when they are kept
    apart from its part file (``.npy``, memory-mapped by the rank)."""
    return f"part_{rank}_x.npy"


def edges_file(rank: int) -> str:
    r"""The name of part :obj:`rank`'s ``edge_index`` when it is kept apart
    from its part file (``.npy``, written in chunks, memory-mapped by the rank)."""
    return f"part_{rank}_edge_index.npy"


def owner_of(global_id: Tensor, partptr: Tensor) -> Tensor:
    r"""The part that owns each relabelled global id (parts own contiguous
    ranges ``partptr[r]:partptr[r + 1]``)."""
    return torch.searchsorted(partptr, global_id, right=True) - 1


@dataclass
class PartitionBook:
    r"""Maps between original node ids, relabelled global ids and owners.

    Nodes are relabelled so that part :math:`r` owns the contiguous global id
    range ``partptr[r]:partptr[r + 1]`` (as DistDGL does); ``perm[g]`` is the
    original id of global id ``g`` and ``inv_perm`` the inverse mapping.
    """
    partptr: Tensor
    perm: Tensor
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def num_parts(self) -> int:
        return self.partptr.numel() - 1

    @property
    def inv_perm(self) -> Tensor:
        inv = torch.empty_like(self.perm)
        inv[self.perm] = torch.arange(self.perm.numel())
        return inv

    def owner(self, global_id: Tensor) -> Tensor:
        r"""The part that owns each relabelled global id."""
        return owner_of(global_id, self.partptr)

    @property
    def stats(self) -> List[Dict[str, Any]]:
        return self.meta.get("parts", [])

    def summary(self) -> str:
        r"""A table like BNS-GCN's Table 1: inner and halo nodes per part, its
        in-edges and training nodes, and the largest part over the mean of
        each (the rank that sets the pace and the memory)."""
        lines = [f"{'part':>8} {'inner':>10} {'halo':>10} {'halo/inner':>10} "
                 f"{'edges':>12} {'train':>8}"]
        for s in self.stats:
            lines.append(f"{s['part']:>8} {s['num_inner']:>10,} {s['num_halo']:>10,} "
                         f"{s['halo_ratio']:>10.3f} {s['num_edges']:>12,} "
                         f"{s.get('num_train', 0):>8,}")
        if self.stats:
            ratio = part_imbalance(self.stats)
            lines.append(f"{'max/mean':>8} {ratio['num_inner']:>10.3f} "
                         f"{ratio['num_halo']:>10.3f} {'':>10} {ratio['num_edges']:>12.3f} "
                         f"{ratio.get('num_train', float('nan')):>8.3f}")
        m = self.meta
        lines.append(f"method={m.get('method')} objective={m.get('objective')} "
                     f"edge_cut={m.get('edge_cut', 0):,} "
                     f"({m.get('edge_cut_ratio', 0.0):.2%} of edges) "
                     f"comm_volume={m.get('comm_volume', 0):,} rows/layer")
        return "\n".join(lines)

    def save(self, root: str) -> None:
        r"""Writes ``book.pt`` and then ``meta.json`` (its presence marks a
        complete write), which describes every file (size and checksum)."""
        os.makedirs(root, exist_ok=True)
        files = dict(self.meta.get("files", {}))
        files[BOOK_FILE] = save_checked({"partptr": self.partptr, "perm": self.perm},
                                        osp.join(root, BOOK_FILE))
        self.meta["files"] = files
        if self.meta.get("parts"):
            self.meta["imbalance"] = part_imbalance(self.meta["parts"])
        save_json(self.meta, osp.join(root, META_FILE))

    @classmethod
    def load(cls, root: str) -> "PartitionBook":
        meta = read_meta(root)
        path = osp.join(root, BOOK_FILE)
        if not osp.exists(path):
            raise FileNotFoundError(f"Partition book '{path}' is missing; "
                                    f"re-run pyg_dist.partition_graph()")
        book = load_checked(path, described(root, meta, BOOK_FILE))
        return cls(book["partptr"], book["perm"], meta)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(num_parts={self.num_parts}, "
                f"num_nodes={self.perm.numel()})")


def read_meta(root: str) -> Dict[str, Any]:
    path = osp.join(root, META_FILE)
    if not osp.exists(path):
        raise FileNotFoundError(
            f"No partition metadata at '{path}': '{root}' is not a partition "
            f"directory (create one with pyg_dist.partition_graph() or "
            f"'pyg-dist partition')")
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise CorruptFileError(f"'{path}' is corrupt: not a partition's metadata "
                               f"(a JSON {type(meta).__name__}, not an object)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise RuntimeError(
            f"Partition format version {meta.get('format_version')} in '{path}' "
            f"is not supported (expected {FORMAT_VERSION}); re-partition")
    for key, kind in _META_FIELDS.items():  # valid JSON can still be damaged
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise CorruptFileError(f"'{path}' is corrupt: its '{key}' is missing or not "
                                   f"a {kind.__name__}")
    return meta


# What every reader of meta.json relies on, and its JSON type.
_META_FIELDS = {"num_parts": int, "num_nodes": int, "num_features": int, "graph_hash": str,
                "files": dict, "parts": list}


def described(root: str, meta: Dict[str, Any], name: str) -> Dict[str, int]:
    r"""The size and checksum ``meta.json`` (:obj:`meta`) of :obj:`root`
    records for its file :obj:`name`; a file it does not describe is
    refused (:class:`CorruptFileError`): it could not be checked."""
    recorded = meta["files"].get(name)
    if recorded is None:
        raise CorruptFileError(f"'{osp.join(root, META_FILE)}' records no checksum of "
                               f"'{osp.join(root, name)}': it cannot be checked (write it "
                               f"again with pyg-dist partition)")
    return recorded


def add_files(root: str, descriptions: Dict[str, Dict[str, int]],
              replace: Optional[str] = None) -> None:
    r"""Records :obj:`descriptions` (file name relative to :obj:`root` →
    size and checksum) of files written next to the partitions after them
    (the cohesive batches, the balanced batch parts) in ``meta.json``,
    dropping first the files under the folder :obj:`replace` (removed)."""
    meta = read_meta(root)
    kept = {name: d for name, d in meta["files"].items()
            if replace is None or not name.startswith(replace + "/")}
    meta["files"] = {**kept, **descriptions}
    save_json(meta, osp.join(root, META_FILE))


def partitioning_id(ghash: str, perm: Tensor, partptr: Tensor) -> str:
    r"""Names one partitioning of one graph: equal for equal assignments,
    different for any other (its part files must not be mixed)."""
    digest = hashlib.sha256(ghash.encode())
    for t in (perm, partptr):
        digest.update(t.to(torch.long).numpy().tobytes())
    return digest.hexdigest()[:16]


def versions() -> Dict[str, str]:
    import torch_geometric
    from pyg_dist.version import __version__

    return {"pyg_dist": __version__, "torch": torch.__version__,
            "torch_geometric": torch_geometric.__version__}


#: The per-part counts whose largest part over the mean :func:`part_imbalance` gives.
BALANCED_COUNTS = ("num_inner", "num_halo", "num_rows", "num_edges", "num_train")


def part_imbalance(stats: List[Dict[str, Any]]) -> Dict[str, float]:
    r"""The largest part over the mean part (1.0: even) of each count of
    :data:`BALANCED_COUNTS` the parts' :obj:`stats` hold (``num_rows``:
    inner plus halo rows, what a rank's layers hold)."""
    rows = [{**s, "num_rows": s.get("num_inner", 0) + s.get("num_halo", 0)} for s in stats]
    out = {}
    for key in BALANCED_COUNTS:
        values = [row[key] for row in rows if key in row]
        if values:  # none anywhere: even
            out[key] = max(values) * len(values) / sum(values) if sum(values) else 1.0
    return out
