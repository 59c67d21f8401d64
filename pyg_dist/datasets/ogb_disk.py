r"""OGB's binary node-property layout (the one ``ogbn-papers100M`` downloads
as) converted to a graph folder by streaming, in memory that does not grow
with the graph.

The in-memory loader (:func:`pyg_dist.datasets.load`) goes through ogb's
``PygNodePropPredDataset``, which ``np.load``\ s every array whole: for
papers100M (111M nodes, 1.6B citations, 128 fp32 features) that is over
60 GB. Here every ``.npz`` member is read as a zip stream (stored or
deflated alike), its ``.npy`` header parsed, and its data passed on in
fixed-size chunks.
"""
import os
import os.path as osp
import zipfile
import zlib
from typing import Any, Dict, Iterator, Optional

import numpy as np
import torch

from pyg_dist.utils.npy import (GraphFileError, NpyWriter, check_empty_graph_folder,
                                write_graph_json, writing_graph_folder)

_SPLITS = (("train", "train"), ("val", "valid"), ("test", "test"))  # ours, OGB's
# What a failed zip read raises: a bad CRC (BadZipFile), damaged deflate
# data (zlib.error), deflate data that stops early (EOFError).
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError)


def is_ogb_raw(path: str) -> bool:
    r"""Whether :obj:`path` is a dataset folder in OGB's binary layout
    (it holds ``raw/data.npz``)."""
    return osp.isfile(osp.join(path, "raw", "data.npz"))


