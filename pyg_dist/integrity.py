r"""Files that carry their own checksum: a flipped byte, a truncated write
or another run's file is refused with one line naming it, before any byte
reaches a kernel.

A file is written whole or not at all (temporary file, then rename) and
described by ``{"bytes": size, "sum64": checksum}``, which the writer keeps
in its index (a partitioning's ``meta.json``, a checkpoint's sidecar,
``model.json``, ``predictions.json``). The reader checks the description
against the bytes it read, then unpickles them with ``weights_only=True``
(no code ever runs); :func:`verify` checks without unpickling (the
launcher's checks before any rank starts). An index that is not UTF-8
JSON, or a file that cannot be read, is refused in one line naming it
(:func:`read_json`, :func:`read_bytes`).

The checksum is :func:`sum64`, chosen for speed: ~20 GB/s with NumPy, where
zlib's CRC32 runs at ~3 GB/s and added 30% to loading a 150 MiB part file
(``benchmarks/integrity.py``). It catches truncation (the size), any change
confined to one 64-bit word, reordered 4 KiB blocks, and random damage
except with probability 2⁻⁶⁴; it is not a cryptographic hash (tampering is
the business of ``weights_only``).
"""
import contextlib
import io
import json
import os
from typing import Any, Dict, Optional

import numpy as np
import torch

Description = Dict[str, int]


class CorruptFileError(RuntimeError):
    r"""A file whose bytes are not those its index describes."""


class UnreadableFileError(RuntimeError):
    r"""A file that exists but cannot be read (no permission, a directory):
    its bytes were never seen, so nothing is said about them."""


def sum64(payload) -> int:
    r""":math:`\sum_b (2b + 1) \sum_{i \in b} w_i \bmod 2^{64}` over the
    file's little-endian 64-bit words :math:`w_i` in 4 KiB blocks :math:`b`
    (the odd weights make every single-word change visible and tie blocks
    to their positions), plus the trailing bytes."""
    n = len(payload) // 8
    words = np.frombuffer(payload, dtype="<u8", count=n)
    full = n // 512 * 512
    with np.errstate(over="ignore"):
        blocks = words[:full].reshape(-1, 512).sum(axis=1, dtype=np.uint64)
        weights = 2 * np.arange(blocks.size + 1, dtype=np.uint64) + 1
        total = np.dot(blocks, weights[:-1]) + words[full:].sum(dtype=np.uint64) * weights[-1]
    tail = int.from_bytes(bytes(payload[n * 8:]), "little")
    return (int(total) + tail) % 2**64


