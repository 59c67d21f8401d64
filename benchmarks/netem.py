r"""An emulated cluster network for benchmarks on one machine.

Ranks that talk over loopback exchange halos at several GB/s, so a
single-machine benchmark hides the communication a real cluster pays for.
:class:`EmulatedNetwork` runs every rank in its own network namespace, joined
through a veth pair to a bridge in a hub namespace (a star: one switch, one
NIC per rank), and shapes each link so that the communication / compute
ratio resembles a cluster's:

* **rate** (e.g. ``1gbit``): a ``tbf`` qdisc on both ends of each rank's
  veth pair limits what a rank sends and what it receives. ``tbf`` rather
  than ``netem rate``: it exists wherever traffic control does (the
  reference machine's kernel has no ``sch_netem``), it was measured to track
  the requested rate within 1% from 100mbit to 10gbit, and with a bucket of
  at least 64 KiB it passes GSO packets whole, which keeps the CPU cost low.
* **delay** (e.g. ``0.2ms``): the one-way rank-to-rank latency, added once
  per packet by a ``netem delay`` qdisc on the hub's port towards each rank,
  so a round trip grows by twice the delay. Only the kernel shapes: where it
  has no ``sch_netem`` (such as the reference machine's) **no delay is
  added** (a user-space delayer would take CPU from the ranks), and the
  network says so: :attr:`Network.description` reads e.g. ``"1gbit, no added
  delay (the kernel has no sch_netem; 0.2ms requested)"``, and its
  :attr:`~Network.label` (the ``link`` of result tables) names only what was
  applied (``"1gbit"``).
* **wire bytes**: :meth:`Network.launch` reads every rank's veth counters
  (bytes and packets sent and received) right before it starts the ranks and
  after they exited, and returns the difference as
  :attr:`LaunchResult.wire_bytes`. That is everything the processes put on
  their links: rendezvous, halo exchange, gradient all-reduce, metric
  reductions, retransmissions and TCP/IP/Ethernet headers (plus the odd ARP
  or IPv6 neighbour packet). veth counts a GSO packet (up to 64 KiB) once,
  with its headers once; on shaped links the rank's ``tbf`` also counts
  what it sent per 1500-byte frame, headers in every frame, as a real NIC
  would send it and as the rate is charged (``tx_frame_bytes``,
  ``tx_frames``: about 4% above ``tx_bytes`` for bulk transfers).
  :class:`LoopbackNetwork` reports :obj:`None`: all ranks share ``lo``,
  whose counters cannot tell them apart (and include whatever else uses it).

Only addresses in namespaces created here are used (``10.77.0.{rank + 1}/24``),
the root namespace's interfaces and routes are never touched, and everything
is removed on exit, also after an exception, ``Ctrl-C`` or ``SIGTERM``.

Where namespaces cannot be used (not root, no ``iproute2``, a kernel without
namespace support), :func:`network_for` returns a :class:`LoopbackNetwork`
with the same interface and says so, so callers need no branches::

    from netem import network_for, parse_link

    with network_for(num_ranks=2, link=parse_link("1gbit,0.2ms")) as net:
        print(net.description)  # e.g. "1gbit, no added delay (...)"
        result = net.launch([sys.executable, "train.py"], timeout=600)
        result.check()
        print(result.sent)  # bytes all ranks sent on their links (None: loopback)

Self-check (needs root for the emulated part): measured throughput and round
trip against loopback, and the wire bytes beside the payload bytes::

    python benchmarks/netem.py --link 1gbit --link 100mbit,1ms --ranks 2
"""
import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

SUBNET = "10.77.0"
MTU = 1500
# TCP payload per frame the qdiscs count at MTU 1500 (IPv4 and TCP headers
# with timestamps, Ethernet header): the share of a link's rate a bulk
# transfer can reach.
GOODPUT = (MTU - 52) / (MTU + 14)
DEFAULT_MASTER_PORT = 29500  # every rank namespace has its own port space
_FAIL_GRACE = 3.0  # seconds the other ranks get to exit once one has failed
NO_NETEM = "the kernel has no sch_netem"
# The counters of a rank's link: its veth end's, and on shaped links those of
# its tbf, which counts every 1500-byte frame with its headers.
WIRE_KEYS = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")
FRAME_KEYS = ("tx_frame_bytes", "tx_frames")

Command = Sequence[str]


class NetworkSetupError(RuntimeError):
    r"""An ``ip`` or ``tc`` call failed."""


