r"""Generate-once caching of the generated datasets: a graph is built by its
generator on first use and read back from ``root`` afterwards."""
from __future__ import annotations

import hashlib
import inspect
import os
import os.path as osp
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch_geometric.data import Data


def default_root(root: Optional[str] = None) -> str:
    r"""The dataset directory: :obj:`root`, else ``$PYG_DIST_DATA``, else
    ``~/.cache/pyg_dist`` (user-expanded)."""
    if root is None:
        root = os.environ.get('PYG_DIST_DATA',
                              osp.join('~', '.cache', 'pyg_dist'))
    return osp.expanduser(root)


def load_generated(generate: Callable[..., Data], root: Optional[str],
                   size: Tuple[str, str], keys: Sequence[str],
                   **kwargs: Any) -> Data:
    r"""Returns :obj:`generate(**kwargs)`, generating it once and caching the
    tensors :obj:`keys` under :obj:`root` (see :func:`default_root`).

    The file is named
    ``{generate.__name__}_{tag}{value}_seed{seed}_{digest}.pt`` where
    :obj:`size` is ``(tag, parameter)`` (e.g. ``("n", "num_nodes")``) and
    ``digest`` hashes *all* resolved parameters of :obj:`generate`.

    Args:
        generate (callable): The generator; it must take a ``seed``.
        root (str, optional): Cache directory.
        size (Tuple[str, str]): File name tag and the parameter it shows.
        keys (Sequence[str]): The tensors of the returned ``Data`` to store.
        **kwargs: Arguments of :obj:`generate`.
    """
    root = default_root(root)
    # Key the file on *all* resolved parameters (defaults included), so a
    # different seed, size or changed default never reuses a stale file.
    params = inspect.signature(generate).bind(**kwargs)
    params.apply_defaults()
    args = params.arguments
    digest = hashlib.sha1(repr(sorted(args.items())).encode())
    name = (f"{generate.__name__}_{size[0]}{args[size[1]]}_"
            f"seed{args['seed']}_{digest.hexdigest()[:10]}.pt")
    path = osp.join(root, name)

    if osp.exists(path):
        # Plain tensor dict, so the safe `weights_only` loader suffices.
        return Data(**torch.load(path, weights_only=True))

    check_fits_in_memory(generate.__name__, args)
    data = generate(**kwargs)
    os.makedirs(root, exist_ok=True)
    # Write-then-rename so concurrent ranks never read a half-written file.
    tmp = f'{path}.{os.getpid()}.tmp'
    out: Dict[str, torch.Tensor] = {k: data[k] for k in keys}
    torch.save(out, tmp)
    os.replace(tmp, path)
    return data


# Peak resident bytes per directed edge of generating and partitioning a
# graph, measured on the default graph (1M nodes, 19.7M edges: 3.35 GB
# peak RSS; 2M nodes: 6.7 GB), and per feature entry (fp32, about three
# copies: generated, relabelled, per part).
BYTES_PER_EDGE = 170
BYTES_PER_FEATURE = 12


def estimated_bytes(args: Dict[str, Any]) -> int:
    r"""Peak memory of generating and partitioning a graph of the
    generator arguments :obj:`args` (``num_nodes`` or ``scale``, and
    ``avg_degree`` or ``edge_factor``, ``num_features``)."""
    nodes = args["num_nodes"] if "num_nodes" in args else 2 ** args["scale"]
    degree = args["avg_degree"] if "avg_degree" in args else 2 * args.get("edge_factor", 0)
    return nodes * (degree * BYTES_PER_EDGE + args.get("num_features", 0) * BYTES_PER_FEATURE)


def available_memory() -> Optional[int]:
    r"""Bytes this machine can give a new process: ``MemAvailable`` of
    ``/proc/meminfo``, or less under a cgroup (a container's or a
    scheduler's) memory limit; ``None`` where neither can be read."""
    limits = []
    try:
        with open("/proc/meminfo") as f:
            limits += [int(line.split()[1]) * 1024 for line in f
                       if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:  # cgroup v2: the limit minus what the group already uses
        with open("/sys/fs/cgroup/memory.max") as f, \
                open("/sys/fs/cgroup/memory.current") as g:
            limit = f.read().strip()
            if limit != "max":
                limits.append(int(limit) - int(g.read()))
    except (OSError, ValueError):
        pass
    return min(limits) if limits else None


def check_fits_in_memory(name: str, args: Dict[str, Any]) -> None:
    r"""Refuses, before any work, a generated graph whose estimated peak
    memory (:func:`estimated_bytes`) exceeds the memory available now."""
    need, have = estimated_bytes(args), available_memory()
    if have is not None and need > have:
        size = (f"num_nodes={args['num_nodes']:,}" if "num_nodes" in args
                else f"scale={args['scale']}")
        raise ValueError(f"{name}({size}) needs about {need / 2**30:,.1f} GiB to generate "
                         f"and partition (estimated: {BYTES_PER_EDGE} bytes per edge, "
                         f"{BYTES_PER_FEATURE} per feature); this machine has "
                         f"{have / 2**30:,.1f} GiB available: write it to disk and "
                         f"partition it out of core (pyg-dist rmat, partition --from)")
