r"""Ranks that stay up across notebook cells.

.. code-block:: python

    import pyg_dist.notebook
    ranks = pyg_dist.notebook.start(nprocs=2)  # 2 processes in one gloo group
    ranks.run(fn, *args)                        # fn(*args) on every rank, results in rank order

    %load_ext pyg_dist.notebook
    %%ranks
    part = pyg_dist.DistData.load(root, dist.get_rank())  # runs on every rank

    ranks.stop()

Each rank keeps :data:`state` (a namespace) from one call to the next: a
``%%ranks`` cell runs with its variables as globals, like ipyparallel's
``%%px``, so a name a cell binds is there in the next cell and, as
``pyg_dist.notebook.state.name``, in the functions given to
:meth:`Ranks.run`; it starts with ``torch`` and ``dist``
(``torch.distributed``) imported. Functions, lambdas and classes defined in cells travel
by value (see :func:`pyg_dist.spawn`). What a rank prints (progress bars
included) comes back under its rank's label. An exception on a rank is
raised here as a :class:`RankError` with every failed rank's traceback;
the group stays up when every other rank answered, and is stopped when
one has not answered :data:`ANSWER_GRACE` seconds after the failure (as a
rank waiting for the failed one in a collective would not; the error says
which). Arguments of :meth:`Ranks.run` are copied to every rank. :meth:`Ranks.stop`,
an interrupt (the stop button) and the kernel's end, however it ends, leave no
rank behind.
"""
import atexit
import io
import os
import pickle
import queue
import signal
import threading
import time
import traceback
import types
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist

from pyg_dist.distributed import (DEFAULT_TIMEOUT, die_with_parent, dumps, free_port, init,
                                  rank_threads)

#: This rank's variables, kept between calls (on the ranks; empty here).
state = types.SimpleNamespace()

#: Seconds the other ranks get to answer after one failed, before the group
#: is taken to be stuck in a collective and stopped.
ANSWER_GRACE = 10.0

_started: List["Ranks"] = []