# Link specifications #########################################################

_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_DELAY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_RATE_RE = re.compile(r"(\d+(?:\.\d+)?)(" + "|".join(_RATE_UNITS) + r")")
_DELAY_RE = re.compile(r"(\d+(?:\.\d+)?)(" + "|".join(_DELAY_UNITS) + r")")
_SPEC_HELP = ("expected RATE[,DELAY] such as '1gbit', '1gbit,0.2ms', '100mbit,1ms' "
              "or 'loopback' (RATE: a number with bit, kbit, mbit, gbit or tbit; "
              "DELAY: a number with us, ms or s)")


@dataclass(frozen=True)
class Link:
    r"""One rank's link to the switch: :obj:`rate` in each direction (a
    ``tc`` rate such as ``"1gbit"``) and :obj:`delay`, the one-way latency
    between two ranks (such as ``"0.2ms"``). Neither set means loopback."""
    rate: Optional[str] = None
    delay: Optional[str] = None

    def __post_init__(self):
        if self.rate is None and self.delay is not None:
            raise ValueError(f"link delay '{self.delay}' without a rate: {_SPEC_HELP}")
        if self.rate is not None:
            _parse_quantity(self.rate, _RATE_RE, _RATE_UNITS, "rate")
        if self.delay is not None:
            _parse_quantity(self.delay, _DELAY_RE, _DELAY_UNITS, "delay")

    @property
    def is_loopback(self) -> bool:
        return self.rate is None

    @property
    def rate_bps(self) -> Optional[float]:
        r"""The rate in bit/s (:obj:`None` for loopback)."""
        if self.rate is None:
            return None
        return _parse_quantity(self.rate, _RATE_RE, _RATE_UNITS, "rate")

    @property
    def delay_s(self) -> float:
        r"""The one-way delay in seconds (0 without delay)."""
        if self.delay is None:
            return 0.0
        return _parse_quantity(self.delay, _DELAY_RE, _DELAY_UNITS, "delay")

    @property
    def expected_mbps(self) -> Optional[float]:
        r"""The TCP throughput in MB/s (10^6 bytes) a bulk transfer should
        reach in one direction: the rate less the frame headers."""
        rate = self.rate_bps
        return None if rate is None else rate / 8 / 1e6 * GOODPUT

    @property
    def label(self) -> str:
        if self.rate is None:
            return "loopback"
        return self.rate if self.delay is None else f"{self.rate}/{self.delay}"


def _parse_quantity(text: str, pattern: "re.Pattern[str]", units: Dict[str, float],
                    what: str) -> float:
    match = pattern.fullmatch(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"invalid link {what} '{text}': {_SPEC_HELP}")
    return float(match.group(1)) * units[match.group(2)]


def parse_link(spec: str) -> Link:
    r"""Parses ``RATE[,DELAY]`` (``"1gbit"``, ``"1gbit,0.2ms"``) or
    ``"loopback"`` into a :class:`Link`; raises :class:`ValueError` on
    anything else."""
    text = spec.strip().lower().replace(" ", "")
    if text == "loopback":
        return Link()
    parts = text.split(",")
    if not text or len(parts) > 2 or not all(parts):
        raise ValueError(f"invalid link spec '{spec}': {_SPEC_HELP}")
    return Link(parts[0], parts[1] if len(parts) == 2 else None)


# Running ip / tc #############################################################

