r"""Running a function on every rank: under ``torchrun`` in this process,
else in spawned local ranks (one per partition by default)."""
import functools
import os
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from pyg_dist.distributed import (DEFAULT_TIMEOUT, die_with_parent, handling_stop_signals,
                                  init, name_lost_ranks, rank_threads, spawn, stop_heartbeat,
                                  under_torchrun)
from pyg_dist.partition.book import read_meta


def run_training(root: str, config, out: Optional[str], nproc: Optional[int] = None,
                 timeout: float = DEFAULT_TIMEOUT) -> dict:
    r""":func:`~pyg_dist.train.train` on every rank (see :func:`run_ranks`);
    the config is validated, and the files, world size and folders checked
    (:func:`~pyg_dist.preflight.check_training`), before any rank starts.
    With ``config.overwrite`` the old run in :obj:`out` is removed only
    once every rank has read its inputs. Returns rank 0's summary (under
    torchrun: this rank's). A stop signal (SIGTERM, SIGHUP) ends training
    after its epoch with a checkpoint, and anything before the epochs at
    once with :class:`~pyg_dist.distributed.Interrupted` naming it
    (:func:`~pyg_dist.distributed.handling_stop_signals`)."""
    from pyg_dist.preflight import check_training
    from pyg_dist.train import train
    with handling_stop_signals():
        config.validate()
        check_training(root, config, out, nproc)
        return run_ranks(train, (root, config, out), root, nproc, timeout, config.malloc)


def run_prediction(root: str, model_dir: str, out: str, overwrite: bool = False,
                   timeout: float = DEFAULT_TIMEOUT, progress: bool = True) -> None:
    r""":func:`~pyg_dist.inference.predict` of the model trained into
    :obj:`model_dir` on every rank (one per partition of :obj:`root`),
    writing into :obj:`out`. The partition, the model's files and width and
    :obj:`out` are checked first (:func:`~pyg_dist.preflight.check_prediction`);
    with :obj:`overwrite`, the ranks remove earlier predictions in
    :obj:`out` before any of them writes. A stop signal (SIGTERM, SIGHUP)
    stops every rank at once with :class:`~pyg_dist.distributed.Interrupted`
    naming it (there is nothing to finish); the manifest is written last, so
    an interrupted prediction has none."""
    from pyg_dist.inference import predict
    from pyg_dist.preflight import check_prediction
    from pyg_dist.run_files import load_model
    with handling_stop_signals():
        spec = check_prediction(root, model_dir, out, overwrite)
        model = load_model(model_dir)
        source = {"model_dir": os.path.abspath(model_dir),
                  "model.pt": spec["files"]["model.pt"]}
        run_ranks(functools.partial(predict, progress=progress, source=source,
                                    overwrite=overwrite),
                  (model, root, out), root, None, timeout)


def runs_here(root: str, nproc: Optional[int] = None) -> bool:
    r"""Whether :func:`run_ranks` runs its function in this process: under
    torchrun (its environment present), or for a single rank."""
    return under_torchrun() or (nproc or read_meta(root)["num_parts"]) == 1


def run_ranks(fn: Callable, fn_args: tuple, root: str, nproc: Optional[int] = None,
              timeout: float = DEFAULT_TIMEOUT, malloc: str = "reuse") -> Any:
    r"""``fn(*fn_args)`` in every rank: in this process under torchrun
    (environment present) or for a single rank, else in :obj:`nproc` spawned
    local ranks (default: one per partition of :obj:`root`) started with
    allocator mode :obj:`malloc`'s environment. Returns this rank's result
    (spawned: rank 0's)."""
    if under_torchrun():
        die_with_parent(os.getppid())  # the agent: a killed torchrun leaves no rank
        torch.set_num_threads(rank_threads(int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
        return _in_group(fn, fn_args, timeout)
    nproc = nproc or read_meta(root)["num_parts"]
    if nproc == 1:
        return _in_group(fn, fn_args, timeout)
    return spawn(fn, nproc, fn_args, timeout=timeout, malloc=malloc)[0]


def _in_group(fn: Callable, fn_args: tuple, timeout: float) -> Any:
    r"""Runs in this process' group and tears it down before the
    interpreter exits (gloo's threads otherwise may abort the process)."""
    # LOCAL_WORLD_SIZE: under torchrun, whose agent forwards Ctrl-C
    with handling_stop_signals(leave_ctrl_c_to_launcher="LOCAL_WORLD_SIZE" in os.environ):
        init(timeout=timeout)
        try:
            return fn(*fn_args)
        except BaseException as e:
            named = name_lost_ranks(e)
            if named is e:
                raise
            raise named from e
        finally:
            stop_heartbeat()
            dist.destroy_process_group()
