"""Exploring in Jupyter: ``spawn`` of functions defined in ``__main__`` (a
notebook's cells), ranks that keep their state across calls
(``pyg_dist.notebook``), the ``%%ranks`` magic, and no rank left behind
by ``stop()``, an interrupt or a killed kernel."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch.distributed as dist

import pyg_dist
import pyg_dist.notebook as notebook
from tests.conftest import REPO


MAIN_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from torch_geometric.nn import GraphSAGE
    import pyg_dist

    def my_step(root):  # a user's function, defined in __main__
        part = pyg_dist.DistData.load(root, dist.get_rank())
        model = pyg_dist.nn.distribute(GraphSAGE(part.num_features, 16, 2, 4), part)
        return model(part.x, part.adj_t).shape

    class Point:
        def __init__(self, x):
            self.x = x

    def adder(k):
        return lambda v: v + k  # a closure

    def everything(root, square, add, cls):
        return [list(my_step(root)), square(dist.get_rank()), add(1), cls(3).x]

    if __name__ == "__main__":
        out = pyg_dist.spawn(everything, 2, (sys.argv[1], lambda r: r * r, adder(10), Point))
        print(json.dumps(out))
""")


def test_spawn_runs_functions_defined_in_main(graph, tmp_path):
    r"""A function, a lambda, a closure and a class defined in ``__main__``
    (what a notebook's cells are) reach the ranks by value."""
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(graph, 2, root=root)
    script = tmp_path / "explore.py"
    script.write_text(MAIN_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), root], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    sizes = [r.num_inner for r in (pyg_dist.DistData.load(root, i) for i in range(2))]
    assert out == [[[sizes[r], 4], r * r, 11, 3] for r in range(2)]


def test_spawn_says_what_cannot_travel():
    import threading
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot send .* to the ranks"):
        pyg_dist.spawn(lambda: lock.locked(), 1)


