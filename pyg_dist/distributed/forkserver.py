r"""Where :func:`~pyg_dist.distributed.spawn` starts its ranks from: on
Linux a forkserver that imported torch and PyG once, so a rank starts in a
fraction of a second instead of importing them anew, and that hands each
rank what a fresh interpreter would have (the caller's environment,
stdout and stderr as they are now, numpy random numbers of its own); a
fresh interpreter per rank where such a forkserver cannot be had."""
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from pyg_dist.distributed.signals import starting_ranks

# Linux: the ranks of spawn() fork from a forkserver, a process this one
# starts once (it lives as long as this one) with these modules imported, so
# a rank starts in a fraction of a second instead of importing torch and PyG
# anew (seconds per rank, more with ranks starting side by side). Importing
# them initialises no GPU and starts no thread; pyg_dist itself is imported
# in each rank, from the caller's sys.path, like the function it runs.
FORKSERVER_PRELOAD = ("torch", "torch_geometric")

#: The environment variable that picks how :func:`spawn` starts ranks:
#: ``forkserver`` (the default on Linux) or ``spawn`` (a fresh interpreter
#: per rank, as on other systems).
START_METHOD_ENV = "PYG_DIST_START_METHOD"

#: The environment variable naming (comma-separated) variables whose change
#: since the forkserver started does not make :func:`rank_context` replace
#: it. A rank gets the caller's environment as it is anyway (:class:`Caller`);
#: a change only matters to what a native library read when the forkserver
#: imported it, so name only variables no library reads, such as pytest's
#: ``PYTEST_CURRENT_TEST``, which pytest sets anew for each test (the test
#: suite names it here, so that its tests share one forkserver).
FORKSERVER_IGNORES_ENV = "PYG_DIST_FORKSERVER_IGNORES"

_forkserver_lock = threading.Lock()  # held while ranks start
# The forkserver this process started: owner (this process' pid), pid, state
# (see _start_state, at its start), fit (to fork ranks).
_forkserver: Dict[str, Any] = {}


@contextmanager
def rank_context() -> Iterator[Tuple[Any, int]]:
    r"""The multiprocessing context to start ranks with inside, and the pid
    the ranks' parent will have (see :func:`die_with_parent`).

    On Linux that is a forkserver with torch and PyG imported
    (:data:`FORKSERVER_PRELOAD`), started by the first call, that runs one
    thread, holds no GPU and imported its modules from the files this
    process would. It is used while this process' environment, umask and
    CPU affinity are those it started with (a rank inherits them from the
    forkserver, and native libraries read the environment when they are
    imported); once they changed, it is replaced by a new one at the next
    call that finds no process forked from it running. Otherwise, or with
    ``PYG_DIST_START_METHOD=spawn``, every rank is a fresh interpreter
    (``"spawn"``)."""
    method = os.environ.get(START_METHOD_ENV) or "forkserver"
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"{START_METHOD_ENV} must be 'forkserver' or 'spawn' (got '{method}')")
    spawn_ctx = torch.multiprocessing.get_context("spawn")
    if method == "spawn" or not sys.platform.startswith("linux"):
        yield spawn_ctx, os.getpid()
        return
    with _forkserver_lock:  # no forkserver is replaced while ranks start from it
        try:
            found = _forkserver_context()
        except (AttributeError, ImportError, OSError, ValueError):  # not this Python's forkserver
            found = None
        yield found or (spawn_ctx, os.getpid())


