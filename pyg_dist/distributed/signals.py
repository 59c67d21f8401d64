r"""Stop signals and process lifetime: a scheduler's SIGTERM or a closed
terminal's SIGHUP ends a run after its epoch (with a checkpoint) or, where
there is nothing to finish, at once with a one-line :class:`Interrupted`;
the processes a launcher starts hold these signals until their handlers
are in (:func:`starting_ranks`) and die with their launcher
(:func:`die_with_parent`), so no rank is orphaned."""
import ctypes
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional

#: The signals that ask a run to stop: a scheduler's preemption (SIGTERM),
#: a closed terminal or SSH session (SIGHUP).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                     if hasattr(signal, name))

_stop = threading.Event()  # set by a stop signal during training: stop after this epoch
_stopping: Dict[str, Any] = {"signal": None, "at_epoch_end": False}


class Interrupted(KeyboardInterrupt):
    r"""A stop signal (:data:`STOP_SIGNALS`) arrived where there is no epoch
    to finish: in a launcher before its ranks run, in a rank's set-up before
    the first epoch, in prediction. Its message is the signal's name. A
    :class:`KeyboardInterrupt`, so that no ``except Exception`` takes it
    for an error of the code it interrupts."""


def stop_requested() -> bool:
    r"""Whether this rank was asked to stop during training's epochs (a
    stop signal: a scheduler's preemption, a closed terminal, the
    launcher's Ctrl-C forwarded as SIGTERM); training loops end the current
    epoch, checkpoint and stop."""
    return _stop.is_set()


def stop_signal() -> Optional[str]:
    r"""The name of the signal that asked this process to stop (``None``:
    none did since its stop signals were last handled)."""
    return _stopping["signal"]


def stop_at_epoch_end() -> None:
    r"""From now on a stop signal only requests a stop (:func:`stop_requested`):
    training's epoch loop calls this as it starts, then ends its epoch,
    checkpoints and stops. Before, in a set-up that has nothing to finish or
    keep, a stop signal raises :class:`Interrupted` at once, so that a rank
    stops within seconds of it, however long its set-up."""
    _stopping["at_epoch_end"] = True


def _on_stop_signal(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    first = _stopping["signal"] is None
    _stopping["signal"] = _stopping["signal"] or name
    _stop.set()
    # Only the first: a rank may get the signal twice (sent to its process
    # group, and forwarded by its launcher), the second while it reports.
    if first and not _stopping["at_epoch_end"]:
        raise Interrupted(name)


def handle_stop_signals(leave_ctrl_c_to_launcher: bool) -> Dict[int, Any]:
    r"""Installs :func:`handling_stop_signals`' handlers, clears the stop
    state and lets the stop signals in (a process that
    :func:`starting_ranks` started holds them until now: one sent before
    its handler existed arrives now). Returns the handlers it replaced."""
    _stop.clear()
    _stopping.update(signal=None, at_epoch_end=False)
    previous = {signum: signal.signal(signum, _on_stop_signal) for signum in STOP_SIGNALS}
    if leave_ctrl_c_to_launcher:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return previous


@contextmanager
def handling_stop_signals(leave_ctrl_c_to_launcher: bool = False) -> Iterator[None]:
    r"""While inside (main thread only; elsewhere nothing changes), a stop
    signal (:data:`STOP_SIGNALS`) no longer kills this process without a
    word: it raises :class:`Interrupted` naming it or, once training's
    epochs run (:func:`stop_at_epoch_end`), requests a stop
    (:func:`stop_requested`) that ends the run after its epoch. With
    :obj:`leave_ctrl_c_to_launcher` (a rank whose launcher forwards Ctrl-C
    as SIGTERM), Ctrl-C is ignored. The handlers and blocked signals of
    before come back on leaving."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    previous = handle_stop_signals(leave_ctrl_c_to_launcher)
    try:
        yield
    finally:
        _stopping["at_epoch_end"] = False  # what follows has no epoch to finish
        for signum, handler in previous.items():
            if handler is not None:  # None: not installed from Python, left as it is
                signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def die_with_parent(parent_pid: int) -> None:
    r"""Linux: this process is killed when :obj:`parent_pid` (its launcher)
    exits, however it exits (SIGKILL included), so no rank outlives it."""
    if not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the launcher died before prctl took effect
        os._exit(1)


@contextmanager
def starting_ranks(hold_stop_signals: bool = False) -> Iterator[None]:
    r"""What processes started inside inherit: SIGINT ignored (main thread
    only; a terminal's Ctrl-C signals the whole process group, and a rank
    not yet past its start-up would die of it with a traceback, while the
    launcher forwards it as SIGTERM), and ``TORCH_CPP_LOG_LEVEL=ERROR``
    unless the user set a level (when rank 0 dies, c10d prints every other
    rank's lost store connection as a warning with dozens of C++ frames,
    which would bury the one-line error; errors still print).

    With :obj:`hold_stop_signals`, they also start with the stop signals
    (:data:`STOP_SIGNALS`) blocked: a rank lets them in once its handler is
    in place (:func:`handling_stop_signals`), so one sent to the whole
    process group (a closed terminal's SIGHUP, a scheduler's SIGTERM to
    every process of a job) or forwarded while the rank starts is taken
    then, not fatal; the forkserver never lets them in, so they cannot kill
    it and with it (:func:`die_with_parent`) the ranks forked from it. This
    thread holds them meanwhile: they arrive when it leaves."""
    main = threading.current_thread() is threading.main_thread()
    held = hold_stop_signals and main
    if held:
        from multiprocessing import resource_tracker
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        # Starting, it holds SIGTERM for itself (then ignores it) and lets it
        # in here again: it is started now, holding SIGHUP too, and what it
        # let in is held again.
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    quiet = "TORCH_CPP_LOG_LEVEL" not in os.environ
    if quiet:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        yield
    finally:
        if quiet:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
        if main:
            signal.signal(signal.SIGINT, previous)
        if held:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