def _gone(pids, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _remember(k):
    notebook.state.k = k * (dist.get_rank() + 1)
    print(f"kept {notebook.state.k}")
    return notebook.state.k


def _stuck():
    import torch
    if dist.get_rank() == 1:
        raise ValueError("boom")
    dist.all_reduce(torch.ones(1))  # rank 0 waits for rank 1, which failed


def test_ranks_keep_state_and_report_failures(capsys, monkeypatch):
    r"""State left on a rank is there for the next call; a rank's output
    comes back under its label; an exception comes back with its rank and
    traceback and leaves the group up when every rank answered, and stops
    it when one is left waiting in a collective; ``stop()`` leaves no
    process."""
    with notebook.start(nprocs=2) as ranks:
        assert ranks.run(_remember, 3) == [3, 6]
        assert "[rank 0] kept 3" in capsys.readouterr().out
        assert ranks.run(lambda: notebook.state.k + 1) == [4, 7]
        with pytest.raises(notebook.RankError) as error:
            ranks.run(lambda: 1 / dist.get_rank())
        assert error.value.usable and list(error.value.tracebacks) == [0]
        assert "ZeroDivisionError" in str(error.value) and "still up" in str(error.value)
        assert ranks.run(lambda: notebook.state.k) == [3, 6]  # still up, state intact
        pids = ranks.pids
        monkeypatch.setattr(notebook, "ANSWER_GRACE", 1.0)
        with pytest.raises(notebook.RankError) as error:
            ranks.run(_stuck)
        assert not error.value.usable and "ValueError: boom" in error.value.tracebacks[1]
        assert "did not answer" in error.value.tracebacks[0] and not ranks.alive
        assert _gone(pids)
        with pytest.raises(RuntimeError, match="stopped"):
            ranks.run(lambda: 0)
    ranks = notebook.start(nprocs=2)
    pids = ranks.pids
    ranks.stop()
    assert _gone(pids) and not ranks.alive


def test_ranks_magic_prints_each_rank_under_its_label(capsys):
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pyg_dist.notebook")
    ranks = notebook.start(nprocs=2)
    try:
        shell.run_cell_magic("ranks", "", "x = dist.get_rank() * 10\nprint('x is', x)")
        shell.run_cell_magic("ranks", "", "print('x again', x + 1)")  # state kept
        out = capsys.readouterr().out
        assert "[rank 0] x is 0" in out and "[rank 1] x is 10" in out
        assert "[rank 0] x again 1" in out and "[rank 1] x again 11" in out
        shell.run_cell_magic("ranks", "", "from tqdm import tqdm\nfor _ in tqdm(range(3)): pass")
        bars = capsys.readouterr().out
        assert out.count("3/3") == 0 and bars.count("3/3 [") == 2  # a final bar per rank
        assert "[rank 0] 100%|" in bars and "[rank 1] 100%|" in bars  # labelled
        shell.user_ns["mine"] = ranks
        shell.run_cell_magic("ranks", "mine", "import pyg_dist\nprint(pyg_dist.__name__)")
        assert "[rank 1] pyg_dist" in capsys.readouterr().out
    finally:
        ranks.stop()


START = ("import time, pyg_dist.notebook\nranks = pyg_dist.notebook.start(nprocs=2)\n"
         "ranks.run(int)")  # returns once both ranks serve


@pytest.fixture()
def kernel():
    from jupyter_client.manager import start_new_kernel
    km, kc = start_new_kernel(kernel_name="python3", cwd=REPO)
    yield km, kc
    kc.stop_channels()
    if km.is_alive():
        km.shutdown_kernel(now=True)


def _execute(kc, code: str, timeout: float = 120):
    r"""Runs :obj:`code` in the kernel; the name of the error it raised."""
    msg_id = kc.execute(code)
    error = None
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            error = msg["content"]["ename"]
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return error


def _ranks_of(pid: int):
    r"""The rank processes the kernel :obj:`pid` started (its children
    running ``multiprocessing.spawn``)."""
    ranks = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline") as f:
                spawned = "spawn_main" in f.read()
        except (OSError, ValueError):
            continue
        if parent == pid and spawned and _alive(int(entry)):
            ranks.append(int(entry))
    return ranks


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_rank_outlives_an_interrupt_or_a_killed_kernel(kernel):
    r"""The stop button (SIGINT to the kernel) while the ranks compute ends
    them and keeps the kernel; a killed kernel takes its ranks along."""
    km, kc = kernel
    assert _execute(kc, START) is None
    pids = _ranks_of(km.provisioner.pid)
    assert len(pids) == 2
    msg_id = kc.execute("ranks.run(time.sleep, 60)", stop_on_error=False)
    time.sleep(2)
    km.interrupt_kernel()
    errors = []
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            errors.append(msg["content"]["ename"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert errors == ["KeyboardInterrupt"]
    assert _gone(pids)
    assert _execute(kc, START) is None  # the kernel lives on
    pids = _ranks_of(km.provisioner.pid)
    assert len(pids) == 2
    os.kill(km.provisioner.pid, signal.SIGKILL)  # nothing of the kernel runs on
    assert _gone(pids)


def _all_reduce_on_rank_0():
    import torch
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 returns instead of joining


def test_collective_deadlock_says_the_group_is_down():
    r"""Rank 0 waits in an all-reduce that rank 1 never joins: when the
    collective times out the group is down (its pairs are closed), the error
    says so at once and the ranks are stopped."""
    ranks = notebook.start(nprocs=2, timeout=3)
    try:
        ranks.run(int)  # both ranks serve
        pids, start = ranks.pids, time.monotonic()
        with pytest.raises(notebook.RankError) as error:
            ranks.run(_all_reduce_on_rank_0)
        assert time.monotonic() - start < 3 + notebook.DOWN_GRACE + 4
        message = str(error.value)
        assert not error.value.usable and "the group is down" in message
        assert "still up" not in message and "Timed out" in error.value.down
        assert "notebook.start()" in message and not ranks.alive and _gone(pids)
        with pytest.raises(RuntimeError, match="stopped"):
            ranks.run(int)
    finally:
        ranks.stop()


def _killed_on_rank_1():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1)
    return dist.get_rank()


def test_killed_rank_says_the_group_is_down():
    r"""``kill -9`` of a rank, during a call or between calls: the group is
    down, the error names the signal, no rank is left."""
    with notebook.start(nprocs=2) as ranks:
        ranks.run(int)
        pids, start = ranks.pids, time.monotonic()
        with pytest.raises(notebook.RankError) as error:
            ranks.run(_killed_on_rank_1)
        assert time.monotonic() - start < 1 + notebook.DOWN_GRACE + 4
        assert "the group is down: rank 1 died (killed by SIGKILL)" in str(error.value)
        assert not error.value.usable and "still up" not in str(error.value)
        assert _gone(pids)
    with notebook.start(nprocs=2) as ranks:
        ranks.run(int)
        os.kill(ranks.pids[1], signal.SIGKILL)
        assert _gone(ranks.pids[1:])
        with pytest.raises(notebook.RankError, match="the group is down: rank 1 died "
                                                      r"\(killed by SIGKILL\)"):
            ranks.run(int)
        assert not ranks.alive


def _print_then_sleep():
    print(f"hello from {dist.get_rank()}")
    time.sleep(4)
    return dist.get_rank()


def test_output_appears_while_the_call_runs(capsys):
    r"""What a rank prints shows, labelled, before the call returns."""
    import threading
    with notebook.start(nprocs=2) as ranks:
        ranks.run(int)
        results = []
        call = threading.Thread(target=lambda: results.append(ranks.run(_print_then_sleep)))
        call.start()
        seen, deadline = "", time.monotonic() + 30
        while not ("[rank 0] hello from 0" in seen and "[rank 1] hello from 1" in seen):
            assert call.is_alive() and time.monotonic() < deadline, seen
            time.sleep(0.1)
            seen += capsys.readouterr().out
        assert call.is_alive()  # still sleeping: the lines came while it ran
        call.join(timeout=30)
        assert results == [[0, 1]]
