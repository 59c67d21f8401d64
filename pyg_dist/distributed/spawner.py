r"""Running a function on fresh local ranks joined in a process group
(:func:`spawn`) and telling why a run of them failed, in one line.

Why not :func:`torch.multiprocessing.start_processes` (read in torch 2.13's
``torch/multiprocessing/spawn.py``), which starts processes and joins them
too: what the tests, notebooks and ``pyg-dist`` need of a launcher, it
does not do:

- **results**: it drops ``fn``'s return value (``_wrap`` calls
  ``fn(i, *args)`` and keeps nothing), and pickles ``fn`` by reference, so
  a function or lambda defined in a notebook cell or ``__main__`` cannot
  travel (here they go by value, with cloudpickle, see :func:`dumps`);
- **one-line errors**: it raises the error of whichever process it saw
  exit first, as ``"\n\n-- Process i terminated with the following
  error:\n"`` and a traceback; often that is a survivor's lost connection,
  not the rank that failed. Here the first line is the root cause (a
  rank's own error preferred over what it caused on its peers) and the
  lost rank is named by its heartbeat;
- **time to report**: on a failure it SIGTERMs the other processes at
  once, so a survivor cannot say which peer it lost; here they get
  :data:`FAILURE_GRACE` seconds first;
- **stopped ranks**: it waits on the processes' sentinels only, so a rank
  stopped by SIGSTOP (or a hung device) leaves its peers waiting out the
  collective timeout; here it is killed after :data:`STOPPED_GRACE`;
- **signals**: it forwards none, and its child swallows
  :class:`KeyboardInterrupt` and exits 0 (a success); here SIGTERM,
  SIGHUP and Ctrl-C reach the ranks as SIGTERM, training checkpoints and
  stops, and the error names the signal;
- **orphans**: its ranks get ``PR_SET_PDEATHSIG`` = SIGINT, which reaches
  them only when their parent dies, and a rank that ignores SIGINT (ours
  do while starting: a terminal's Ctrl-C goes to the whole process group)
  or one forked by a forkserver (whose parent is the forkserver, not the
  caller) outlives a SIGKILLed caller; here ranks get SIGKILL with their
  caller (:func:`~pyg_dist.distributed.signals.die_with_parent`, and a
  watch on the caller for a rank of the forkserver);
- **start time**: its ``"forkserver"`` is multiprocessing's, which imports
  only ``__main__`` before forking (nothing from a notebook or pytest: every
  rank imports torch and PyG anew), may have started threads or a GPU
  driver by that import, and hands ranks its own environment and stdout of
  when it started; here
  the forkserver imports torch and PyG once, and each rank gets the
  caller's environment and output as they are now
  (:mod:`~pyg_dist.distributed.forkserver`).

Measured on 2 busy cores (torch 2.13, CPython 3.11), called from a
``__main__`` without a file (a notebook, pytest): two ranks that set up a
gloo group and run an empty function take a median 0.8 s here once the
forkserver is up (7 s for the call that starts it, 11 s with
``PYG_DIST_START_METHOD=spawn``), against 11 s with ``start_processes``'
``"forkserver"`` and 25 s with its ``"spawn"``."""
import numbers
import os
import pickle
import queue
import re
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from pyg_dist.distributed.forkserver import Caller, adopt_caller, rank_context
from pyg_dist.distributed.group import DEFAULT_TIMEOUT, free_port, init
from pyg_dist.distributed.heartbeat import Heartbeat, name_lost_ranks, stop_heartbeat
from pyg_dist.distributed.placement import rank_threads
from pyg_dist.distributed.signals import (STOP_SIGNALS, Interrupted, die_with_parent,
                                          handle_stop_signals, starting_ranks)
from pyg_dist.utils.allocator import environment_for_ranks

def dumps(obj: Any, what: str) -> bytes:
    r""":obj:`obj` serialised for another process, functions and classes
    defined in a notebook cell or in ``__main__`` (lambdas and closures
    too) by value (cloudpickle); a clear error names what could not be."""
    import cloudpickle
    try:
        return cloudpickle.dumps(obj)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same
        raise TypeError(
            f"pyg_dist cannot send {what} to the ranks: {type(e).__name__}: {e}. Pass "
            f"only objects that can be pickled (tensors, numbers, paths, functions; not "
            f"open files, locks or process groups), or define the function in a module "
            f"and import it") from e


class _ByValue:
    r"""Arguments cloudpickled in the parent (see :func:`spawn`)."""

    def __init__(self, data: bytes) -> None:
        self.data = data


