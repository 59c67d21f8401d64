r"""Files that carry their own checksum: a flipped byte, a truncated write
or another run's file is refused with one line naming it, before any byte
reaches a kernel.

A file is written whole or not at all (temporary file, then rename) and
described by ``{"bytes": size, "crc32": checksum}``, which the writer keeps
in its index (a partitioning's ``meta.json``, a checkpoint's sidecar). The
reader checks the description against the bytes it read, then unpickles
them with ``weights_only=True`` (no code ever runs).
"""
import io
import os
import zlib
from typing import Any, Dict, Optional

import torch

Description = Dict[str, int]


class CorruptFileError(RuntimeError):
    r"""A file whose bytes are not those its index describes."""


def save_checked(obj: Any, path: str) -> Description:
    r"""Saves :obj:`obj` to :obj:`path` atomically; returns its description."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getbuffer()
    with open(path + ".tmp", "wb") as f:
        f.write(payload)
    os.replace(path + ".tmp", path)
    return {"bytes": len(payload), "crc32": zlib.crc32(payload)}


def load_checked(path: str, expected: Optional[Description] = None) -> Any:
    r"""Reads :obj:`path`, refusing it unless its size and checksum match
    :obj:`expected` (``None``: a file written before checksums, only
    unpickled safely)."""
    try:
        with open(path, "rb") as f:
            payload = f.read()
    except OSError as e:
        raise CorruptFileError(f"Cannot read '{path}': {e}") from e
    if expected is not None:
        if len(payload) != expected["bytes"]:
            raise CorruptFileError(f"'{path}' is corrupt, truncated or of another run: "
                                   f"{len(payload)} bytes, its index says {expected['bytes']}")
        if zlib.crc32(payload) != expected["crc32"]:
            raise CorruptFileError(f"'{path}' is corrupt or of another run: its checksum "
                                   f"differs from the one its index records")
    try:
        return torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as e:  # torch raises several types for bad archives
        raise CorruptFileError(f"Cannot read '{path}': the file is corrupt, truncated or "
                               f"not a pyg_dist file ({e})") from e