def _forkserver_context() -> Optional[Tuple[Any, int]]:
    from multiprocessing import forkserver
    ours = _forkserver.get("owner") == os.getpid()
    if _Stdlib.pid() is not None and not ours:
        return None  # started by other code, or this process is a fork of its owner
    with starting_ranks(hold_stop_signals=True):  # the forkserver's, its ranks inherit
        state = _start_state()
        if (ours and state != _forkserver["state"] and _Stdlib.pid() == _forkserver["pid"]
                and not _retire_forkserver()):
            return None  # still forking for someone: fresh interpreters meanwhile
        forkserver.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        forkserver.ensure_running()  # starts it, or a new one if it died or retired
    ctx, pid = torch.multiprocessing.get_context("forkserver"), _Stdlib.pid()
    if not ours or _forkserver.get("pid") != pid:
        try:
            fit = _forkserver_fit(ctx, pid)
        except BaseException:  # interrupted: it would outlive this process by its imports
            os.kill(pid, signal.SIGKILL)
            raise
        _forkserver.update(owner=os.getpid(), pid=pid, state=state, fit=fit)
    return (ctx, pid) if _forkserver["fit"] and _forkserver["state"] == state else None


def _retire_forkserver() -> bool:
    r"""Ends the forkserver this process started, unless a process forked
    from it runs (a rank of a :func:`spawn` under way, or another user's)."""
    pid = _forkserver["pid"]
    if _child_processes(pid):
        return False
    os.kill(pid, signal.SIGKILL)
    _Stdlib.stop()
    return True