def _worker(rank: int, world_size: int, port: int, backend: str, timeout: float,
            threads: Optional[int], call: bytes, args, results, parent_pid: int,
            caller: Optional[dict] = None) -> None:
    die_with_parent(parent_pid)
    if caller is not None:  # forked by the forkserver: see adopt_caller
        adopt_caller(**caller)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if threads:
        torch.set_num_threads(threads)
    try:
        # A stop signal held since the rank started is taken here, and reported.
        handle_stop_signals(leave_ctrl_c_to_launcher=True)
        init(backend, f"tcp://127.0.0.1:{port}", rank, world_size, timeout)
        fn = pickle.loads(call)
        out = fn(*(pickle.loads(args.data) if isinstance(args, _ByValue) else args))
        results.put((rank, True, dumps(out, f"rank {rank}'s return value")))
    except BaseException as e:  # report every failure to the parent
        named = name_lost_ranks(e)
        results.put((rank, False, f"{type(named).__name__}: {named}\n"
                                  f"{traceback.format_exc()}"))
    finally:
        stop_heartbeat()
        if dist.is_initialized():
            dist.destroy_process_group()


# Seconds a rank may stay stopped (SIGSTOP) before the launcher kills it.
STOPPED_GRACE = 5.0
# Seconds the other ranks get to report their own error once a rank failed,
# before the launcher kills them: a survivor's collective fails as soon as the
# failed rank's sockets close, then it watches the heartbeats for
# Heartbeat.silence seconds to name the lost rank (name_lost_ranks); the rest
# is margin for a loaded machine. A rank still running after it is stuck
# (waiting in a collective that only the collective timeout would end) or
# busy with a run that has failed anyway.
FAILURE_GRACE = Heartbeat.silence + 3.0
# Seconds beyond the timeout ranks get to finish an epoch and checkpoint
# after the launcher forwarded a SIGTERM.
STOP_GRACE = 60.0


