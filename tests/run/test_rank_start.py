"""How spawn() starts ranks: on Linux forked from a forkserver that imported
torch and PyG once, with what a fresh interpreter would have (the caller's
environment, stdout and stderr as they are now, its thread share, numpy
random numbers of its own); a fresh interpreter where the forkserver cannot
give that. Dying with the launcher, signals and stopped ranks:
tests/run/test_failures.py."""
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import pyg_dist
from pyg_dist import distributed
from pyg_dist.distributed import forkserver

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux")


def _facts(_=None):
    r"""What a rank sees of its own start."""
    import numpy as np
    return {"ppid": os.getppid(), "threads": torch.get_num_threads(),
            "env": os.environ.get("PYG_DIST_TEST_START"), "numpy": float(np.random.rand())}


@linux
def test_ranks_fork_from_a_single_threaded_forkserver():
    facts = pyg_dist.spawn(_facts, 2)
    server = forkserver._forkserver
    assert server["owner"] == os.getpid() and server["fit"]
    assert [f["ppid"] for f in facts] == [server["pid"]] * 2
    # forks copy no other thread's locks; no GPU driver opened before the fork
    assert os.listdir(f"/proc/{server['pid']}/task") == [str(server["pid"])]
    assert {"torch", "torch_geometric"} <= set(distributed.FORKSERVER_PRELOAD)


def test_ranks_get_their_share_of_threads_and_random_numbers_of_their_own():
    facts = pyg_dist.spawn(_facts, 2)
    assert [f["threads"] for f in facts] == [distributed.rank_threads(2)] * 2
    assert facts[0]["numpy"] != facts[1]["numpy"]  # as in two fresh interpreters
    assert [f["threads"] for f in pyg_dist.spawn(_facts, 2, threads=1)] == [1, 1]


def _say(word):
    print(f"{word} on stdout", flush=True)
    print(f"{word} on stderr", file=sys.stderr, flush=True)


def test_rank_output_goes_where_the_callers_goes_now(capfd):
    r"""pytest captures each test's file descriptors 1 and 2 anew: a rank
    forked by a forkserver started during another test still writes into
    this test's capture."""
    pyg_dist.spawn(_facts, 1)  # the forkserver is up (maybe since an earlier test)
    pyg_dist.spawn(_say, 2, ("hello", ))
    out, err = capfd.readouterr()
    assert out.count("hello on stdout") == 2 and err.count("hello on stderr") == 2


@linux
def test_a_changed_environment_reaches_the_ranks(monkeypatch):
    r"""A variable set after the forkserver started (a library imported
    since may set some): the forkserver's libraries read the old value when
    they were imported, so a new forkserver replaces it; not while a process
    forked from it runs (a rank of another spawn() under way, another
    user's process): then fresh interpreters."""
    pyg_dist.spawn(_facts, 1)
    first = forkserver._forkserver["pid"]
    monkeypatch.setenv("PYG_DIST_TEST_START", "changed")
    facts = pyg_dist.spawn(_facts, 2)
    second = forkserver._forkserver["pid"]
    assert second != first and not os.path.exists(f"/proc/{first}")
    assert [f["env"] for f in facts] == ["changed"] * 2
    assert [f["ppid"] for f in facts] == [second] * 2
    other = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(60, ))
    other.start()  # another process forked from it runs: it stays
    try:
        monkeypatch.delenv("PYG_DIST_TEST_START")
        facts = pyg_dist.spawn(_facts, 2)
        assert [f["ppid"] for f in facts] == [os.getpid()] * 2  # fresh interpreters
        assert [f["env"] for f in facts] == [None, None]
        assert forkserver._forkserver["pid"] == second and other.is_alive()
    finally:
        other.kill()
        other.join()


@linux
def test_an_ignored_variable_keeps_the_forkserver_and_still_reaches_the_ranks(monkeypatch):
    r"""A variable named in ``PYG_DIST_FORKSERVER_IGNORES`` (the suite names
    pytest's ``PYTEST_CURRENT_TEST`` there) may change without a new
    forkserver; the ranks still see its value of now."""
    monkeypatch.setenv(distributed.FORKSERVER_IGNORES_ENV,
                       "PYTEST_CURRENT_TEST,PYG_DIST_TEST_START")
    pyg_dist.spawn(_facts, 1)
    first = forkserver._forkserver["pid"]
    monkeypatch.setenv("PYG_DIST_TEST_START", "changed")
    facts = pyg_dist.spawn(_facts, 2)
    assert forkserver._forkserver["pid"] == first
    assert [f["ppid"] for f in facts] == [first] * 2
    assert [f["env"] for f in facts] == ["changed"] * 2


def test_start_method_spawn_is_a_fresh_interpreter_per_rank(monkeypatch):
    monkeypatch.setenv(distributed.START_METHOD_ENV, "spawn")
    facts = pyg_dist.spawn(_facts, 2)
    assert [f["ppid"] for f in facts] == [os.getpid()] * 2
    assert [f["threads"] for f in facts] == [distributed.rank_threads(2)] * 2
    monkeypatch.setenv(distributed.START_METHOD_ENV, "fork")
    with pytest.raises(ValueError, match="PYG_DIST_START_METHOD must be 'forkserver' or "
                                         "'spawn' \\(got 'fork'\\)"):
        pyg_dist.spawn(_facts, 2)


def test_a_module_found_elsewhere_rules_the_forkserver_out():
    r"""A forkserver that imported a module from another file than this
    process would (another copy on this process' ``sys.path``) is not used."""
    mine = {name: sys.modules[name].__file__ for name in ("torch", "os")}
    assert forkserver._same_modules(mine)
    assert not forkserver._same_modules(dict(mine, torch="/elsewhere/torch/__init__.py"))
    assert not forkserver._same_modules({"no_such_module_anywhere": "/x/y.py"})


PRELOAD_TOUCHES_NO_GPU = textwrap.dedent("""
    import sys, torch
    from pyg_dist.distributed import FORKSERVER_PRELOAD
    called = []
    def record(name):
        def f(*args, **kwargs):
            called.append(name)
            raise RuntimeError(name + " called while the forkserver imports")
        return f
    for name in ("is_available", "device_count", "init", "_lazy_init", "current_device",
                 "set_device", "get_device_name", "get_device_properties", "synchronize"):
        setattr(torch.cuda, name, record("torch.cuda." + name))
    if hasattr(torch._C, "_cuda_getDeviceCount"):
        torch._C._cuda_getDeviceCount = record("torch._C._cuda_getDeviceCount")
    for module in FORKSERVER_PRELOAD:
        __import__(module)
    assert not called and not torch.cuda.is_initialized(), called
    print("ok")
""")


def test_the_forkserver_imports_initialise_no_gpu():
    r"""A driver initialised before a fork fails in the child (and a
    process-wide thread pool deadlocks it): importing
    :data:`~pyg_dist.distributed.FORKSERVER_PRELOAD` asks nothing of CUDA."""
    proc = subprocess.run([sys.executable, "-c", PRELOAD_TOUCHES_NO_GPU], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
