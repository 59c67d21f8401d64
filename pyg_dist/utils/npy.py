r"""``.npy`` files read and written in row chunks, so that a file larger than
memory passes through a bounded buffer.

Reads go through ``np.fromfile`` at an offset rather than ``np.memmap``: the
pages of a mapping count in the process' resident set for as long as it
lives, so streaming an 8 GB feature file through a mapping would show (and,
under a cgroup limit, charge) 8 GB.
"""
import contextlib
import io
import json
import os
import os.path as osp
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np


class GraphFileError(ValueError):
    r"""An input file that cannot be used as it is (truncated, wrong dtype or
    shape, ids out of range); the message is one line naming the file."""


class NpyReader:
    r"""The array in the ``.npy`` file :obj:`path`, read by row ranges.

    Refuses, naming the file, what is not an ``.npy`` file, a Fortran-order
    or object array, and a file shorter than its header says (truncated).
    """

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                          else np.lib.format.read_array_header_2_0)(f)
                self.offset = f.tell()
        except FileNotFoundError:
            raise GraphFileError(f"'{path}' does not exist") from None
        except (ValueError, OSError, EOFError) as e:
            raise GraphFileError(f"'{path}' is not a readable .npy file ({e})") from None
        self.shape, fortran, self.dtype = header
        if self.dtype.hasobject:
            raise GraphFileError(f"'{path}' holds Python objects, not numbers")
        if fortran and len(self.shape) > 1:
            raise GraphFileError(f"'{path}' is in Fortran order: save it C-contiguous "
                                 f"(np.save(path, np.ascontiguousarray(a)))")
        expected = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        held = os.path.getsize(path) - self.offset
        if held < expected:
            raise GraphFileError(f"'{path}' is truncated: {held:,} bytes of data, its "
                                 f"header announces {expected:,} ({self.shape}, {self.dtype})")

    def __len__(self) -> int:
        return int(self.shape[0]) if self.shape else 1

    @property
    def row_shape(self) -> Tuple[int, ...]:
        return tuple(self.shape[1:])

    def read(self, start: int = 0, stop: Optional[int] = None) -> np.ndarray:
        r"""Rows :obj:`start` to :obj:`stop` (a fresh in-memory array)."""
        stop = len(self) if stop is None else min(stop, len(self))
        start = min(start, stop)
        row = int(np.prod(self.row_shape, dtype=np.int64))
        out = np.fromfile(self.path, dtype=self.dtype, count=(stop - start) * row,
                          offset=self.offset + start * row * self.dtype.itemsize)
        return out.reshape((stop - start, *self.row_shape))

    def chunks(self, rows: int) -> Iterator[Tuple[int, np.ndarray]]:
        r"""``(start, rows start:start + rows)`` over the whole array."""
        for start in range(0, len(self), rows):
            yield start, self.read(start, start + rows)


class NpyWriter:
    r"""Writes an ``.npy`` file of :obj:`shape` and :obj:`dtype` row chunk by
    row chunk (:meth:`write`), or value chunk by value chunk in C order
    (:meth:`append`); the file appears under its name only once every value
    is written (:meth:`close`), so an interrupted write leaves no file that
    loads."""

    def __init__(self, path: str, shape: Tuple[int, ...], dtype, digest=None):
        self.path, self.shape, self.dtype = path, tuple(int(s) for s in shape), np.dtype(dtype)
        self.values, self.digest = 0, digest  # digest: anything with update(bytes)
        self._file = open(path + ".tmp", "wb")
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, {
            "descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
            "shape": self.shape})
        self._put(header.getvalue())

    def _put(self, payload: bytes) -> None:
        self._file.write(payload)
        if self.digest is not None:
            self.digest.update(payload)

    def write(self, rows: np.ndarray) -> None:
        if tuple(rows.shape[1:]) != self.shape[1:]:
            raise ValueError(f"rows of shape {tuple(rows.shape[1:])} written to "
                             f"'{self.path}' of shape {self.shape}")
        self.append(rows)

    def append(self, values: np.ndarray) -> None:
        self._put(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.values += values.size

    def close(self) -> None:
        self._file.close()
        total = int(np.prod(self.shape))
        if self.values != total:
            os.remove(self._file.name)
            raise ValueError(f"'{self.path}': {self.values} values written of {total}")
        os.replace(self._file.name, self.path)

    def abort(self) -> None:
        self._file.close()
        if os.path.exists(self._file.name):
            os.remove(self._file.name)

    def __enter__(self) -> "NpyWriter":
        return self

    def __exit__(self, kind, *_) -> None:
        self.abort() if kind is not None else self.close()


# What a graph folder's writers (R-MAT, OGB conversion) may create;
# graph.json, written last, marks a complete folder.
GRAPH_FOLDER_FILES = ("graph.json", "src.npy", "dst.npy", "x.npy", "y.npy", "train_mask.npy",
                      "val_mask.npy", "test_mask.npy")


def check_empty_graph_folder(out_dir: str) -> None:
    r"""Refuses (:class:`ValueError` naming it) a folder that already holds a
    graph folder's file: a writer never replaces another's graph."""
    for name in GRAPH_FOLDER_FILES:
        if osp.exists(osp.join(out_dir, name)):
            raise ValueError(f"'{osp.join(out_dir, name)}' already exists: write the "
                             f"graph into an empty folder")


@contextlib.contextmanager
def writing_graph_folder(out_dir: str) -> Iterator[None]:
    r"""Creates :obj:`out_dir` (checked by :func:`check_empty_graph_folder`);
    if the block fails, removes every graph folder file (all the block's)."""
    os.makedirs(out_dir, exist_ok=True)
    try:
        yield
    except BaseException:
        for name in GRAPH_FOLDER_FILES:
            if osp.exists(osp.join(out_dir, name)):
                os.remove(osp.join(out_dir, name))
        raise


def write_graph_json(out_dir: str, meta: Dict[str, Any]) -> None:
    r"""Writes ``graph.json`` (atomically, last: it marks the folder complete)."""
    path = osp.join(out_dir, "graph.json")
    with open(path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(path + ".tmp", path)