class _ForwardedStop:
    r"""While installed (main thread only), a stop signal
    (:data:`STOP_SIGNALS`) or SIGINT to the launcher is forwarded to its
    ranks (:attr:`procs`) as SIGTERM, which asks them to checkpoint and stop
    (or, with nothing to finish, to stop at once), and remembered. Before
    any rank started there is nothing to forward: it raises
    :class:`Interrupted` (SIGINT: :class:`KeyboardInterrupt`) at once."""

    def __init__(self) -> None:
        self.procs: List[Any] = []
        self.since, self.signum, self.previous = None, None, {}
        self.told: set = set()  # the pids a SIGTERM was sent to
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, *STOP_SIGNALS):
            self.previous[signum] = signal.signal(signum, self._forward)

    def _forward(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.since is not None:  # a second signal: stop waiting
            raise KeyboardInterrupt(f"a second {name}: the ranks were killed")
        if not any(p.pid is not None for p in self.procs):
            raise KeyboardInterrupt if signum == signal.SIGINT else Interrupted(name)
        self.since, self.signum = time.monotonic(), signum
        self.forward()

    def forward(self) -> None:
        r"""Sends the stop, once it came, to every running rank not sent
        it yet (one SIGTERM each)."""
        if self.since is None:
            return
        for p in self.procs:
            if p.pid not in self.told and p.is_alive():
                self.told.add(p.pid)
                os.kill(p.pid, signal.SIGTERM)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            if handler is not None:
                signal.signal(signum, handler)

    def prefix(self, cause: str) -> str:
        r""":obj:`cause` (a rank's failure) led by the signal that was
        forwarded, unless it names it already (the ranks only get SIGTERM)."""
        if self.signum is None or (self.signum == signal.SIGTERM and "SIGTERM" in cause):
            return cause
        name = signal.Signals(self.signum).name
        if self.signum == signal.SIGINT:
            return f"Ctrl-C (SIGINT, forwarded to the ranks as SIGTERM): {cause}"
        if self.signum == signal.SIGTERM:
            return f"SIGTERM (forwarded to the ranks): {cause}"
        return f"{name} (forwarded to the ranks as SIGTERM): {cause}"


def is_stopped(pid: Optional[int]) -> bool:
    r"""Whether process :obj:`pid` is stopped (Linux ``/proc``; else never)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class SpawnError(RuntimeError):
    r"""Ranks of :func:`spawn` failed. The message's first line,
    :attr:`cause`, is the root cause: the first failing rank's one-line
    error, a rank's own error preferred over the lost connections it caused
    on the others. :attr:`details` (the lines after it) holds every failed
    rank's fate and traceback; :attr:`errors` maps each failed rank to its
    report."""

    def __init__(self, cause: str, details: str, errors: Dict[int, str]) -> None:
        super().__init__(f"{cause}\n{details}")
        self.cause, self.details, self.errors = cause, details, errors

    def __reduce__(self):  # RuntimeError's pickling would call __init__(message)
        return type(self), (self.cause, self.details, self.errors)


# What a failure causes on the ranks that did not fail (their peer is gone,
# or the launcher killed them): never the root cause when a rank has its own.
_SECONDARY = re.compile(r"RankLostError|lost ranks? \d|Connection (closed|reset) by peer|"
                        r"did not finish")
# What a stop signal forwarded to a rank with nothing to finish leads to: it
# stops at once (Interrupted), or dies of the SIGTERM before its handler is in.
_INTERRUPTED = re.compile(r"^rank \d+: Interrupted: |"
                          r"^rank \d+ died \(killed by SIG(TERM|HUP)\)")


def _interrupted(rank: int, report: str) -> bool:
    return bool(_INTERRUPTED.search(_one_line(rank, report)))


def silent_failure(rank: int, process, stopped: Dict[int, float], grace: float,
                   now: float, nothing_queued: bool) -> Optional[str]:
    r"""How rank :obj:`rank` (:obj:`process`) failed without reporting: it
    died (and :obj:`nothing_queued` holds no last report of it), or it has
    been stopped (SIGSTOP, a hung device) for more than :obj:`grace`
    seconds, then it is killed now, so that its peers' collectives fail
    now. :obj:`stopped` keeps since when each rank is seen stopped.
    ``None``: it has not failed so."""
    if not process.is_alive():
        return died_message(rank, process.exitcode) if nothing_queued else None
    if not is_stopped(process.pid):
        stopped.pop(rank, None)
        return None
    if now - stopped.setdefault(rank, now) <= grace:
        return None
    process.kill()
    return f"rank {rank} was stopped (SIGSTOP) for more than {grace:g} s: killed"


def died_message(rank: int, exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"rank {rank} died (killed by {signal.Signals(-exitcode).name})"
        except ValueError:  # not a signal this platform names
            return f"rank {rank} died (killed by signal {-exitcode})"
    return f"rank {rank} died (exit code {exitcode})"


def _one_line(rank: int, report: str) -> str:
    r"""The first line of a rank's :obj:`report`, labelled with its rank."""
    first = (report.strip().splitlines() or ["(no message)"])[0]
    return first if first.startswith(f"rank {rank} ") else f"rank {rank}: {first}"


def spawn(fn: Callable, nprocs: int, args: Sequence = (), backend: str = "gloo",
          timeout: float = DEFAULT_TIMEOUT, join_timeout: Optional[float] = None,
          threads: Optional[int] = None, malloc: str = "reuse") -> List[Any]:
    r"""Runs ``fn(*args)`` in :obj:`nprocs` fresh processes joined in a
    process group and returns their return values in rank order.

    Works from scripts, tests and notebooks: :obj:`fn` and :obj:`args` may
    be defined in a notebook cell or a script's ``__main__`` (functions,
    lambdas, closures, classes: they travel by value, with cloudpickle; a
    module's functions travel by name). If a rank
    fails, dies or is stopped (SIGSTOP) for more than
    ``min(timeout, STOPPED_GRACE)`` seconds (it is then killed), the others
    get :data:`FAILURE_GRACE` seconds to report their own error and are then
    killed; a :class:`SpawnError` (a :class:`RuntimeError`) says the root
    cause in its first line and every failed rank's fate and traceback after
    it. SIGTERM, SIGHUP and Ctrl-C reach the ranks as SIGTERM (training
    ends its epoch, checkpoints and stops, and the error names the signal;
    where no rank had anything to finish, each stops at once and
    :class:`Interrupted` names the signal; a second signal stops waiting
    with :class:`KeyboardInterrupt`, as does Ctrl-C when every rank
    returned). On Linux the ranks die with this process, however it
    ends (SIGKILL included).
    :obj:`join_timeout` bounds the whole run.
    :obj:`threads` sets each rank's intra-op threads (default: :func:`rank_threads`).
    The ranks start with the environment of allocator mode :obj:`malloc`
    (:func:`~pyg_dist.utils.allocator.rank_environment`: by default glibc's
    per-thread cache of small chunks off, which keeps the heap's free space
    in one piece).
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, numbers.Integral) or nprocs < 1:
        raise ValueError(f"nprocs must be a whole number >= 1 (got {nprocs!r})")
    nprocs = int(nprocs)
    call = dumps(fn, f"'{getattr(fn, '__qualname__', fn)}'")
    # From here on a stop signal reaches the ranks as SIGTERM (before the
    # first started, it raises Interrupted here).
    stopping = _ForwardedStop()
    try:
        with environment_for_ranks(malloc), rank_context() as (ctx, parent):
            results = ctx.Queue()
            port = free_port()
            threads = threads or rank_threads(nprocs)
            # The arguments travel as multiprocessing sends them (tensors through
            # shared memory, not copied per rank), unless the caller is a notebook,
            # whose cell-defined objects only travel by value, or they cannot be
            # pickled by reference (a lambda): then cloudpickled, copied per rank.
            interactive = not hasattr(sys.modules.get("__main__"), "__file__")
            payloads = [None] if interactive else [tuple(args), None]
            while payloads:
                payload = payloads[0]
                if payload is None:
                    payload = _ByValue(dumps(tuple(args), "the arguments"))
                caller = Caller() if ctx.get_start_method() == "forkserver" else None
                procs = stopping.procs = [
                    ctx.Process(target=_worker, daemon=True,
                                args=(r, nprocs, port, backend, timeout, threads, call,
                                      payload, results, parent, caller))
                    for r in range(nprocs)]
                try:  # (a rank forked by the forkserver has the forkserver's held)
                    with starting_ranks(hold_stop_signals=caller is None):
                        for p in procs:
                            p.start()
                    break
                except (pickle.PicklingError, AttributeError, TypeError):
                    if any(p.pid is not None for p in procs) or isinstance(payload, _ByValue):
                        raise  # a rank started: not a failure to pickle the arguments
                    payloads.pop(0)
                except ValueError as e:  # more shared tensors than the forkserver passes
                    if (any(p.pid is not None for p in procs) or caller is None
                            or "too many fds" not in str(e)):
                        raise
                    ctx, parent = torch.multiprocessing.get_context("spawn"), os.getpid()
                    results = ctx.Queue()
    except BaseException:
        stopping.restore()
        raise
    stopping.forward()  # also to the ranks that started after a stop signal
    outcome: dict = {}
    failed: List[int] = []  # ranks in the order their failure was seen
    deadline = None if join_timeout is None else time.monotonic() + join_timeout
    failed_at = None
    watchdog = False  # the other ranks' grace after the first failure ran out
    stopped: dict = {}  # rank -> since when it is seen stopped
    try:
        while len(outcome) < nprocs:
            now = time.monotonic()
            if deadline is not None and now > deadline:
                break
            # A stop forwarded before the failure gives every rank time to
            # checkpoint (below), unless a rank stopped at once for it (its
            # peers cannot go on); otherwise the run has failed: no waiting
            # for the collective timeout.
            if (failed_at is not None and now - failed_at > FAILURE_GRACE
                    and (stopping.since is None or stopping.since > failed_at
                         or any(_interrupted(r, outcome[r][1]) for r in failed))):
                watchdog = True
                break
            if stopping.since is not None and now - stopping.since > timeout + STOP_GRACE:
                break  # the ranks had their chance to checkpoint and stop
            try:
                rank, ok, payload = results.get(timeout=0.2)
                outcome[rank] = (ok, payload)
            except queue.Empty:
                pass
            for r, p in enumerate(procs):
                fate = None if r in outcome else silent_failure(
                    r, p, stopped, min(timeout, STOPPED_GRACE), now, results.empty())
                if fate is not None:
                    outcome[r] = (False, fate)
            failed += [r for r, (ok, _) in outcome.items() if not ok and r not in failed]
            if failed_at is None and failed:
                failed_at = time.monotonic()
    finally:
        stopping.restore()
        for p in procs:
            if p.is_alive() and (watchdog or is_stopped(p.pid)):  # had its grace / cannot
                p.kill()                                         # act on SIGTERM
            p.join(timeout=1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():  # stopped (SIGSTOP) or ignoring SIGTERM
                p.kill()
                p.join()
    missing = [r for r in range(nprocs) if r not in outcome]
    errors = {r: msg.strip() for r, (ok, msg) in outcome.items() if not ok}
    if stopping.signum == signal.SIGINT and not (errors or missing):
        raise KeyboardInterrupt  # every rank returned: the caller still asked to stop
    if errors or missing:
        late = (f"did not finish within {FAILURE_GRACE:g} s of the first failure (killed)"
                if watchdog else "did not finish in time (terminated)")
        errors.update({r: late for r in missing})
        order = failed + missing
        own = [r for r in order if not _SECONDARY.search(_one_line(r, errors[r]))]
        if stopping.signum is not None and own and all(_interrupted(r, errors[r])
                                                        for r in own):
            # The ranks stopped at once (nothing to finish): only the signal to say.
            raise (KeyboardInterrupt() if stopping.signum == signal.SIGINT else
                   Interrupted(signal.Signals(stopping.signum).name))
        root = (own or order)[0]
        cause = stopping.prefix(_one_line(root, errors[root]))
        details = f"{len(errors)} of {nprocs} ranks failed:\n" + "\n".join(
            f"rank {r}: {msg}" for r, msg in sorted(errors.items()))
        raise SpawnError(cause, details, errors)
    return [pickle.loads(outcome[r][1]) for r in range(nprocs)]
