"""Process-group set-up: from torchrun's environment, explicit arguments, or
a spawn helper for single-machine runs, notebooks and tests."""
import ctypes
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

DEFAULT_TIMEOUT = 300.0  # seconds a collective may wait for a peer


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
    silence = 4 * interval  # seconds without a beat before a rank counts as lost

    def __init__(self, host: str, port: int, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.store = dist.PrefixStore("pyg_dist/heartbeat", dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=10),
            wait_for_workers=False))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True,
                                       name="pyg_dist-heartbeat")
        self.thread.start()

    @classmethod
    def start(cls, host: str, port: int, rank: int, world_size: int) -> None:
        if cls.current is not None:
            cls.current.stop.set()
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
    if Heartbeat.current is not None:
        Heartbeat.current.stop.set()
        Heartbeat.current = None


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_stop = threading.Event()  # set by SIGTERM in a rank: stop after this epoch


def stop_requested() -> bool:
    r"""Whether this rank was asked to stop (SIGTERM: a scheduler's
    preemption, the launcher's Ctrl-C); training loops end the current
    epoch, checkpoint and stop."""
    return _stop.is_set()


def stop_on_sigterm(leave_ctrl_c_to_launcher: bool = True) -> None:
    r"""Makes SIGTERM request a stop (:func:`stop_requested`) instead of
    killing this rank and, for a rank with a launcher (which forwards a
    SIGTERM), ignores Ctrl-C; only in the main thread."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: _stop.set())
        if leave_ctrl_c_to_launcher:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


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


def _worker(rank: int, world_size: int, port: int, backend: str, timeout: float,
            threads: Optional[int], call: bytes, args, results, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    stop_on_sigterm()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if threads:
        torch.set_num_threads(threads)
    try:
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
# Seconds beyond the timeout ranks get to finish an epoch and checkpoint
# after the launcher forwarded a SIGTERM.
STOP_GRACE = 60.0


class _ForwardedStop:
    r"""While installed (main thread only), SIGTERM and SIGINT to the
    launcher are forwarded to its ranks as SIGTERM (which ask them to
    checkpoint and stop) and remembered."""

    def __init__(self, procs) -> None:
        self.procs, self.since, self.signum, self.previous = procs, None, None, {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.previous[signum] = signal.signal(signum, self._forward)

    def _forward(self, signum, frame) -> None:
        if self.since is not None:  # a second signal: stop waiting
            raise KeyboardInterrupt
        self.since, self.signum = time.monotonic(), signum
        for p in self.procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _stopped(pid: Optional[int]) -> bool:
    r"""Whether process :obj:`pid` is stopped (Linux ``/proc``; else never)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def spawn(fn: Callable, nprocs: int, args: Sequence = (), backend: str = "gloo",
          timeout: float = DEFAULT_TIMEOUT, join_timeout: Optional[float] = None,
          threads: Optional[int] = None) -> List[Any]:
    r"""Runs ``fn(*args)`` in :obj:`nprocs` fresh processes joined in a
    process group and returns their return values in rank order.

    Works from scripts, tests and notebooks: :obj:`fn` and :obj:`args` may
    be defined in a notebook cell or a script's ``__main__`` (functions,
    lambdas, closures, classes: they travel by value, with cloudpickle; a
    module's functions travel by name). If a rank
    fails or dies, the others get :obj:`timeout` seconds to fail on their
    own collectives before being terminated, and a :class:`RuntimeError`
    reports every rank's fate; a rank stopped (SIGSTOP) for more than
    ``min(timeout, 5)`` seconds counts as failed and is killed. SIGTERM and
    Ctrl-C reach the ranks as SIGTERM (training ends its epoch, checkpoints
    and stops; a second signal stops waiting). On Linux the ranks die with
    this process, however it ends (SIGKILL included).
    :obj:`join_timeout` bounds the whole run.
    :obj:`threads` sets each rank's intra-op threads (default: :func:`rank_threads`).
    """
    call = dumps(fn, f"'{getattr(fn, '__qualname__', fn)}'")
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    threads = threads or rank_threads(nprocs)
    # The arguments travel as multiprocessing sends them (tensors through
    # shared memory, not copied per rank), unless the caller is a notebook,
    # whose cell-defined objects only travel by value, or they cannot be
    # pickled by reference (a lambda): then cloudpickled, copied per rank.
    interactive = not hasattr(sys.modules.get("__main__"), "__file__")
    for payload in ((None, ) if interactive else (tuple(args), None)):
        if payload is None:
            payload = _ByValue(dumps(tuple(args), "the arguments"))
        procs = [ctx.Process(target=_worker, daemon=True,
                             args=(r, nprocs, port, backend, timeout, threads, call, payload,
                                   results, os.getpid())) for r in range(nprocs)]
        try:
            for p in procs:
                p.start()
            break
        except (pickle.PicklingError, AttributeError, TypeError):
            if any(p.pid is not None for p in procs) or isinstance(payload, _ByValue):
                raise  # a rank started: not a failure to pickle the arguments
    outcome: dict = {}
    stopping = _ForwardedStop(procs)
    deadline = None if join_timeout is None else time.monotonic() + join_timeout
    failed_at = None
    stopped: dict = {}  # rank -> since when it is seen stopped
    try:
        while len(outcome) < nprocs:
            now = time.monotonic()
            if deadline is not None and now > deadline:
                break
            if failed_at is not None and now - failed_at > timeout + 10:
                break
            if stopping.since is not None and now - stopping.since > timeout + STOP_GRACE:
                break  # the ranks had their chance to checkpoint and stop
            try:
                rank, ok, payload = results.get(timeout=0.2)
                outcome[rank] = (ok, payload)
            except queue.Empty:
                pass
            for r, p in enumerate(procs):  # a rank that died without reporting
                if r not in outcome and not p.is_alive() and results.empty():
                    outcome[r] = (False, f"rank {r} died (exit code {p.exitcode})")
                elif r not in outcome and _stopped(p.pid):  # SIGSTOP, a hung device
                    stopped.setdefault(r, now)
                    if now - stopped[r] > min(timeout, STOPPED_GRACE):
                        outcome[r] = (False, f"rank {r} was stopped (SIGSTOP) for "
                                             f"{now - stopped[r]:.0f} s: killed")
                else:
                    stopped.pop(r, None)
            if failed_at is None and any(not ok for ok, _ in outcome.values()):
                failed_at = time.monotonic()
    finally:
        stopping.restore()
        for p in procs:
            if p.is_alive() and _stopped(p.pid):  # it cannot act on SIGTERM
                p.kill()
            p.join(timeout=1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():  # stopped (SIGSTOP) or ignoring SIGTERM
                p.kill()
                p.join()
    if stopping.since is not None and stopping.signum == signal.SIGINT:
        raise KeyboardInterrupt
    missing = [r for r in range(nprocs) if r not in outcome]
    errors = {r: msg for r, (ok, msg) in outcome.items() if not ok}
    if errors or missing:
        lines = [f"rank {r}: {msg.strip()}" for r, msg in sorted(errors.items())]
        lines += [f"rank {r}: did not finish in time (terminated)" for r in missing]
        raise RuntimeError(f"{len(errors) + len(missing)} of {nprocs} ranks failed:\n"
                           + "\n".join(lines))
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