def _child_processes(pid: int) -> List[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return found


def _start_state() -> tuple:
    r"""What a rank inherits from the process that starts it, besides what
    multiprocessing sends (the working directory, ``sys.path``,
    ``sys.argv``): the environment (native libraries read it when loaded),
    the umask, the CPU affinity."""
    try:
        with open("/proc/self/status") as f:
            umask = next((line.split()[1] for line in f if line.startswith("Umask:")), None)
    except OSError:
        umask = None
    ignored = set(os.environ.get(FORKSERVER_IGNORES_ENV, "").split(","))
    environ = {k: v for k, v in os.environ.items() if k not in ignored}
    return environ, umask, sorted(os.sched_getaffinity(0))


def _forkserver_fit(ctx, pid: int) -> bool:
    r"""Whether ranks may fork from the forkserver :obj:`pid`: a process
    forked from it finds every module it imported where this process does
    (a ``sys.path`` of this process' own could find another copy), it runs
    one thread (a fork copies no lock another thread holds) and it holds no
    GPU device (a driver initialised before a fork fails in the child)."""
    reader, writer = ctx.Pipe(duplex=False)
    probe = ctx.Process(target=_report_modules, args=(writer, ), daemon=True)
    with starting_ranks():
        probe.start()  # answered once the forkserver imported its modules
    writer.close()
    try:
        found = reader.recv() if reader.poll(120) else None
    except (EOFError, OSError):
        found = None
    finally:
        reader.close()
        probe.join(10)
        if probe.is_alive():
            probe.kill()
            probe.join()
    if found is None or not _same_modules(found):
        return False
    try:
        threads = os.listdir(f"/proc/{pid}/task")
        files = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    return threads == [str(pid)] and not any(
        f.startswith(("/dev/nvidia", "/dev/kfd", "/dev/dri/")) for f in files)


def _report_modules(conn) -> None:
    r"""In a process forked from the forkserver: the file of every top-level
    module it has."""
    try:
        conn.send({name: module.__file__ for name, module in list(sys.modules.items())
                   if "." not in name and not name.startswith("__")
                   and isinstance(getattr(module, "__file__", None), str)})
    except OSError:  # the caller stopped waiting (interrupted): nobody to tell
        pass
    conn.close()


def _same_modules(found: Dict[str, str]) -> bool:
    r"""Whether this process imports each module of :obj:`found` (name to
    file) from that file."""
    import importlib.util
    for name, path in found.items():
        module = sys.modules.get(name)
        try:
            mine = (getattr(module, "__file__", None) if module is not None else
                    getattr(importlib.util.find_spec(name), "origin", None))
        except (ImportError, ValueError):
            return False
        if not isinstance(mine, str) or os.path.realpath(mine) != os.path.realpath(path):
            return False
    return True


class Caller:
    r"""What a rank forked by the forkserver takes from this process as it
    is when the rank starts (the forkserver's are this process' of when it
    started): its stdout and stderr (not a terminal since left, or the
    output capture of an earlier test) and its environment."""

    def __reduce__(self):  # runs as the rank starts
        from multiprocessing.reduction import DupFd
        stdio = tuple(DupFd(fd) if _is_open(fd) else None for fd in (1, 2))
        return _received_caller, (stdio, dict(os.environ))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _received_caller(stdio, environ: Dict[str, str]) -> dict:
    return dict(stdio=[None if fd is None else fd.detach() for fd in stdio], environ=environ)


def adopt_caller(stdio: List[Optional[int]], environ: Dict[str, str]) -> None:
    r"""In a rank forked by the forkserver: it dies with the process that
    started it (its caller), has its environment, writes where its stdout
    and stderr go, and draws numpy's global random numbers apart from the
    other ranks', as a fresh process would."""
    from multiprocessing import parent_process
    # The forkserver exits when every holder of its "alive" pipe is gone:
    # without this rank's copy, when the caller exits; and its exit kills
    # this rank (die_with_parent), even a stopped one.
    _Stdlib.let_go()
    caller = parent_process()
    if caller is not None:  # also while another process keeps the forkserver up
        threading.Thread(target=_die_with_caller, args=(caller.sentinel, ), daemon=True,
                         name="pyg_dist-caller").start()
    os.environ.clear()
    os.environ.update(environ)
    for fd, target in zip(stdio, (1, 2)):
        if fd is not None:
            os.dup2(fd, target)
            os.close(fd)
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


def _die_with_caller(sentinel: int) -> None:
    r"""Kills this process once the caller's end of :obj:`sentinel` (a pipe
    only the caller writes to) closes: the caller is gone."""
    from multiprocessing.connection import wait
    while True:
        wait([sentinel])
        try:
            if not os.read(sentinel, 1):
                break
        except OSError:
            break
    os.kill(os.getpid(), signal.SIGKILL)


class _Stdlib:
    r"""The private state of :mod:`multiprocessing.forkserver` this module
    needs, in this one place: its public functions (``ensure_running``,
    ``set_forkserver_preload``) neither say the forkserver's pid (needed to
    check that it runs one thread and holds no GPU, to see which processes
    it forked, and to tell a forkserver of other code from this module's),
    nor end it (needed to replace one whose start environment changed),
    nor let a forked process drop its copy of the forkserver's "alive"
    pipe (a rank holding it would keep the forkserver, and through
    :func:`die_with_parent` itself, alive after its caller exited).

    Checked on CPython 3.11 (the module's ``_forkserver``, its
    ``_forkserver_pid``, ``_forkserver_alive_fd`` and ``_stop()``), and read
    in CPython's main-branch source, which has the same names (and an
    authentication key besides). Where they differ, :func:`rank_context`
    takes the :class:`AttributeError` for "not this Python's forkserver" and
    starts fresh interpreters."""

    @staticmethod
    def pid() -> Optional[int]:
        r"""The pid of the forkserver this process started (``None``: none)."""
        from multiprocessing import forkserver
        return forkserver._forkserver._forkserver_pid

    @staticmethod
    def stop() -> None:
        r"""Closes this process' end of the forkserver's "alive" pipe and
        reaps the forkserver (killed before: it may be forking)."""
        from multiprocessing import forkserver
        forkserver._forkserver._stop()

    @staticmethod
    def let_go() -> None:
        r"""In a process forked from the forkserver: closes its copy of the
        "alive" pipe, so the forkserver's life no longer depends on it."""
        from multiprocessing import forkserver
        try:
            server = forkserver._forkserver
            if server._forkserver_alive_fd is not None:
                os.close(server._forkserver_alive_fd)
                server._forkserver_alive_fd = None
        except (AttributeError, OSError):
            pass