def _run(cmd: Command, timeout: float = 30.0) -> str:
    r"""Runs one set-up command and returns its output. Every ``ip`` and
    ``tc`` call goes through here, so that a failure names the command and
    the tool's own explanation."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetworkSetupError(f"'{' '.join(cmd)}' failed: {e}") from e
    if proc.returncode != 0:
        raise NetworkSetupError(f"'{' '.join(cmd)}' failed (exit code {proc.returncode}): "
                                f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _try_run(cmd: Command) -> bool:
    r"""Runs :obj:`cmd` where failing is an answer, not an error (probes,
    cleanup); returns whether it succeeded."""
    try:
        _run(cmd)
        return True
    except NetworkSetupError:
        return False


def _in_ns(ns: str, *cmd: str) -> List[str]:
    return ["ip", "netns", "exec", ns, *cmd]


@functools.lru_cache(maxsize=None)
def _ensure_tools(tools: Tuple[str, ...], package: str) -> bool:
    r"""Whether all :obj:`tools` are on the ``PATH``, installing the Debian
    :obj:`package` (once per process, quietly) when some are missing."""
    if all(shutil.which(t) for t in tools):
        return True
    if os.geteuid() == 0 and shutil.which("apt-get"):
        if _apt_get("install", "-y", "-qq", package):
            # An empty package list is the usual reason; refresh it once.
            _apt_get("update", "-qq")
            _apt_get("install", "-y", "-qq", package)
    return all(shutil.which(t) for t in tools)


def _apt_get(*args: str) -> int:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(["apt-get", *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=env).returncode


class _Support(NamedTuple):
    ok: bool
    reason: str
    netem: bool  # whether the kernel has sch_netem


@contextlib.contextmanager
def _throwaway_namespace() -> Iterator[str]:
    ns = f"pgd-probe{os.getpid()}"
    _run(["ip", "netns", "add", ns])
    try:
        yield ns
    finally:
        _try_run(["ip", "netns", "del", ns])


@functools.lru_cache(maxsize=None)
def _probe() -> _Support:
    r"""Tries what :class:`EmulatedNetwork` needs in a throwaway namespace:
    a veth pair, a bridge, a ``tbf`` qdisc, and whether ``netem`` exists."""
    if not sys.platform.startswith("linux"):
        return _Support(False, "network namespaces need Linux", False)
    if os.geteuid() != 0:
        return _Support(False, "network namespaces need root", False)
    if not _ensure_tools(("ip", "tc"), "iproute2"):
        return _Support(False, "'ip' and 'tc' (iproute2) are missing and could not "
                               "be installed", False)
    try:
        with _throwaway_namespace() as ns:
            _run(["ip", "-n", ns, "link", "add", "name", "va", "type", "veth",
                  "peer", "name", "vb"])
            _run(["ip", "-n", ns, "link", "add", "name", "br0", "type", "bridge"])
            _run(["ip", "-n", ns, "link", "set", "va", "master", "br0"])
            _run(["tc", "-n", ns, "qdisc", "add", "dev", "va", "root", *_tbf_args(1e9)])
            netem = _try_run(["tc", "-n", ns, "qdisc", "add", "dev", "vb", "root",
                              "netem", "delay", "1ms"])
    except NetworkSetupError as e:
        return _Support(False, str(e), False)
    return _Support(True, "", netem)


def available() -> Tuple[bool, str]:
    r"""Whether :class:`EmulatedNetwork` can run here (it really creates and
    deletes a throwaway namespace), and why not if it cannot."""
    support = _probe()
    return support.ok, support.reason


def delay_support() -> Tuple[Optional[str], str]:
    r"""How link delay is emulated here: ``"netem"`` (the kernel's qdisc),
    or :obj:`None` with the reason (such as :data:`NO_NETEM`), in which case
    links get their rate but no added delay."""
    support = _probe()
    if not support.ok:
        return None, support.reason
    if support.netem:
        return "netem", ""
    return None, NO_NETEM


def effective_link(link: Link) -> Link:
    r""":obj:`link` as :func:`network_for` emulates it here: loopback where
    namespaces cannot be used, without the delay where the kernel cannot add
    it (probes once, prints nothing). Its :attr:`~Link.label` is the one
    result tables get."""
    if link.is_loopback or not available()[0]:
        return Link()
    if link.delay is not None and delay_support()[0] is None:
        return Link(link.rate)
    return link


# Networks ####################################################################

@dataclass
class LaunchResult:
    r"""What :meth:`Network.launch` returns: per rank, its exit code
    (negative: killed by that signal), its interleaved stdout and stderr and,
    on an emulated network, :obj:`wire_bytes`: what the rank's link counted
    while the processes ran (:data:`WIRE_KEYS` from its veth, and
    :data:`FRAME_KEYS` on shaped links; everything on the wire, headers
    included, see the module documentation), :obj:`None` where not measured
    (loopback, whose counters all ranks share). Unpacks as ``returncodes,
    outputs`` like the pair it used to be."""
    returncodes: List[int]
    outputs: List[str]
    wire_bytes: Optional[List[Dict[str, int]]] = None

    def __iter__(self) -> Iterator[Any]:
        return iter((self.returncodes, self.outputs))

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.returncodes)

    @property
    def sent(self) -> Optional[int]:
        r"""Bytes all ranks sent on their links (:obj:`None`: not measured)."""
        return self._total("tx_bytes")

    @property
    def received(self) -> Optional[int]:
        r"""Bytes all ranks received on their links (:obj:`None`: not measured)."""
        return self._total("rx_bytes")

    def _total(self, key: str) -> Optional[int]:
        if self.wire_bytes is None:
            return None
        return sum(rank[key] for rank in self.wire_bytes)

    def check(self, tail: int = 2000) -> "LaunchResult":
        r"""Raises :class:`RuntimeError` with the end of every failed rank's
        output unless all ranks exited with 0."""
        failed = [r for r, code in enumerate(self.returncodes) if code != 0]
        if failed:
            raise RuntimeError("\n".join(
                f"rank {r} exited with {self.returncodes[r]}:\n{self.outputs[r][-tail:]}"
                for r in failed))
        return self


class Network:
    r"""What both networks share: the torchrun-style environment of a rank
    and launching one process per rank. :obj:`link` is what is applied,
    :obj:`label` names it for result tables, :obj:`delay_note` says what
    delay the links add (and why none where one was requested) and
    :obj:`description` is both in one line."""
    label = ""

    def __init__(self, num_ranks: int, link: Link):
        if not 1 <= num_ranks <= 254:
            raise ValueError(f"num_ranks must be in 1..254 (got {num_ranks})")
        self.num_ranks = num_ranks
        self.link = link
        self.delay_note = "no added delay"

    @property
    def description(self) -> str:
        return f"{self.label}, {self.delay_note}"

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def addr(self, rank: int) -> str:
        raise NotImplementedError

    def ifname(self, rank: int) -> str:
        raise NotImplementedError

    def ns(self, rank: int) -> Optional[str]:
        r"""The rank's network namespace (:obj:`None`: the caller's)."""
        return None

    def exec_prefix(self, rank: int) -> List[str]:
        r"""What to put before a command to run it as :obj:`rank`."""
        ns = self.ns(rank)
        return [] if ns is None else _in_ns(ns)

    def default_master_port(self) -> int:
        return DEFAULT_MASTER_PORT

    def env(self, rank: int, master_port: int,
            extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        r"""The environment torchrun would give :obj:`rank`, with one rank per
        emulated node. ``LOCAL_WORLD_SIZE`` stays the number of ranks because
        they all share this machine's cores (pyg_dist divides them), and
        ``GLOO_SOCKET_IFNAME`` makes gloo use the rank's emulated NIC instead
        of whatever the host name resolves to."""
        env = dict(os.environ)
        env.update(MASTER_ADDR=self.addr(0), MASTER_PORT=str(master_port), RANK=str(rank),
                   WORLD_SIZE=str(self.num_ranks), LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE=str(self.num_ranks),
                   GLOO_SOCKET_IFNAME=self.ifname(rank))
        env.update(extra or {})
        return env

    def wire_counters(self) -> Optional[List[Dict[str, int]]]:
        r"""Per rank, its link's counters since it was created (see
        :data:`WIRE_KEYS`); :obj:`None` where links have none of their own."""
        return None

    def launch(self, cmd: Union[Command, Sequence[Command]],
               env: Optional[Dict[str, str]] = None, master_port: Optional[int] = None,
               timeout: float = 600.0) -> LaunchResult:
        r"""Runs one process per rank (:obj:`cmd` for all, or one command per
        rank) and waits for all of them. Once a rank fails, the others get a
        few seconds to notice before they are killed, and all are killed
        after :obj:`timeout` seconds or on an exception (``Ctrl-C``). The
        result has the bytes each rank's link carried meanwhile
        (:attr:`LaunchResult.wire_bytes`), read right before the first rank
        starts and after the last one exited."""
        cmds = _per_rank(cmd, self.num_ranks)
        port = master_port or self.default_master_port()
        before = self.wire_counters()
        result = launch_processes([self.exec_prefix(r) + list(cmds[r])
                                   for r in range(self.num_ranks)],
                                  [self.env(r, port, env) for r in range(self.num_ranks)],
                                  timeout)
        after = self.wire_counters()
        if before is None or after is None:
            return result
        return dataclasses.replace(result, wire_bytes=[
            {key: a[key] - b[key] for key in a if key in b} for a, b in zip(after, before)])


def launch_processes(cmds: Sequence[Command], envs: Sequence[Dict[str, str]],
                     timeout: float, cwd: Optional[str] = None) -> LaunchResult:
    r"""Runs :obj:`cmds` side by side (each in its own session, output to a
    file) and waits for all of them. Once one fails, the others get
    :obj:`_FAIL_GRACE` seconds to notice before they and their children are
    killed; all are killed after :obj:`timeout` seconds or on an exception."""
    # Output goes to files: pipes that nobody reads while waiting would
    # fill up and block the processes.
    logs = [tempfile.TemporaryFile("w+") for _ in cmds]
    procs: List[subprocess.Popen] = []
    try:
        for cmd, env, log in zip(cmds, envs, logs):
            procs.append(subprocess.Popen(list(cmd), env=env, cwd=cwd,
                                          stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        _wait_all(procs, timeout)
    finally:
        for proc in procs:
            _kill(proc)
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
            log.close()
    return LaunchResult([proc.returncode for proc in procs], outputs)


def _per_rank(cmd: Union[Command, Sequence[Command]], num_ranks: int) -> List[Command]:
    if isinstance(cmd, str) or not cmd:
        raise ValueError("cmd must be an argument list (or one per rank), not a string")
    if isinstance(cmd[0], str):
        return [cmd] * num_ranks  # type: ignore[list-item]
    if len(cmd) != num_ranks:
        raise ValueError(f"got {len(cmd)} commands for {num_ranks} ranks")
    return list(cmd)  # type: ignore[arg-type]


def _wait_all(procs: List[subprocess.Popen], timeout: float) -> None:
    r"""Returns once all :obj:`procs` exited, :obj:`_FAIL_GRACE` seconds
    after the first failure, or after :obj:`timeout` seconds."""
    deadline = time.monotonic() + timeout
    failed_at = None
    while time.monotonic() < deadline:
        codes = [proc.poll() for proc in procs]
        if all(code is not None for code in codes):
            return
        if failed_at is None and any(code for code in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > _FAIL_GRACE:
            return
        time.sleep(0.05)


def _kill(proc: subprocess.Popen) -> None:
    r"""Ends :obj:`proc` and its children (its own session): SIGTERM, then
    SIGKILL for what is still running two seconds later."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            proc.wait()
            return
        except subprocess.TimeoutExpired:
            pass