def ogb_to_graph_dir(ogb_dir: str, out_dir: str, undirected: bool = True,
                     chunk_rows: int = 1 << 22, progress: bool = False) -> Dict[str, Any]:
    r"""Converts the OGB node-property dataset in :obj:`ogb_dir` (binary
    layout, as ``papers100M-bin.zip`` unpacks) into the graph folder
    :obj:`out_dir`, and returns what it writes to ``graph.json``.

    Reads:

    * ``raw/data.npz``: ``edge_index`` (``[2, E]`` integers),
      ``node_feat`` (``[N, F]``) and ``num_nodes_list`` /
      ``num_edges_list`` (one graph); other members (``node_year``) are
      ignored.
    * ``raw/node-label.npz``: ``node_label`` (``[N]`` or ``[N, 1]``; float
      with NaN for unlabelled nodes in papers100M).
    * ``split/<split>/`` (its only subfolder, ``time`` for papers100M):
      ``split_dict.pt`` when present (ogb reads it first), else
      ``train.csv.gz``, ``valid.csv.gz`` and ``test.csv.gz``.

    Writes, each under its name only once complete and ``graph.json``
    last:

    * ``src.npy``, ``dst.npy``: the edges, int32 when ``N < 2**31`` (else
      int64). With :obj:`undirected` (as the in-memory loader symmetrises
      the citation graphs) the ``E`` edges are followed by the ``E``
      reversed ones: ``2E`` positions. Duplicates and self-loops are kept
      (a pair that cites both ways appears twice in each direction): the
      partitioner symmetrises and de-duplicates for itself, and message
      passing sees both directions of every citation.
    * ``x.npy``: the features, float32 (float16 kept as it is).
    * ``y.npy``: int64 labels, ``-1`` where the label is NaN.
    * ``train_mask.npy``, ``val_mask.npy``, ``test_mask.npy``: bool, from
      the split (OGB's ``valid`` is ``val``); unlabelled nodes are in none.
    * ``graph.json``: ``source``, ``name`` (the folder's name),
      ``num_nodes``, ``num_edges`` (positions written), ``num_features``,
      ``undirected``.

    Memory: at most :obj:`chunk_rows` values pass at a time (edge ids,
    labels, mask entries; features go ``max(1, chunk_rows // F)`` rows at
    a time), held a few times over while converted and written: 100-200 MB
    at the default whatever the graph's size, plus the split's
    index arrays (papers100M: 1.5M ids, 12 MB). Every edge id is checked to
    lie in ``[0, N)``.

    Raises :class:`~pyg_dist.utils.npy.GraphFileError` (one line naming the
    file, and the member of an archive) for a missing, truncated or
    malformed input, and :class:`ValueError` when :obj:`out_dir` already
    holds one of the files it writes. A failed conversion leaves none of
    them behind.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive (got {chunk_rows})")
    check_empty_graph_folder(out_dir)
    data_npz = osp.join(ogb_dir, "raw", "data.npz")
    label_npz = osp.join(ogb_dir, "raw", "node-label.npz")

    # Everything that is refused without streaming the data is refused
    # before the first byte is written.
    num_nodes_list = _small_member(data_npz, "num_nodes_list")
    num_edges_list = _small_member(data_npz, "num_edges_list")
    if len(num_nodes_list) != 1:  # ids are per graph: summing would mix graphs
        raise GraphFileError(f"'{data_npz}:num_nodes_list' lists {len(num_nodes_list)} "
                             f"graphs; a node-property dataset is one graph")
    num_nodes = int(num_nodes_list[0])
    with _NpzMember(data_npz, "edge_index") as edges, \
            _NpzMember(data_npz, "node_feat") as feat, \
            _NpzMember(label_npz, "node_label") as label:
        if len(edges.shape) != 2 or edges.shape[0] != 2:
            raise GraphFileError(f"'{edges.name}' has shape {edges.shape}, not [2, E]")
        if edges.dtype.kind not in "iu":
            raise GraphFileError(f"'{edges.name}' holds {edges.dtype}, not integer node ids")
        num_edges = int(edges.shape[1])
        if int(np.sum(num_edges_list)) != num_edges:
            raise GraphFileError(f"'{data_npz}:num_edges_list' sums to "
                                 f"{int(np.sum(num_edges_list)):,}, edge_index holds "
                                 f"{num_edges:,} edges")
        if len(feat.shape) != 2 or feat.shape[0] != num_nodes or feat.shape[1] < 1:
            raise GraphFileError(f"'{feat.name}' has shape {feat.shape}, not "
                                 f"[{num_nodes:,}, F > 0] (num_nodes_list)")
        if label.shape not in ((num_nodes,), (num_nodes, 1)):
            raise GraphFileError(f"'{label.name}' has shape {label.shape}, not "
                                 f"[{num_nodes:,}] or [{num_nodes:,}, 1]")
        num_features = int(feat.shape[1])
        bytes_total = (edges.nbytes * (3 if undirected else 2) // 2 + feat.nbytes
                       + label.nbytes)
    split = _read_split(ogb_dir, num_nodes)

    from tqdm import tqdm
    bar = tqdm(total=bytes_total, desc=f"convert {osp.basename(osp.normpath(ogb_dir))}",
               unit="B", unit_scale=True, disable=not progress)
    with bar, writing_graph_folder(out_dir):
        positions = _write_edges(data_npz, out_dir, num_nodes, num_edges, undirected,
                                 chunk_rows, bar)
        _write_features(data_npz, out_dir, chunk_rows, bar)
        _write_labels(label_npz, out_dir, num_nodes, chunk_rows, bar)
        for key, idx in split.items():
            _write_mask(osp.join(out_dir, f"{key}_mask.npy"), idx, num_nodes, chunk_rows)
        meta = {"source": "ogb", "name": osp.basename(osp.normpath(ogb_dir)),
                "num_nodes": num_nodes, "num_edges": positions,
                "num_features": num_features, "undirected": undirected}
        write_graph_json(out_dir, meta)
    return meta


class _NpzMember:
    r"""The array :obj:`key` of the ``.npz`` archive :obj:`archive`, read
    front to back as a stream of values, never whole."""

    def __init__(self, archive: str, key: str, bar: Optional[Any] = None):
        self.name, self.bar, self._read = f"{archive}:{key}", bar, 0
        try:
            self._zip = zipfile.ZipFile(archive)
        except FileNotFoundError:
            raise GraphFileError(f"'{archive}' does not exist") from None
        except _ZIP_ERRORS as e:
            raise GraphFileError(f"'{archive}' is not a readable .npz archive "
                                 f"({_one_line(e)})") from None
        if key + ".npy" not in self._zip.namelist():
            keys = ", ".join(n[:-4] for n in self._zip.namelist() if n.endswith(".npy"))
            self._zip.close()
            raise GraphFileError(f"'{archive}' has no member '{key}' (it holds "
                                 f"{keys or 'none'})")
        self._stream = None
        try:
            self._stream = self._zip.open(key + ".npy")
            version = np.lib.format.read_magic(self._stream)
            self.shape, fortran, self.dtype = (
                np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)(self._stream)
        except (ValueError, *_ZIP_ERRORS) as e:
            self.close()
            raise GraphFileError(f"'{self.name}' is not a readable .npy member "
                                 f"({_one_line(e)})") from None
        if self.dtype.hasobject:
            self.close()
            raise GraphFileError(f"'{self.name}' holds Python objects, not numbers")
        if fortran and len(self.shape) > 1:  # a stream of columns, not rows
            self.close()
            raise GraphFileError(f"'{self.name}' is in Fortran order: save it C-contiguous "
                                 f"(np.ascontiguousarray)")
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize

    def values(self, count: int, chunk: int) -> Iterator[np.ndarray]:
        r"""The next :obj:`count` values of the stream, as 1-D arrays of at
        most :obj:`chunk` values."""
        while count > 0:
            n = min(count, chunk)
            try:
                buf = self._stream.read(n * self.dtype.itemsize)
            except _ZIP_ERRORS as e:
                raise GraphFileError(f"'{self.name}' cannot be read ({_one_line(e)})") \
                    from None
            if len(buf) < n * self.dtype.itemsize:
                got = self._read + len(buf) // self.dtype.itemsize
                raise GraphFileError(f"'{self.name}' is truncated: {got:,} values of the "
                                     f"{self.size:,} its header announces ({self.shape}, "
                                     f"{self.dtype})")
            self._read += n
            if self.bar is not None:
                self.bar.update(len(buf))
            yield np.frombuffer(buf, self.dtype)
            count -= n

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._zip.close()

    def __enter__(self) -> "_NpzMember":
        return self

    def __exit__(self, *_) -> None:
        self.close()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _small_member(archive: str, key: str) -> np.ndarray:
    with _NpzMember(archive, key) as member:
        return np.concatenate([np.zeros(0, member.dtype),
                               *member.values(member.size, member.size)])


def _read_split(ogb_dir: str, num_nodes: int) -> Dict[str, np.ndarray]:
    r"""The sorted node ids of each part (``train``/``val``/``test``) of the
    dataset's split, read as ogb's ``get_idx_split`` reads them."""
    root = osp.join(ogb_dir, "split")
    kinds = sorted(d for d in os.listdir(root) if osp.isdir(osp.join(root, d))) \
        if osp.isdir(root) else []
    if len(kinds) != 1:
        raise GraphFileError(f"'{root}' should hold one split folder (papers100M: time), "
                             f"it holds {len(kinds)}{': ' if kinds else ''}"
                             f"{', '.join(kinds)}")
    folder = osp.join(root, kinds[0])
    pt = osp.join(folder, "split_dict.pt")
    parts: Dict[str, Any] = {}
    if osp.isfile(pt):
        try:
            loaded = torch.load(pt, weights_only=True)  # tensors only, no code
            parts = {ours: loaded[theirs] for ours, theirs in _SPLITS}
        except Exception as e:
            raise GraphFileError(f"'{pt}' is not a dict of train/valid/test index tensors "
                                 f"({_one_line(e)})") from None
        where = {ours: pt for ours, _ in _SPLITS}
    else:
        where = {ours: osp.join(folder, f"{theirs}.csv.gz") for ours, theirs in _SPLITS}
        for ours, path in where.items():
            if not osp.isfile(path):
                raise GraphFileError(f"'{path}' does not exist (nor does '{pt}')")
            try:  # one id a line; ogb reads the first column
                parts[ours] = np.loadtxt(path, dtype=np.int64, delimiter=",", usecols=0,
                                         ndmin=1)
            except (ValueError, OSError, EOFError) as e:
                raise GraphFileError(f"'{path}' is not a list of node ids "
                                     f"({_one_line(e)})") from None
    split = {}
    for ours, idx in parts.items():
        idx = np.sort(np.asarray(idx, dtype=np.int64).reshape(-1))
        if len(idx) and (idx[0] < 0 or idx[-1] >= num_nodes):
            raise GraphFileError(f"'{where[ours]}' ({ours}) has node ids {idx[0]}..{idx[-1]} "
                                 f"outside [0, {num_nodes:,})")
        split[ours] = idx
    return split


def _write_edges(data_npz: str, out_dir: str, num_nodes: int, num_edges: int,
                 undirected: bool, chunk: int, bar: Any) -> int:
    r"""``src.npy`` and ``dst.npy`` from ``edge_index``, whose stream holds
    all sources, then all destinations; returns the positions written."""
    dtype = np.int32 if num_nodes < 2**31 else np.int64
    positions = 2 * num_edges if undirected else num_edges
    with NpyWriter(osp.join(out_dir, "src.npy"), (positions,), dtype) as src, \
            NpyWriter(osp.join(out_dir, "dst.npy"), (positions,), dtype) as dst:
        with _NpzMember(data_npz, "edge_index", bar) as edges:
            for ids in edges.values(num_edges, chunk):
                _check_ids(ids, num_nodes, edges.name)
                src.write(ids)
            for ids in edges.values(num_edges, chunk):
                _check_ids(ids, num_nodes, edges.name)
                dst.write(ids)
                if undirected:  # the reversed half of src.npy is the destinations
                    src.write(ids)
        if undirected:
            # ... and that of dst.npy the sources, which the stream has passed:
            # a second pass (zip streams do not seek back cheaply).
            with _NpzMember(data_npz, "edge_index", bar) as edges:
                for ids in edges.values(num_edges, chunk):
                    dst.write(ids)
    return positions


def _check_ids(ids: np.ndarray, num_nodes: int, name: str) -> None:
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= num_nodes:
        raise GraphFileError(f"'{name}' has node ids {low}..{high} outside "
                             f"[0, {num_nodes:,}) (num_nodes_list)")


def _write_features(data_npz: str, out_dir: str, chunk: int, bar: Any) -> None:
    with _NpzMember(data_npz, "node_feat", bar) as feat:
        num_features = feat.shape[1]
        dtype = np.float16 if feat.dtype == np.float16 else np.float32
        with NpyWriter(osp.join(out_dir, "x.npy"), feat.shape, dtype) as x:
            rows = max(1, chunk // num_features)
            for values in feat.values(feat.size, rows * num_features):
                x.write(values.reshape(-1, num_features))


def _write_labels(label_npz: str, out_dir: str, num_nodes: int, chunk: int,
                  bar: Any) -> None:
    with _NpzMember(label_npz, "node_label", bar) as label, \
            NpyWriter(osp.join(out_dir, "y.npy"), (num_nodes,), np.int64) as y:
        for values in label.values(num_nodes, chunk):
            if values.dtype.kind == "f":  # unlabelled nodes (NaN) get -1
                values = np.where(np.isnan(values), -1, values)
            y.write(values.astype(np.int64))


def _write_mask(path: str, idx: np.ndarray, num_nodes: int, chunk: int) -> None:
    r"""The bool mask of the sorted ids :obj:`idx`, row chunk by row chunk."""
    with NpyWriter(path, (num_nodes,), np.bool_) as mask:
        for start in range(0, num_nodes, chunk):
            stop = min(start + chunk, num_nodes)
            low, high = np.searchsorted(idx, [start, stop])
            part = np.zeros(stop - start, dtype=np.bool_)
            part[idx[low:high] - start] = True
            mask.write(part)