class Sum64:
    r""":func:`sum64` of bytes fed in pieces of any size (a file written or
    read in chunks never has to be in memory whole)."""

    def __init__(self):
        self.size, self._blocks, self._total, self._rest = 0, 0, 0, b""

    def update(self, payload) -> None:
        payload = self._rest + bytes(payload)
        self.size += len(payload) - len(self._rest)
        full = len(payload) // 4096 * 4096
        if full:
            blocks = np.frombuffer(payload, dtype="<u8", count=full // 8).reshape(-1, 512)
            with np.errstate(over="ignore"):
                sums = blocks.sum(axis=1, dtype=np.uint64)
                weights = 2 * np.arange(self._blocks, self._blocks + len(sums),
                                        dtype=np.uint64) + 1
                self._total = (self._total + int(np.dot(sums, weights))) % 2**64
            self._blocks += len(sums)
        self._rest = payload[full:]

    def describe(self) -> Description:
        r"""The description of the bytes fed so far."""
        n = len(self._rest) // 8
        words = np.frombuffer(self._rest, dtype="<u8", count=n)
        with np.errstate(over="ignore"):
            last = int(words.sum(dtype=np.uint64)) * (2 * self._blocks + 1)
        tail = int.from_bytes(self._rest[n * 8:], "little")
        return {"bytes": self.size, "sum64": (self._total + last + tail) % 2**64}


def describe_file(path: str, chunk: int = 64 << 20) -> Description:
    r"""The description of the file :obj:`path`, read in chunks of
    :obj:`chunk` bytes (memory stays bounded whatever its size)."""
    digest = Sum64()
    with _reading(path) as f:
        while piece := f.read(chunk):
            digest.update(piece)
    return digest.describe()


def save_checked(obj: Any, path: str) -> Description:
    r"""Saves :obj:`obj` to :obj:`path` atomically; returns its description
    (read back from the page cache in chunks: no second copy of a large
    object is ever in memory)."""
    with open(path + ".tmp", "wb") as f:
        torch.save(obj, f)
    description = describe_file(path + ".tmp")
    os.replace(path + ".tmp", path)
    return description


def save_json(obj: Any, path: str) -> None:
    r"""Writes :obj:`obj` as JSON to :obj:`path` atomically (an index that
    names files must never be half written)."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def read_bytes(path: str) -> bytes:
    r"""The bytes of :obj:`path`; a missing file raises
    :class:`FileNotFoundError`, one that cannot be read
    :class:`UnreadableFileError` saying why, both naming it."""
    with _reading(path) as f:
        return f.read()


@contextlib.contextmanager
def _reading(path: str):
    r""":obj:`path` open for reading, its errors one line naming it."""
    try:
        with open(path, "rb") as f:
            yield f
    except FileNotFoundError as e:
        raise FileNotFoundError(f"'{path}' does not exist") from e
    except PermissionError as e:
        raise UnreadableFileError(f"cannot read '{path}': permission denied") from e
    except IsADirectoryError as e:
        raise UnreadableFileError(f"cannot read '{path}': it is a directory") from e
    except OSError as e:
        raise UnreadableFileError(f"cannot read '{path}': {e.strerror or e}") from e


def check_bytes(path: str, payload, expected: Description) -> None:
    r"""Refuses :obj:`payload` (the bytes read from :obj:`path`) unless its
    size and checksum are those of :obj:`expected`."""
    check_description(path, {"bytes": len(payload), "sum64": sum64(payload)}, expected)


def verify(path: str, expected: Description) -> None:
    r"""Checks that :obj:`path` holds the bytes :obj:`expected` describes,
    without unpickling them (what a launcher can do before any rank
    starts: reading and :func:`sum64` run at disk speed, in chunks)."""
    check_description(path, describe_file(path), expected)


def check_description(path: str, found: Description, expected: Description) -> None:
    if found["bytes"] != expected["bytes"]:
        raise CorruptFileError(f"'{path}' is corrupt, truncated or of another run: "
                               f"{found['bytes']} bytes, its index says {expected['bytes']}")
    if found["sum64"] != expected["sum64"]:
        raise CorruptFileError(f"'{path}' is corrupt or of another run: its checksum "
                               f"differs from the one its index records")


def read_json(path: str) -> Any:
    r"""The JSON value in :obj:`path` (an index: ``meta.json``,
    ``latest.json``, ``model.json``, a sidecar); bytes that are not UTF-8
    JSON raise :class:`CorruptFileError` naming the file."""
    payload = read_bytes(path)
    try:
        return json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptFileError(f"'{path}' is corrupt: not UTF-8 JSON ({e})") from e


def load_checked(path: str, expected: Optional[Description] = None,
                 mmap: bool = False) -> Any:
    r"""Reads :obj:`path`, refusing it unless its size and checksum match
    :obj:`expected` (``None``: only unpickled safely, for callers that
    check the contents themselves). With :obj:`mmap`, the file is checked
    in chunks and its tensors are mapped copy-on-write rather than read
    (a large part file then never has two copies in memory)."""
    if mmap:
        if expected is not None:
            verify(path, expected)
        source = path
    else:
        source = io.BytesIO(read_bytes(path))
        if expected is not None:
            check_bytes(path, source.getbuffer(), expected)
    try:
        return torch.load(source, weights_only=True, map_location="cpu", mmap=mmap)
    except Exception as e:  # torch raises several types for bad archives
        raise CorruptFileError(f"Cannot read '{path}': the file is corrupt, truncated or "
                               f"not a pyg_dist file ({e})") from e
