"""Process-group set-up: from torchrun's environment, explicit arguments, or
a spawn helper for single-machine runs, notebooks and tests."""
import ctypes
import numbers
import os
import pickle
import queue
import re
import signal
import socket
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.utils.allocator import environment_for_ranks

DEFAULT_TIMEOUT = 300.0  # seconds a collective may wait for a peer


def under_torchrun() -> bool:
    r"""Whether this process is a rank torchrun (or a launcher like it)
    started: its ``RANK`` and ``WORLD_SIZE`` are in the environment."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init(backend: Optional[str] = None, init_method: Optional[str] = None,
         rank: Optional[int] = None, world_size: Optional[int] = None,
         timeout: float = DEFAULT_TIMEOUT) -> int:
    r"""Creates the default process group unless one exists, and returns
    this process' rank.

    Without arguments it reads torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); a single process with
    no such environment becomes a world of one. The backend defaults to NCCL
    when CUDA is available (each process then uses GPU ``LOCAL_RANK``) and
    gloo otherwise. :obj:`timeout` bounds how long any collective waits for a
    peer, so a dead rank makes the others raise instead of hanging.
    """
    if dist.is_initialized():
        return dist.get_rank()
    backend = backend or default_backend()
    if init_method is None and "MASTER_ADDR" not in os.environ and world_size in (None, 1):
        init_method = f"tcp://127.0.0.1:{free_port()}"
        rank, world_size = 0, 1
    elif init_method is None:  # torchrun's environment (torch 2.13 wants rank and size)
        init_method = "env://"
        rank = int(os.environ["RANK"]) if rank is None else rank
        world_size = int(os.environ["WORLD_SIZE"]) if world_size is None else world_size
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout))
    if dist.get_world_size() > 1:
        host, port = _store_address(init_method)
        Heartbeat.start(host, port, dist.get_rank(), dist.get_world_size())
    return dist.get_rank()


def _store_address(init_method: str) -> Tuple[str, int]:
    if init_method.startswith("tcp://"):
        host, port = init_method[len("tcp://"):].rsplit(":", 1)
        return host.strip("[]"), int(port)
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


class RankLostError(RuntimeError):
    r"""A collective failed because one or more peers are gone."""


class Heartbeat:
    r"""Every rank bumps a counter in the rendezvous store each
    :obj:`interval` seconds from a daemon thread, so that when a collective
    fails the survivors can say *which* rank was lost (:func:`lost_ranks`)
    instead of only which socket closed."""
    current: Optional["Heartbeat"] = None
    interval = 0.5
    timeout = 10.0  # seconds a store request may take
    silence = 4 * interval  # seconds without a beat before a rank counts as lost

    def __init__(self, host: str, port: int, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.store = dist.PrefixStore("pyg_dist/heartbeat", dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=self.timeout),
            wait_for_workers=False))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True,
                                       name="pyg_dist-heartbeat")
        self.thread.start()

    @classmethod
    def start(cls, host: str, port: int, rank: int, world_size: int) -> None:
        if cls.current is not None:
            cls.current.close()
        try:
            cls.current = cls(host, port, rank, world_size)
        except (RuntimeError, OSError):  # no store to talk to: fail as before, unnamed
            cls.current = None

    def _beat(self) -> None:
        while not self.stop.is_set():
            try:
                self.store.add(str(self.rank), 1)
            except Exception:  # the store's host is gone: lost_ranks reports it
                return
            self.stop.wait(self.interval)

    def close(self) -> None:
        r"""Stops the beats and waits for the thread (at most the store's
        timeout). A daemon thread still inside ``store.add`` (C++, without
        the GIL) when the interpreter exits is ended by CPython as it takes
        the GIL back, by an unwind through C++ frames that may abort the
        process ("terminate called without an active exception")."""
        self.stop.set()
        self.thread.join(self.timeout)

    def counts(self) -> List[int]:
        return [self.store.add(str(r), 0) for r in range(self.world_size)]


def lost_ranks(wait: float = Heartbeat.silence) -> Optional[List[int]]:
    r"""The ranks whose heartbeat stopped, watched for :obj:`wait` seconds
    (``[0]`` when the store itself is unreachable: rank 0 or its agent hosts
    it); ``None`` without a heartbeat."""
    beat = Heartbeat.current
    if beat is None:
        return None
    try:
        before = beat.counts()
        time.sleep(wait)
        after = beat.counts()
    except Exception:  # the store lives in rank 0's process (or its agent)
        return [0]
    return [r for r in range(beat.world_size) if r != beat.rank and after[r] == before[r]]


def name_lost_ranks(error: BaseException) -> BaseException:
    r""":obj:`error` of a failed collective, re-raised as a
    :class:`RankLostError` that names the ranks that are gone (if any)."""
    if not isinstance(error, RuntimeError) or isinstance(error, RankLostError):
        return error
    lost = lost_ranks()
    if not lost:
        return error
    which = ", ".join(map(str, lost))
    return RankLostError(f"lost rank{'s' if len(lost) > 1 else ''} {which} (no heartbeat "
                         f"for {Heartbeat.silence:.0f} s): {type(error).__name__}: "
                         f"{error}".rstrip())


def stop_heartbeat() -> None:
    beat, Heartbeat.current = Heartbeat.current, None
    if beat is not None:
        beat.close()


def device() -> torch.device:
    r"""The device this rank computes on: its local GPU under NCCL, else CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def available_cpus() -> int:
    r"""The cores this process may run on (its affinity mask: SLURM's
    ``--cpus-per-task``, ``taskset``), else all the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_threads(local_ranks: int) -> int:
    r"""Intra-op threads for each of :obj:`local_ranks` ranks on this node:
    ``OMP_NUM_THREADS`` when set (a scheduler's or the user's share of the
    node), else the cores of this process' affinity mask divided among the
    local ranks."""
    value = os.environ.get("OMP_NUM_THREADS")
    if value:
        try:
            threads = int(value)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ValueError(f"OMP_NUM_THREADS must be a whole number >= 1 (got '{value}')")
        return threads
    return max(1, available_cpus() // max(local_ranks, 1))


class NoFreePortError(RuntimeError):
    r"""No TCP port is free for the ranks' rendezvous."""


