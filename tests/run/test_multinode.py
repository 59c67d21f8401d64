r"""Two hosts on one machine: a real two-node torchrun launch.

Two network namespaces stand in for two hosts, joined by one veth pair (a
cable between two NICs). Each runs one torchrun agent; the agents meet
through the c10d rendezvous on the first host and start one ``pyg-dist
train`` rank each, so the rendezvous, the workers' store and every gloo
collective cross the veth link, exactly as between two machines. The
veth byte counters must grow by at least the halo bytes the run reports,
so the test cannot pass over loopback by accident.

What the test runs (as root; ``NS0``/``NS1`` stand for
``pgdmn{pid}-0``/``pgdmn{pid}-1``, ``PARTS``/``OUT`` for temporary
directories, ``ID`` for a fresh rendezvous id)::

    pyg-dist partition --num-parts 2 --num-nodes 3000 --root PARTS --data-dir DATA

    ip netns add NS0
    ip netns add NS1
    ip -n NS0 link add name mnv0 type veth peer name mnv1 netns NS1
    ip -n NS0 addr add 10.78.0.1/24 dev mnv0
    ip -n NS0 link set lo up
    ip -n NS0 link set mnv0 up
    ip -n NS1 addr add 10.78.0.2/24 dev mnv1
    ip -n NS1 link set lo up
    ip -n NS1 link set mnv1 up

    # host 0 (hosts the rendezvous store), in one shell
    ip netns exec NS0 env GLOO_SOCKET_IFNAME=mnv0 TP_SOCKET_IFNAME=mnv0 \
        torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
        --rdzv-endpoint 10.78.0.1:29400 --rdzv-id ID \
        --rdzv-conf is_host=1,join_timeout=90 --local-addr 10.78.0.1 \
        -m pyg_dist.cli train --root PARTS --out OUT --epochs 5 --hidden 16 \
        --no-progress --timeout 60

    # host 1, in another shell
    ip netns exec NS1 env GLOO_SOCKET_IFNAME=mnv1 TP_SOCKET_IFNAME=mnv1 \
        torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
        --rdzv-endpoint 10.78.0.1:29400 --rdzv-id ID \
        --rdzv-conf is_host=0,join_timeout=90 --local-addr 10.78.0.2 \
        -m pyg_dist.cli train --root PARTS --out OUT --epochs 5 --hidden 16 \
        --no-progress --timeout 60

    ip netns del NS0
    ip netns del NS1

``is_host`` and ``--local-addr`` are needed only because both "hosts" share
one host name that resolves to 127.0.0.1: torchrun would otherwise decide
that no agent owns 10.78.0.1 (nobody hosts the rendezvous store) and tell the
workers to meet at the host name (loopback). On real machines whose host
names resolve to their NIC's address both are optional. See
``docs/multinode.md``.

Skipped, with the reason, without root, without ``ip`` or where namespaces
and veth pairs cannot be created. Only namespaces created here are touched,
and they are removed afterwards, also on failure.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import List, Optional

import pytest

from tests.conftest import REPO

ADDRS = ("10.78.0.1", "10.78.0.2")
IFNAMES = ("mnv0", "mnv1")  # names inside the namespaces only
RDZV_PORT = 29400  # every namespace has its own port space
EPOCHS = 5
LAUNCH_TIMEOUT = 150.0  # seconds for both agents (the run takes ~20 s on 2 idle cores)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from netem import launch_processes  # noqa: E402  (one launcher for benchmarks and tests)

pytestmark = pytest.mark.timeout(240)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed (exit code {proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _unavailable() -> Optional[str]:
    r"""Why two namespaces joined by a veth pair cannot be made here
    (:obj:`None`: they can; probed with a throw-away namespace)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "'ip' (iproute2) is not installed"
    probe = f"pgdmn{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "add", "name", "pa", "type", "veth", "peer", "name", "pb")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create a network namespace with a veth pair: {e}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _remove_namespaces(names: List[str]) -> None:
    r"""Deletes those of :obj:`names` that exist, first killing what still
    runs inside them (a namespace lives on while a process uses it)."""
    existing = {line.split()[0] for line in _ip("netns", "list").stdout.splitlines()
                if line.strip()}
    for ns in names:
        if ns not in existing:
            continue
        for pid in _ip("netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        _ip("netns", "del", ns, check=False)


@pytest.fixture
def two_hosts():
    r"""Two namespaces (``pgdmn{pid}-0``, ``-1``) joined by one veth pair,
    ``mnv0`` at 10.78.0.1/24 and ``mnv1`` at 10.78.0.2/24."""
    reason = _unavailable()
    if reason is not None:
        pytest.skip(f"two-host test needs network namespaces: {reason}")
    names = [f"pgdmn{os.getpid()}-{k}" for k in range(2)]
    try:
        _remove_namespaces(names)  # leftovers of an earlier run with this pid
        for ns in names:
            _ip("netns", "add", ns)
        # Created in NS0 with its peer moved straight into NS1: the root
        # namespace never sees either end.
        _ip("-n", names[0], "link", "add", "name", IFNAMES[0], "type", "veth",
            "peer", "name", IFNAMES[1], "netns", names[1])
        for ns, addr, ifname in zip(names, ADDRS, IFNAMES):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", ifname, "up")
        yield names
    finally:
        _remove_namespaces(names)


def _tx_bytes(ns: str, ifname: str) -> int:
    stats = json.loads(_ip("-n", ns, "-j", "-s", "link", "show", "dev", ifname).stdout)
    return int(stats[0]["stats64"]["tx"]["bytes"])


def _torchrun() -> List[str]:
    script = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [script] if os.access(script, os.X_OK) else [sys.executable, "-m",
                                                         "torch.distributed.run"]


def _agent(node: int, ns: str, run_id: str, parts: str, out: str) -> List[str]:
    return ["ip", "netns", "exec", ns, *_torchrun(),
            "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{ADDRS[0]}:{RDZV_PORT}",
            "--rdzv-id", run_id,
            "--rdzv-conf", f"is_host={int(node == 0)},join_timeout=90",
            "--local-addr", ADDRS[node],
            "-m", "pyg_dist.cli", "train", "--root", parts, "--out", out,
            "--epochs", str(EPOCHS), "--hidden", "16", "--no-progress", "--timeout", "60"]


def test_two_hosts_over_veth(two_hosts, tmp_path):
    parts, out = str(tmp_path / "parts"), str(tmp_path / "run")
    subprocess.run([sys.executable, "-m", "pyg_dist.cli", "partition", "--num-parts", "2",
                    "--num-nodes", "3000", "--root", parts,
                    "--data-dir", str(tmp_path / "data")],
                   cwd=REPO, capture_output=True, text=True, timeout=120, check=True)

    before = [_tx_bytes(ns, ifname) for ns, ifname in zip(two_hosts, IFNAMES)]
    run_id = f"pgdmn{os.getpid()}-{time.monotonic_ns()}"
    cmds = [_agent(k, ns, run_id, parts, out) for k, ns in enumerate(two_hosts)]
    envs = [dict(os.environ, GLOO_SOCKET_IFNAME=ifname, TP_SOCKET_IFNAME=ifname)
            for ifname in IFNAMES]
    codes, outputs = launch_processes(cmds, envs, LAUNCH_TIMEOUT, cwd=REPO)
    report = "\n".join(f"--- agent {k} ({' '.join(cmds[k])}) exited with {codes[k]}:\n"
                       f"{outputs[k][-3000:]}" for k in range(2))
    assert codes == [0, 0], report
    sent = sum(_tx_bytes(ns, ifname) for ns, ifname in zip(two_hosts, IFNAMES)) - sum(before)

    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert summary["world_size"] == 2 and summary["epochs"] == EPOCHS, report
    assert [r["epoch"] for r in rows] == list(range(1, EPOCHS + 1)), report
    assert all(r["world_size"] == 2 for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"], [r["loss"] for r in rows]
    # Every halo row a rank sends goes to the other host: the veth pair must
    # have carried at least that much (it also carried the rendezvous, the
    # gradient all-reduces and the metrics).
    halo_bytes = sum(r["bytes_sent"] for r in rows)
    assert halo_bytes > 0
    assert sent >= halo_bytes, (f"the veth pair carried {sent} bytes, less than the "
                                f"{halo_bytes} halo bytes the run reports: the ranks did "
                                f"not talk over it\n{report}")
