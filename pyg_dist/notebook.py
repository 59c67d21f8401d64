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
by value (see :func:`pyg_dist.spawn`). What a rank prints appears while the
call runs, each line labelled ``[rank r]`` (a progress bar's redraws at most
every :data:`BAR_INTERVAL` seconds, each on a line of its own). An exception
on a rank is raised here as a :class:`RankError` with every failed rank's
traceback. The group stays up when every other rank answered and no
collective failed. It is down, and its ranks are stopped, when a rank died
or was stopped (SIGSTOP) for ``min(timeout, STOPPED_GRACE)``
seconds, when a collective failed (timed out after ``start``'s
:obj:`timeout`, or lost its peer), or when a rank has not answered
:data:`ANSWER_GRACE` seconds after another failed (as a rank waiting for the
failed one in a collective would not); the error says which.
Arguments of :meth:`Ranks.run` are copied to every rank. :meth:`Ranks.stop`,
an interrupt (the stop button) and the kernel's end, however it ends, leave no
rank behind.
"""
import atexit
import io
import os
import pickle
import queue
import re
import time
import traceback
import types
from contextlib import redirect_stderr, redirect_stdout
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from pyg_dist.distributed import (DEFAULT_TIMEOUT, STOPPED_GRACE, died_message,
                                  die_with_parent, dumps, free_port, init, rank_threads,
                                  silent_failure, starting_ranks)
from pyg_dist.utils.allocator import environment_for_ranks

#: This rank's variables, kept between calls (on the ranks; empty here).
state = types.SimpleNamespace()

#: Seconds the other ranks get to answer after one failed, before the group
#: is taken to be stuck in a collective and stopped.
ANSWER_GRACE = 10.0

#: Seconds the other ranks get to report once the group is down (a rank died
#: or a collective failed): a rank in a collective with the lost one fails as
#: soon as its connections close.
DOWN_GRACE = 3.0

#: Lines shown after the ranks' answers, at most, before late ranks are stopped.
DRAIN_LINES = 10_000

#: Seconds between two redraws of a rank's progress bar shown in the notebook
#: (each on a line of its own: the ranks' bars cannot share one line).
BAR_INTERVAL = 2.0

_started: List["Ranks"] = []


class RankError(RuntimeError):
    r"""Ranks failed: ``tracebacks`` maps each failed rank to its traceback;
    ``usable`` says whether the group is still up, ``down`` why it is not."""

    def __init__(self, tracebacks: Dict[int, str], usable: bool,
                 down: Optional[str] = None) -> None:
        self.tracebacks, self.usable, self.down = tracebacks, usable, down
        fate = ("the other ranks answered and no collective failed: the group is still up"
                if usable else f"the group is down: {down}; its ranks were stopped: start "
                               f"new ones with pyg_dist.notebook.start()")
        super().__init__("\n".join(f"rank {r}:\n{tb.rstrip()}"
                                   for r, tb in sorted(tracebacks.items())) + f"\n({fate})")


class _Printed(io.TextIOBase):
    r"""A rank's stdout and stderr during a job: each line is sent to the
    notebook as soon as it ends, a progress bar's redraw (text after a
    ``\r``, sent when flushed) at most every :data:`BAR_INTERVAL` seconds."""

    def __init__(self, rank: int, outbox) -> None:
        super().__init__()
        self.rank, self.outbox, self.pending, self.shown = rank, outbox, "", float("-inf")

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self._send(line)
        if "\r" in self.pending:  # a terminal shows only the last redraw
            self.pending = "\r" + self.pending.rstrip("\r").rsplit("\r", 1)[-1]
        return len(text)

    def flush(self) -> None:
        if self.pending.startswith("\r") and time.monotonic() - self.shown >= BAR_INTERVAL:
            self.shown = time.monotonic()
            self._send(self.pending)

    def finish(self) -> None:
        r"""Sends what is left of the last line."""
        if self.pending:
            self._send(self.pending)
            self.pending = ""

    def _send(self, line: str) -> None:
        shown = line.rstrip("\r").rsplit("\r", 1)[-1]
        if shown.strip() or "\r" not in line:  # not a bar cleared from its line
            self.outbox.put(("print", self.rank, shown))


# Errors of a collective that leave the group unusable: the transport's
# (a lost peer, a timeout) and torch's distributed errors.
_GROUP_ERROR = re.compile(r"/gloo/|Connection (closed|reset) by peer|Timed out waiting")


def _breaks_group(error: BaseException) -> Optional[str]:
    r"""One line saying why :obj:`error` leaves the group unusable, or
    ``None`` if it does not."""
    seen = set()
    while error is not None and id(error) not in seen:  # a user's error may wrap it
        seen.add(id(error))
        text = f"{type(error).__name__}: {error}".strip()
        if isinstance(error, dist.DistError) or _GROUP_ERROR.search(text):
            return text.splitlines()[0]
        error = error.__cause__ or error.__context__
    return None


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
            printed = _Printed(rank, outbox)
            try:
                with redirect_stdout(printed), redirect_stderr(printed):
                    if kind == "call":
                        fn, args = pickle.loads(payload)
                        value = fn(*args)
                    else:
                        exec(compile(payload, "<%%ranks cell>", "exec"), vars(state))
                        value = None
                printed.finish()  # its last line before the answer
                outbox.put(("answer", rank, True, dumps(value, f"rank {rank}'s result"), None))
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the notebook
                printed.finish()
                outbox.put(("answer", rank, False, traceback.format_exc(), _breaks_group(e)))
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
        self.nprocs, self.timeout = nprocs, timeout
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(nprocs)]
        port, threads = free_port(), threads or rank_threads(nprocs)
        self._procs = [ctx.Process(target=_serve, daemon=True, args=(
            r, nprocs, port, backend, timeout, threads, self._inboxes[r], self._outbox,
            os.getpid())) for r in range(nprocs)]
        # inherited: an interrupt never reaches a rank; glibc's cache off
        with environment_for_ranks("reuse"), starting_ranks():
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
        the ranks print is shown as it comes, each line under its rank's
        label."""
        return self._submit(("call", dumps((fn, args), f"'{getattr(fn, '__qualname__', fn)}' "
                                                       f"and its arguments")))

    def run_cell(self, code: str) -> None:
        r"""The code of a cell on every rank, in the rank's :data:`state`
        (what ``%%ranks`` runs)."""
        self._submit(("cell", code))

    def _submit(self, job) -> List[Any]:
        if self._procs and not self.alive:  # a rank died between calls
            dead = {r: died_message(r, p.exitcode) for r, p in enumerate(self._procs)
                    if not p.is_alive()}
            self.stop(now=True)
            raise RankError(dead, False, "; ".join(dead.values()))
        if not self.alive:
            raise RuntimeError("These ranks are stopped: start new ones with "
                               "pyg_dist.notebook.start()")
        for inbox in self._inboxes:
            inbox.put(job)
        try:
            answers, down = self._collect()
        except KeyboardInterrupt:  # the stop button: a rank cannot be interrupted safely
            self.stop(now=True)
            raise KeyboardInterrupt("interrupted: the ranks were stopped (their state is "
                                    "lost); start new ones with pyg_dist.notebook.start()")
        failed = {r: a[1] for r, a in answers.items() if not a[0]}
        if failed or len(answers) < self.nprocs:
            late = [r for r in range(self.nprocs) if r not in answers]
            if down is not None or late:
                grace = DOWN_GRACE if down is not None else ANSWER_GRACE
                down = down or (f"rank{'s' if len(late) > 1 else ''} "
                                f"{', '.join(map(str, late))} had not answered {grace:g} s "
                                f"after the failure (waiting on the failed ones in a "
                                f"collective?)")
                self.stop(now=True)
                failed.update({r: f"did not answer within {grace:g} s of the failure: "
                                  f"stopped" for r in late})
            raise RankError(failed, down is None, down)
        return [pickle.loads(answers[r][1]) for r in range(self.nprocs)]

    def _collect(self) -> Tuple[Dict[int, tuple], Optional[str]]:
        r"""Shows what the ranks print as it comes; returns their answers
        (those that came) and why the group is down (``None`` if it is
        not known to be)."""
        answers: Dict[int, tuple] = {}
        failed_at, down = None, None
        stopped: Dict[int, float] = {}  # rank -> since when it is seen stopped
        while len(answers) < self.nprocs:
            now = time.monotonic()
            if failed_at is not None and now - failed_at > (DOWN_GRACE if down else
                                                            ANSWER_GRACE):
                break
            try:
                message = self._outbox.get(timeout=0.2)
            except queue.Empty:
                message = None
            if message is not None and message[0] == "print":
                print(f"[rank {message[1]}] {message[2]}", flush=True)
            elif message is not None:
                _, rank, ok, payload, broken = message
                answers[rank] = (ok, payload)
                if broken and down is None:
                    down = f"a collective failed on rank {rank} ({broken})"
            for r, p in enumerate(self._procs):
                if r in answers:
                    continue
                fate = silent_failure(r, p, stopped, min(self.timeout, STOPPED_GRACE), now,
                                      self._outbox.empty())
                if fate is not None:  # it died or was killed: its peers cannot go on
                    answers[r] = (False, fate)
                    down = down or fate
            if failed_at is None and any(not a[0] for a in answers.values()):
                failed_at = time.monotonic()
        # The lines still queued (a rank that has not answered may print on:
        # a bounded number, then it is stopped).
        for _ in range(DRAIN_LINES):
            try:
                message = self._outbox.get_nowait()
            except queue.Empty:
                break
            if message[0] == "print":
                print(f"[rank {message[1]}] {message[2]}", flush=True)
        return answers, down

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