def free_port() -> int:
    r"""A TCP port of 127.0.0.1 that no socket holds now, picked by the
    kernel from its ephemeral range; :class:`NoFreePortError` in one line
    naming the range when every port of it is taken."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 0))
        except OSError as e:
            raise NoFreePortError(
                f"no free TCP port on 127.0.0.1 for the ranks' rendezvous: {_port_range()} "
                f"({e.strerror or e}); end what holds them or widen the range") from None
        return s.getsockname()[1]


def _port_range() -> str:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = f.read().split()
        return f"ports {low}-{high} (net.ipv4.ip_local_port_range) are all taken"
    except (OSError, ValueError):  # not Linux
        return "the ephemeral ports are all taken"


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


def _handle_stop_signals(leave_ctrl_c_to_launcher: bool) -> Dict[int, Any]:
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
    previous = _handle_stop_signals(leave_ctrl_c_to_launcher)
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

_forkserver_lock = threading.Lock()  # held while ranks start
# The forkserver this process started: owner (this process' pid), pid, state
# (see _start_state, at its start), fit (to fork ranks).
_forkserver: Dict[str, Any] = {}


@contextmanager
def _rank_context() -> Iterator[Tuple[Any, int]]:
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
    server = forkserver._forkserver  # the one forkserver.ensure_running() starts
    ours = _forkserver.get("owner") == os.getpid()
    if server._forkserver_pid is not None and not ours:
        return None  # started by other code, or this process is a fork of its owner
    with starting_ranks(hold_stop_signals=True):  # the forkserver's, its ranks inherit
        state = _start_state()
        if (ours and state != _forkserver["state"] and server._forkserver_pid == _forkserver["pid"]
                and not _retire_forkserver(server)):
            return None  # still forking for someone: fresh interpreters meanwhile
        forkserver.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        forkserver.ensure_running()  # starts it, or a new one if it died or retired
    ctx, pid = torch.multiprocessing.get_context("forkserver"), server._forkserver_pid
    if not ours or _forkserver.get("pid") != pid:
        try:
            fit = _forkserver_fit(ctx, pid)
        except BaseException:  # interrupted: it would outlive this process by its imports
            os.kill(pid, signal.SIGKILL)
            raise
        _forkserver.update(owner=os.getpid(), pid=pid, state=state, fit=fit)
    return (ctx, pid) if _forkserver["fit"] and _forkserver["state"] == state else None


def _retire_forkserver(server) -> bool:
    r"""Ends the forkserver this process started, unless a process forked
    from it runs (a rank of a :func:`spawn` under way, or another user's)."""
    pid = _forkserver["pid"]
    if _child_processes(pid):
        return False
    os.kill(pid, signal.SIGKILL)
    server._stop()  # closes this process' end of its "alive" pipe and reaps it
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


# Variables that may differ between the forkserver's start and a rank's:
# pytest sets this one for each test (a rank gets the caller's environment
# as it is, see _Caller; this only says no module read it at import).
_START_ENV_IGNORED = ("PYTEST_CURRENT_TEST", )


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
    environ = {k: v for k, v in os.environ.items() if k not in _START_ENV_IGNORED}
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


class _Caller:
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


def _adopt_caller(stdio: List[Optional[int]], environ: Dict[str, str]) -> None:
    r"""In a rank forked by the forkserver: it dies with the process that
    started it (its caller), has its environment, writes where its stdout
    and stderr go, and draws numpy's global random numbers apart from the
    other ranks', as a fresh process would."""
    from multiprocessing import forkserver, parent_process
    # The forkserver exits when every holder of its "alive" pipe is gone:
    # without this rank's copy, when the caller exits; and its exit kills
    # this rank (die_with_parent), even a stopped one.
    try:
        server = forkserver._forkserver
        if server._forkserver_alive_fd is not None:
            os.close(server._forkserver_alive_fd)
            server._forkserver_alive_fd = None
    except (AttributeError, OSError):
        pass
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


def _worker(rank: int, world_size: int, port: int, backend: str, timeout: float,
            threads: Optional[int], call: bytes, args, results, parent_pid: int,
            caller: Optional[dict] = None) -> None:
    die_with_parent(parent_pid)
    if caller is not None:  # forked by the forkserver: see _adopt_caller
        _adopt_caller(**caller)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if threads:
        torch.set_num_threads(threads)
    try:
        # A stop signal held since the rank started is taken here, and reported.
        _handle_stop_signals(leave_ctrl_c_to_launcher=True)
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
        with environment_for_ranks(malloc), _rank_context() as (ctx, parent):
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
                caller = _Caller() if ctx.get_start_method() == "forkserver" else None
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


def new_gloo_group():
    r"""A new gloo group of every rank (CPU collectives, also beside an NCCL
    world, and traffic apart from the default group's), with the default
    group's timeout so a dead peer fails it as fast."""
    timeout = timedelta(seconds=DEFAULT_TIMEOUT)
    try:
        device = torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")
        timeout = dist.group.WORLD._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):  # private API: keep the default
        pass
    return dist.new_group(backend="gloo", timeout=timeout)


def sum_over_ranks(t: Tensor) -> Tensor:
    r"""In-place sum of :obj:`t` over the default group's ranks."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


def gather_over_ranks(value: float, device: Optional[torch.device] = None) -> List[float]:
    r"""Every rank's :obj:`value`, in rank order (a collective)."""
    t = torch.tensor([float(value)], dtype=torch.double, device=device)
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [float(t)]
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(v) for v in out]


def max_over_ranks(t: Tensor) -> Tensor:
    r"""In-place maximum of :obj:`t` over the default group's ranks."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t