class LoopbackNetwork(Network):
    r"""All ranks on ``127.0.0.1``: the fallback where namespaces cannot be
    used, with the same interface as :class:`EmulatedNetwork` (:obj:`link`
    is accepted for that, and ignored). Its launches report no wire bytes:
    the ranks share ``lo`` and its counters."""
    label = "loopback"

    def __init__(self, num_ranks: int, link: Optional[Link] = None):
        super().__init__(num_ranks, Link())
        self.delay_note = "unshaped, no added delay, wire bytes not measured (shared lo)"

    def addr(self, rank: int) -> str:
        return "127.0.0.1"

    def ifname(self, rank: int) -> str:
        return "lo"

    def default_master_port(self) -> int:
        with socket.socket() as s:  # the root namespace is shared: pick a free port
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


class EmulatedNetwork(Network):
    r"""One network namespace per rank, joined through veth pairs to a bridge
    in a hub namespace, each link shaped to :obj:`link` in both directions
    (see the module documentation). A loopback :obj:`link` gives the same
    topology unshaped. A delay the kernel cannot add (no ``sch_netem``) is
    left out: :obj:`link` and :obj:`label` are what is applied,
    :obj:`requested` what was asked for, :obj:`delay_note` says why.

    Namespaces are named ``{prefix}-hub`` and ``{prefix}-r{rank}``; leftovers
    of a crashed run with the same :obj:`prefix` (and processes still in
    them) are removed on enter, so only one network per prefix may exist at a
    time. Needs root; see :func:`available`.
    """

    def __init__(self, num_ranks: int, link: Link, prefix: str = "pgd"):
        super().__init__(num_ranks, link)
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", prefix):
            raise ValueError(f"prefix must be 1-8 lowercase letters or digits (got '{prefix}')")
        self.prefix = prefix
        self.hub = f"{prefix}-hub"
        self.requested = link
        if link.delay is not None:
            method, reason = delay_support()
            if method is None:  # rate only: no user-space delay
                self.link = Link(link.rate)
                self.delay_note = f"no added delay ({reason}; {link.delay} requested)"
            else:
                self.delay_note = f"{link.delay} one-way delay ({method})"
        self.label = "veth (unshaped)" if link.is_loopback else self.link.label
        self._sigterm: Any = None
        self.setup_seconds = 0.0  # how long entering took

    def addr(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def ifname(self, rank: int) -> str:
        return "eth0"

    def ns(self, rank: int) -> str:
        return f"{self.prefix}-r{rank}"

    def __enter__(self) -> "EmulatedNetwork":
        start = time.monotonic()
        self._catch_sigterm()
        try:
            self._remove_namespaces()
            self._create()
        except BaseException:
            self._teardown()
            raise
        self.setup_seconds = time.monotonic() - start
        return self

    def __exit__(self, *exc: Any) -> None:
        self._teardown()

    def _catch_sigterm(self) -> None:
        r"""Turns SIGTERM into :class:`SystemExit` while the network exists,
        so that being killed still runs :meth:`__exit__`."""
        if threading.current_thread() is threading.main_thread():
            self._sigterm = signal.signal(signal.SIGTERM, _exit_on_signal)

    def _create(self) -> None:
        _run(["ip", "netns", "add", self.hub])
        _run(["ip", "-n", self.hub, "link", "set", "lo", "up"])
        _run(["ip", "-n", self.hub, "link", "add", "name", "br0", "type", "bridge"])
        _run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
        rate = self.link.rate_bps
        for rank in range(self.num_ranks):
            self._add_rank(rank)
            if rate is not None:
                self._shape(rank, _tbf_args(rate), self.link.delay is not None)

    def _add_rank(self, rank: int) -> None:
        ns, port = self.ns(rank), f"veth{rank}"
        _run(["ip", "netns", "add", ns])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        # Created inside the hub with its peer moved straight into the rank's
        # namespace: the root namespace never sees either end.
        _run(["ip", "-n", self.hub, "link", "add", "name", port, "mtu", str(MTU), "type", "veth",
              "peer", "name", self.ifname(rank), "mtu", str(MTU), "netns", ns])
        _run(["ip", "-n", self.hub, "link", "set", port, "master", "br0"])
        _run(["ip", "-n", self.hub, "link", "set", port, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{self.addr(rank)}/24", "dev", self.ifname(rank)])
        _run(["ip", "-n", ns, "link", "set", self.ifname(rank), "up"])

    def _shape(self, rank: int, tbf: List[str], netem_delay: bool) -> None:
        r"""Limits both directions of :obj:`rank`'s link to the rate. With
        ``netem``, the delay goes on the hub's side, towards the rank: every
        packet passes it once, and it holds packets that already left their
        sender (a qdisc on the sender's side would hold packets that TCP Small
        Queues still counts as unsent, which caps throughput)."""
        _run(["tc", "-n", self.ns(rank), "qdisc", "replace", "dev", self.ifname(rank),
              "root", *tbf])
        hub = ["tc", "-n", self.hub, "qdisc", "replace", "dev", f"veth{rank}"]
        if not netem_delay:
            _run([*hub, "root", *tbf])
            return
        # netem delays, then hands packets to its child tbf (the netem manual's
        # way to combine both); its limit counts packets, not bytes.
        _run([*hub, "root", "handle", "1:", "netem", "delay", _tc_time(self.link.delay_s),
              "limit", "100000"])
        _run([*hub, "parent", "1:1", "handle", "10:", *tbf])

    def wire_counters(self) -> List[Dict[str, int]]:
        r"""Per rank, the counters of its end of its veth pair (what the rank
        sent and received, :data:`WIRE_KEYS`), read with ``ip -s -j link`` in
        its namespace, and on shaped links its ``tbf``'s (:data:`FRAME_KEYS`,
        ``tc -s -j qdisc``)."""
        counters = []
        for rank in range(self.num_ranks):
            ns, dev = self.ns(rank), self.ifname(rank)
            stats = json.loads(_run(["ip", "-n", ns, "-s", "-j", "link", "show", dev]))[0][
                "stats64"]
            one = {f"{d}_{k}": int(stats[d][k]) for d in ("tx", "rx") for k in ("bytes", "packets")}
            if not self.link.is_loopback:
                qdiscs = json.loads(_run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev]))
                tbf = next((q for q in qdiscs if q.get("kind") == "tbf" and q.get("root")), None)
                if tbf is not None:
                    one.update(tx_frame_bytes=int(tbf["bytes"]), tx_frames=int(tbf["packets"]))
            counters.append(one)
        return counters

    def _teardown(self) -> None:
        self._remove_namespaces()
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None

    def _own_namespaces(self) -> List[str]:
        names = [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines()
                 if line.strip()]
        mine = re.compile(rf"{re.escape(self.prefix)}-(hub|r\d+)")
        return [name for name in names if mine.fullmatch(name)]

    def _remove_namespaces(self) -> None:
        r"""Deletes this prefix's namespaces, ending the processes still in
        them first (a namespace lives on while a process uses it)."""
        for name in self._own_namespaces():
            try:
                pids = _run(["ip", "netns", "pids", name]).split()
            except NetworkSetupError:
                pids = []
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                _run(["ip", "netns", "del", name])
            except NetworkSetupError as e:
                print(f"warning: {e}", file=sys.stderr)


def _exit_on_signal(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def _tbf_args(rate_bps: float) -> List[str]:
    r"""``tbf`` parameters for :obj:`rate_bps`. The bucket holds 1 ms of
    traffic, at least 64 KiB: smaller buckets undershoot at high rates (the
    qdisc's timer cannot refill them often enough: 10gbit with 64 KiB reached
    0.72 GB/s, with 1 MiB 1.22 GB/s). The queue holds 100 ms so that
    all-to-all incast is delayed, not dropped."""
    rate_Bps = rate_bps / 8
    burst = max(64 * 1024, int(rate_Bps * 1e-3))
    limit = max(4 * 1024 * 1024, int(rate_Bps * 0.1))
    return ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst), "limit", str(limit)]


