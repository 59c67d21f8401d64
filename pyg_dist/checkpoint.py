"""Per-epoch training checkpoints: one file per rank, so a run killed at any
point resumes from its last complete epoch with exactly the state an
uninterrupted run would have had."""
import os
import os.path as osp
import random
import secrets
import shutil
import zlib
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
import torch.distributed as dist

from pyg_dist.distributed import device
from pyg_dist.integrity import load_checked, read_json, save_checked, save_json, verify

LATEST = "latest.json"


class CheckpointError(RuntimeError):
    r"""A checkpoint that is missing, corrupt or from another run."""


class Checkpointer:
    r"""Writes and reads the checkpoints of one training run in
    :obj:`directory`:

    * ``epoch_{E}/rank_{r}.pt``: everything rank :math:`r` needs to continue
      after epoch :math:`E` (model, optimiser, RNG, sampler, cache and
      loader state, the metrics so far), written to a temporary file and
      renamed, so a file is whole or absent, and described by
      ``rank_{r}.pt.json`` (size and checksum, verified on load, and the
      rank and run that wrote it; a file without its sidecar is refused);
    * ``latest.json``: the last epoch *every* rank wrote (rank 0 writes it
      after a barrier), the run's id (drawn at its first checkpoint, kept
      by its resumptions) and what the run must match to resume from it
      (:obj:`identity`: world size, graph, hyper-parameters).

    A rank's file is read only where its sidecar names that rank and the
    run ``latest.json`` names: another rank's pair, or a pair of another
    run at the same epoch, copied in its place is refused before any rank
    starts (each rank's state is its own: its sampler's and loader's
    draws, its cache, its random streams).

    Older epochs are removed once a newer one is complete, so a crash while
    writing leaves the previous checkpoint in place. Files are read with
    ``weights_only=True``: a tampered file raises, it never executes code;
    a corrupt one (flipped bytes) is refused by its checksum.
    """

    def __init__(self, directory: str, every: int, identity: Dict[str, Any],
                 upgrade: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None) -> None:
        self.directory, self.every, self.identity = directory, every, identity
        self.upgrade = upgrade  # reads the identity an older release wrote
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.run: Optional[str] = None  # drawn at the first save, or the resumed run's

    def due(self, epoch: int, last_epoch: int) -> bool:
        return self.every > 0 and (epoch % self.every == 0 or epoch == last_epoch)

    def _epoch_dir(self, epoch: int) -> str:
        return osp.join(self.directory, f"epoch_{epoch}")

    def save(self, epoch: int, state: Dict[str, Any]) -> None:
        r"""Every rank saves its :obj:`state` after :obj:`epoch` (a collective)."""
        if self.run is None:
            self.run = self._new_run()
        folder = self._epoch_dir(epoch)
        os.makedirs(folder, exist_ok=True)
        path = osp.join(folder, f"rank_{self.rank}.pt")
        described = save_checked({"epoch": epoch, "rank": self.rank, **state}, path)
        save_json({**described, "rank": self.rank, "run": self.run}, path + ".json")
        if self.world_size > 1:
            dist.barrier()  # every rank's file is complete before latest.json names it
        if self.rank == 0:
            save_json({"epoch": epoch, "run": self.run, **self.identity},
                      osp.join(self.directory, LATEST))
            for name in os.listdir(self.directory):
                if name.startswith("epoch_") and name != osp.basename(folder):
                    shutil.rmtree(osp.join(self.directory, name), ignore_errors=True)
        if self.world_size > 1:
            dist.barrier()  # nobody reads latest.json before it names this epoch

    def _new_run(self) -> str:
        r"""A fresh run id, rank 0's, known to every rank."""
        run = [secrets.token_hex(8)]
        if self.world_size > 1:
            dist.broadcast_object_list(run, src=0)
        return run[0]

    def latest(self) -> Dict[str, Any]:
        r"""``latest.json``: the epoch of the latest complete checkpoint,
        refused (:class:`CheckpointError`) if there is none, if it cannot
        be read, or if it was written by a run with another world size,
        graph or hyper-parameters."""
        latest = osp.join(self.directory, LATEST)
        if not osp.exists(latest):
            raise CheckpointError(f"Cannot resume: no checkpoint in '{self.directory}' "
                                  f"(train with --checkpoint-every N first)")
        try:
            meta = read_json(latest)
        except (OSError, RuntimeError) as e:
            raise CheckpointError(str(e)) from e
        if not isinstance(meta, dict) or not isinstance(meta.get("epoch"), int):
            raise CheckpointError(f"'{latest}' is corrupt: it names no epoch")
        if not isinstance(meta.get("run"), str):
            raise CheckpointError(f"'{latest}' names no run (written by an older "
                                  f"pyg_dist, or altered): its rank files cannot be "
                                  f"told from another run's; train again")
        if self.upgrade is not None:
            meta = self.upgrade(meta)
        differ = {k: (meta.get(k), v) for k, v in self.identity.items() if meta.get(k) != v}
        if differ:
            lines = "; ".join(f"{k}: checkpoint {a!r}, this run {b!r}"
                              for k, (a, b) in sorted(differ.items()))
            raise CheckpointError(f"Cannot resume from '{self.directory}': it belongs to "
                                  f"another run ({lines})")
        return meta

    def rank_file(self, epoch: int, rank: int) -> str:
        return osp.join(self._epoch_dir(epoch), f"rank_{rank}.pt")

    def described(self, epoch: int, rank: int, run: str) -> Dict[str, int]:
        r"""The size and checksum the sidecar ``rank_{r}.pt.json`` records
        for rank :obj:`rank`'s file of :obj:`epoch`; a missing file or
        sidecar is refused (a file that cannot be checked is never read),
        and so is a sidecar that names another rank or another run than
        :obj:`run` (``latest.json``'s)."""
        path = self.rank_file(epoch, rank)
        if not osp.exists(path):
            raise CheckpointError(f"Checkpoint file '{path}' is missing "
                                  f"({LATEST} names epoch {epoch})")
        if not osp.exists(path + ".json"):
            raise CheckpointError(f"Checkpoint sidecar '{path}.json' is missing: '{path}' "
                                  f"cannot be checked (copy both files, or train again)")
        try:
            described = read_json(path + ".json")
        except (OSError, RuntimeError) as e:
            raise CheckpointError(str(e)) from e
        if not isinstance(described, dict) or not all(
                isinstance(described.get(k), int) for k in ("bytes", "sum64")):
            raise CheckpointError(f"'{path}.json' is corrupt: it describes no file")
        if described.get("rank") != rank:
            raise CheckpointError(f"'{path}' is rank {described.get('rank')}'s checkpoint "
                                  f"(its sidecar says so), not rank {rank}'s: copy each "
                                  f"rank's own pair of files back")
        if described.get("run") != run:
            raise CheckpointError(f"'{path}' belongs to another run than '{LATEST}' names "
                                  f"(its sidecar says run {described.get('run')!r}, "
                                  f"{LATEST} {run!r}): copy the run's own files back")
        return {k: described[k] for k in ("bytes", "sum64")}

    def verify(self, latest: Dict[str, Any], rank: int) -> None:
        r"""Checks rank :obj:`rank`'s file of the checkpoint :obj:`latest`
        (:meth:`latest`) against its sidecar without unpickling it (what
        the launcher does before any rank starts)."""
        epoch = latest["epoch"]
        described = self.described(epoch, rank, latest["run"])
        try:
            verify(self.rank_file(epoch, rank), described)
        except (OSError, RuntimeError) as e:
            raise CheckpointError(str(e)) from e

    def load(self) -> Dict[str, Any]:
        r"""This rank's state of the latest complete checkpoint; raises
        :class:`CheckpointError` if there is none, if it was written by a
        run with another world size, graph or hyper-parameters, or if a
        file or its sidecar is missing or corrupt."""
        meta = self.latest()
        if self.world_size > 1:  # e.g. ranks given different directories
            epochs = torch.tensor([meta["epoch"], -meta["epoch"]], dtype=torch.long,
                                  device=device())
            dist.all_reduce(epochs, op=dist.ReduceOp.MAX)
            if int(epochs[0]) != -int(epochs[1]):
                raise CheckpointError(f"Ranks found different latest checkpoints (epochs "
                                      f"{-int(epochs[1])} to {int(epochs[0])}): is "
                                      f"'{self.directory}' the same directory on every node?")
        path = self.rank_file(meta["epoch"], self.rank)
        described = self.described(meta["epoch"], self.rank, meta["run"])
        try:
            state = load_checked(path, described)
        except (OSError, RuntimeError) as e:
            raise CheckpointError(str(e)) from e
        if not isinstance(state, dict) or state.get("epoch") != meta["epoch"]:
            raise CheckpointError(f"'{path}' is not the checkpoint of epoch {meta['epoch']}")
        if state.get("rank") != self.rank:
            raise CheckpointError(f"'{path}' is rank {state.get('rank')}'s checkpoint, not "
                                  f"rank {self.rank}'s")
        self.run = meta["run"]  # the resumed run's later checkpoints keep its id
        return state


def rng_state(device: Optional[torch.device] = None) -> Dict[str, Any]:
    r"""The random states a training step draws from (dropout and anything
    else on torch's default generators, Python's and NumPy's)."""
    version, keys, gauss = random.getstate()
    np_state = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": [version, list(keys), gauss],
             "numpy": [torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]),
                       int(np_state[3]), float(np_state[4])]}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Dict[str, Any], device: Optional[torch.device] = None) -> None:
    torch.set_rng_state(state["torch"])
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    keys_np, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(("MT19937", keys_np.numpy().astype(np.uint32), pos, has_gauss, cached))
    if device is not None and device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def check_same_model(model: torch.nn.Module) -> None:
    r"""After a resume, the ranks must hold the same parameters (each loaded
    its own file): one all-reduce of a checksum of their bytes."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    flat = torch.cat([p.detach().reshape(-1).cpu().double() for p in model.parameters()])
    digest = zlib.crc32(flat.numpy().tobytes())
    both = torch.tensor([digest, -digest], dtype=torch.long, device=device())
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    if int(both[0]) != -int(both[1]):
        raise CheckpointError("The ranks resumed different models: their checkpoint files "
                              "come from different runs or epochs")