class RankError(RuntimeError):
    r"""Ranks failed: ``tracebacks`` maps each failed rank to its traceback;
    ``usable`` says whether the group is still up."""

    def __init__(self, tracebacks: Dict[int, str], usable: bool) -> None:
        self.tracebacks, self.usable = tracebacks, usable
        fate = ("the other ranks answered: the group is still up" if usable else
                "the group was stopped: a rank had not answered "
                f"{ANSWER_GRACE:g} s after the failure (waiting on the failed ones?); "
                "start a new one with pyg_dist.notebook.start()")
        super().__init__("\n".join(f"rank {r}:\n{tb.rstrip()}"
                                   for r, tb in sorted(tracebacks.items())) + f"\n({fate})")


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    r"""SIGINT ignored in this process (main thread only) inside the block,
    so that processes started in it ignore it from their first instruction
    (an interrupt of the notebook signals its whole process group)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _serve(rank: int, world_size: int, port: int, backend: str, timeout: float,
           threads: int, inbox, outbox, parent_pid: int) -> None:
    r"""A rank: runs the jobs of :obj:`inbox` until told to stop."""
    die_with_parent(parent_pid)
    torch.set_num_threads(threads)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    init(backend, f"tcp://127.0.0.1:{port}", rank, world_size, timeout)
    state.torch, state.dist = torch, dist  # names every cell uses
    try:
        while (job := inbox.get()) is not None:
            kind, payload = job
            printed = io.StringIO()
            try:
                with redirect_stdout(printed), redirect_stderr(printed):
                    if kind == "call":
                        fn, args = pickle.loads(payload)
                        value = fn(*args)
                    else:
                        exec(compile(payload, "<%%ranks cell>", "exec"), vars(state))
                        value = None
                outbox.put((rank, True, dumps(value, f"rank {rank}'s result"),
                            printed.getvalue()))
            except BaseException:  # noqa: BLE001 - every failure goes back to the notebook
                outbox.put((rank, False, traceback.format_exc(), printed.getvalue()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Ranks:
    r""":obj:`nprocs` processes joined in a process group (gloo by default)
    that stay up until :meth:`stop`; see the module."""

    def __init__(self, nprocs: int, backend: str = "gloo",
                 timeout: float = DEFAULT_TIMEOUT, threads: Optional[int] = None) -> None:
        if nprocs < 1:
            raise ValueError(f"nprocs must be >= 1 (got {nprocs})")
        ctx = torch.multiprocessing.get_context("spawn")
        self.nprocs = nprocs
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(nprocs)]
        port, threads = free_port(), threads or rank_threads(nprocs)
        self._procs = [ctx.Process(target=_serve, daemon=True, args=(
            r, nprocs, port, backend, timeout, threads, self._inboxes[r], self._outbox,
            os.getpid())) for r in range(nprocs)]
        with _sigint_ignored():  # inherited: an interrupt never reaches a rank
            for p in self._procs:
                p.start()
        _started.append(self)

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    @property
    def pids(self) -> List[int]:
        return [p.pid for p in self._procs]

    def run(self, fn: Callable, *args: Any) -> List[Any]:
        r"""``fn(*args)`` on every rank; their results in rank order. What
        the ranks print is shown under their labels."""
        return self._submit(("call", dumps((fn, args), f"'{getattr(fn, '__qualname__', fn)}' "
                                                       f"and its arguments")))

    def run_cell(self, code: str) -> None:
        r"""The code of a cell on every rank, in the rank's :data:`state`
        (what ``%%ranks`` runs)."""
        self._submit(("cell", code))

    def _submit(self, job) -> List[Any]:
        if not self.alive:
            raise RuntimeError("These ranks are stopped: start new ones with "
                               "pyg_dist.notebook.start()")
        for inbox in self._inboxes:
            inbox.put(job)
        try:
            answers = self._collect()
        except KeyboardInterrupt:  # the stop button: a rank cannot be interrupted safely
            self.stop(now=True)
            raise KeyboardInterrupt("interrupted: the ranks were stopped (their state is "
                                    "lost); start new ones with pyg_dist.notebook.start()")
        for rank in sorted(answers):
            if answers[rank][2]:
                print(f"[rank {rank}]\n{answers[rank][2].rstrip()}")
        failed = {r: a[1] for r, a in answers.items() if not a[0]}
        if failed or len(answers) < self.nprocs:
            usable = len(answers) == self.nprocs
            if not usable:
                self.stop(now=True)
                failed.update({r: f"did not answer within {ANSWER_GRACE:g} s of the failure "
                                  f"(waiting on the failed ranks?): stopped"
                               for r in range(self.nprocs) if r not in answers})
            raise RankError(failed, usable)
        return [pickle.loads(answers[r][1]) for r in range(self.nprocs)]

    def _collect(self) -> Dict[int, tuple]:
        answers: Dict[int, tuple] = {}
        failed_at = None
        while len(answers) < self.nprocs:
            if failed_at is not None and time.monotonic() - failed_at > ANSWER_GRACE:
                break
            try:
                rank, ok, payload, printed = self._outbox.get(timeout=0.2)
                answers[rank] = (ok, payload, printed)
            except queue.Empty:
                pass
            for r, p in enumerate(self._procs):
                if r not in answers and not p.is_alive() and self._outbox.empty():
                    answers[r] = (False, f"rank {r} died (exit code {p.exitcode})", "")
            if failed_at is None and any(not a[0] for a in answers.values()):
                failed_at = time.monotonic()
        return answers

    def stop(self, now: bool = False) -> None:
        r"""Ends the ranks (and their state). Without :obj:`now` they finish
        the job they run first."""
        for p, inbox in zip(self._procs, self._inboxes):
            if p.is_alive() and not now:
                inbox.put(None)
        for p in self._procs:
            p.join(timeout=0 if now else 10)
            if p.is_alive():
                p.kill()
                p.join()
        self._procs = []
        if self in _started:
            _started.remove(self)

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Ranks(nprocs={self.nprocs}, {'up' if self.alive else 'stopped'})"


def start(nprocs: int = 2, backend: str = "gloo", timeout: float = DEFAULT_TIMEOUT,
          threads: Optional[int] = None) -> Ranks:
    r""":obj:`nprocs` ranks that stay up across cells (:class:`Ranks`);
    ``%%ranks`` cells run on the last ones started."""
    return Ranks(nprocs, backend, timeout, threads)


@atexit.register
def _stop_all() -> None:
    for ranks in list(_started):
        ranks.stop(now=True)


def _ranks_magic(line: str, cell: str) -> None:
    r"""``%%ranks [name]``: the cell's code on every rank of ``name`` (a
    :class:`Ranks` in the notebook) or of the last ranks started, each rank's
    output under its label."""
    if line.strip():
        from IPython import get_ipython
        ranks = get_ipython().user_ns[line.strip()]
    elif _started:
        ranks = _started[-1]
    else:
        raise RuntimeError("No ranks are up: ranks = pyg_dist.notebook.start(nprocs=2)")
    ranks.run_cell(cell)


def load_ipython_extension(ipython) -> None:
    r"""``%load_ext pyg_dist.notebook`` registers the ``%%ranks`` cell magic."""
    ipython.register_magic_function(_ranks_magic, "cell", "ranks")