def _tc_time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}us"


def network_for(num_ranks: int, link: Link, prefix: str = "pgd") -> Network:
    r"""The emulated network for :obj:`link` where it can run, else the
    loopback one; prints which, and why when it falls back. A delay the
    kernel cannot add is left out, and the printed line says so (the rate
    still is applied; see :func:`effective_link`)."""
    if link.is_loopback:
        print("network: loopback")
        return LoopbackNetwork(num_ranks)
    ok, reason = available()
    if not ok:
        print(f"network: loopback (link {link.label} not emulated: {reason})")
        return LoopbackNetwork(num_ranks)
    net = EmulatedNetwork(num_ranks, link, prefix)
    print(f"network: emulated {net.description}; {num_ranks} ranks in namespaces {prefix}-*")
    return net


# Self-check ##################################################################

def _timed(fn: Callable[[], Any]) -> float:
    r"""Seconds the slowest rank spends in :obj:`fn`, all starting together."""
    import torch
    import torch.distributed as dist
    dist.barrier()
    start = time.perf_counter()
    fn()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def _worker(size_mb: float, reps: int) -> None:
    r"""One rank of the self-check. Rank 0 prints one JSON line: the median
    rank 0 <-> 1 round trip of a 4-byte tensor, the tensor bytes all ranks
    sent (``payload``; the barriers and timing reductions of
    :func:`_timed`, a few KB, left out) and three throughputs, in MB/s that
    one rank sends:

    * ``send_recv``: rank 0 sends :obj:`size_mb` to rank 1 (one direction),
    * ``exchange``: every rank posts ``irecv`` from, then ``isend`` to, every
      peer (all links busy in both directions),
    * ``all_to_all``: gloo's ``all_to_all_single`` of the same data. It
      often reaches only half the exchange's rate: gloo sends a rank's
      "ready to receive" message on the same connection as its data, so a
      rank that starts sending before it announced its receive makes its
      peer wait for the whole transfer, and the two directions take turns.
      Whether that happens depends on how far apart the ranks arrive
      compared to the latency, so it varies from run to run.
    """
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    one = torch.zeros(1)

    def round_trip() -> float:
        start = time.perf_counter()
        if rank == 0:
            dist.send(one, 1)
            dist.recv(one, 1)
        elif rank == 1:
            dist.recv(one, 0)
            dist.send(one, 0)
        return time.perf_counter() - start

    data = torch.ones(int(size_mb * 1e6) // 4 // world * world)
    out = torch.empty_like(data)

    def send_recv() -> None:
        if rank == 0:
            dist.send(data, 1)
        elif rank == 1:
            dist.recv(data, 0)

    def exchange() -> None:
        peers = [p for p in range(world) if p != rank]
        ins, outs = out.chunk(world), data.chunk(world)
        reqs = [dist.irecv(ins[p], p) for p in peers]
        reqs += [dist.isend(outs[p], p) for p in peers]
        for req in reqs:
            req.wait()

    round_trips = 210
    rtt = statistics.median([round_trip() for _ in range(round_trips)][10:])  # 10 to warm up
    sent = data.numel() * 4 / 1e6  # MB
    # round trips: ranks 0 and 1 send 4 bytes each; send_recv: rank 0 the data;
    # exchange and all_to_all: every rank all chunks but its own
    payload = (round_trips * 2 * 4 + reps * data.numel() * 4
               + 2 * reps * (world - 1) * data.numel() * 4)
    stats = {
        "rtt_ms": rtt * 1e3, "payload": payload,
        "send_recv": sent / statistics.median([_timed(send_recv) for _ in range(reps)]),
        # a rank keeps its own chunk of an exchange: it sends (world - 1) / world
        "exchange": sent * (world - 1) / world / statistics.median(
            [_timed(exchange) for _ in range(reps)]),
        "all_to_all": sent * (world - 1) / world / statistics.median(
            [_timed(lambda: dist.all_to_all_single(out, data)) for _ in range(reps)]),
    }
    if rank == 0:
        print(json.dumps(stats))
    dist.destroy_process_group()


def _measure(link: Link, num_ranks: int, size_mb: float, reps: int,
             prefix: str) -> Optional[Dict[str, float]]:
    r"""Runs the self-check's worker on :obj:`link` (:obj:`None` where it
    cannot be emulated here)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--size-mb", str(size_mb),
           "--reps", str(reps)]
    net = network_for(num_ranks, link, prefix)
    if not link.is_loopback and isinstance(net, LoopbackNetwork):
        return None
    with net:
        result = net.launch(cmd, timeout=600).check()
    stats = json.loads(result.outputs[0].strip().splitlines()[-1])
    stats.update(label=net.label, description=net.description, delay_s=net.link.delay_s,
                 expected=net.link.expected_mbps, setup_s=getattr(net, "setup_seconds", 0.0),
                 wire=result.wire_bytes)
    return stats


def _print_table(links: List[Link], rows: List[Optional[Dict[str, float]]]) -> None:
    columns = ["link", "send/recv", "exchange", "all_to_all", "expected", "RTT ms",
               "+2*delay", "setup s"]
    print("".join(f"{c:>12}" for c in columns) + "   (throughputs: MB/s a rank sends)")
    for link, row in zip(links, rows):
        if row is None:
            print(f"{link.label:>12}   (not emulated here)")
            continue
        cells = [row["label"], f"{row['send_recv']:.1f}", f"{row['exchange']:.1f}",
                 f"{row['all_to_all']:.1f}",
                 "-" if row["expected"] is None else f"{row['expected']:.1f}",
                 f"{row['rtt_ms']:.3f}",
                 f"{2 * row['delay_s'] * 1e3:.2f}" if row["delay_s"] else "-",
                 f"{row['setup_s']:.2f}"]
        print("".join(f"{c:>12}" for c in cells))
    print()
    print("bytes of all ranks: tensor payload; wire: the veth counters (a GSO packet's "
          "headers once); frames: the tbf's (headers in every 1500-byte frame)")
    columns = ["link", "payload MB", "wire tx MB", "wire rx MB", "tx/payload", "packets",
               "frames MB", "frames", "frm/payload"]
    print("".join(f"{c:>12}" for c in columns))
    for row in rows:
        if row is None:
            continue
        wire, payload = row["wire"], row["payload"]
        total = lambda key: sum(rank[key] for rank in wire)  # noqa: E731
        cells = [row["label"], f"{payload / 1e6:.2f}"] + ["-"] * 7
        if wire is not None:
            cells[2:6] = [f"{total('tx_bytes') / 1e6:.2f}", f"{total('rx_bytes') / 1e6:.2f}",
                          f"{total('tx_bytes') / payload:.3f}", str(total("tx_packets"))]
        if wire is not None and all(key in wire[0] for key in FRAME_KEYS):
            cells[6:9] = [f"{total('tx_frame_bytes') / 1e6:.2f}", str(total("tx_frames")),
                          f"{total('tx_frame_bytes') / payload:.3f}"]
        print("".join(f"{c:>12}" for c in cells))
    print()
    for row in rows:
        if row is not None:
            print(f"{row['label']}: {row['description']}")


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link", action="append", type=parse_link,
                        help="RATE[,DELAY] to check against loopback (repeatable; "
                             "default: 1gbit,0.1ms)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size-mb", type=float, default=16.0,
                        help="tensor size of the throughput measurements")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prefix", default="pgd", help="namespace name prefix")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.size_mb, args.reps)
        return
    if args.ranks < 2:
        parser.error("--ranks must be at least 2")
    links = [Link()] + (args.link or [parse_link("1gbit,0.1ms")])
    rows = [_measure(link, args.ranks, args.size_mb, args.reps, args.prefix)
            for link in links]
    print()
    _print_table(links, rows)


if __name__ == "__main__":
    main()
