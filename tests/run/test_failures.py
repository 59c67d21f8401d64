"""A dead, stopped or mismatched rank makes every other rank fail fast, never
hang; a killed launcher leaves no rank; bad values, existing runs and
non-finite training lose nothing."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch_geometric.nn import ARMAConv, SuperGATConv

import pyg_dist
from tests.run.failure_workers import die_mid_epoch, wrong_world_size


def test_dead_rank_makes_others_raise_within_timeout(graph, tmp_path):
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        pyg_dist.spawn(die_mid_epoch, 2, (str(tmp_path), 1), timeout=10)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "rank 1 died (exit code 3)" in message
    # the survivor raised its own error (its collective failed); it was not
    # merely terminated after hanging
    assert "rank 0: " in message and "did not finish" not in message
    assert elapsed < 10 + 15


def test_world_size_mismatch_is_refused(graph, tmp_path):
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    with pytest.raises(RuntimeError, match="holds 2 partitions but the world size is 3"):
        pyg_dist.spawn(wrong_world_size, 3, (str(tmp_path), ), timeout=10)


@pytest.mark.parametrize("layer", [ARMAConv(4, 4), SuperGATConv(4, 4)])
def test_unsupported_layer_named(graph, tmp_path, layer):
    pyg_dist.partition_graph(graph, 1, root=str(tmp_path))
    pyg_dist.init()
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    model = torch.nn.ModuleDict({"conv": layer})
    with pytest.raises(NotImplementedError, match=re.escape(f"'conv' ({type(layer).__name__})")):
        pyg_dist.nn.distribute(model, part)


def test_wrong_rows_named(graph, tmp_path):
    from torch_geometric.nn import SAGEConv
    pyg_dist.partition_graph(graph, 1, root=str(tmp_path))
    pyg_dist.init()
    part = pyg_dist.DistData.load(str(tmp_path), 0)
    conv = pyg_dist.nn.distribute(SAGEConv(part.num_features, 4), part)
    with pytest.raises(ValueError, match="owns 240 inner nodes"):
        conv(torch.randn(7, part.num_features), part.edge_index)


def _one_part(graph, tmp_path):
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(graph, 1, root=root)
    return root


def test_existing_run_is_never_replaced_silently(graph, tmp_path):
    from pyg_dist.train import TrainConfig, train
    root, out = _one_part(graph, tmp_path), str(tmp_path / "run")
    config = TrainConfig(hidden=8, epochs=3, progress=False)
    train(root, config, out)
    before = open(os.path.join(out, "metrics.jsonl")).read()
    with pytest.raises(FileExistsError, match="--resume to continue it or --overwrite"):
        train(root, config, out)
    assert open(os.path.join(out, "metrics.jsonl")).read() == before  # untouched
    train(root, TrainConfig(hidden=8, epochs=2, progress=False, overwrite=True), out)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["epoch"] for r in rows] == [1, 2]


def test_non_finite_training_stops_and_keeps_the_last_good_state(graph, tmp_path):
    r"""An lr that is finite but explodes the weights: the epoch whose loss
    is not finite raises before its step; the checkpoint, metrics and
    model of the good epochs stay, nothing non-finite is written."""
    from pyg_dist.train import NonFiniteError, TrainConfig, train
    root, out = _one_part(graph, tmp_path), str(tmp_path / "run")
    config = TrainConfig(model="gcn", num_layers=2, hidden=8, epochs=6, lr=1e30,
                         dropout=0.0, progress=False, checkpoint_every=1)
    with pytest.raises(NonFiniteError, match=r"epoch (\d+): the loss") as info:
        train(root, config, out)
    bad = int(re.search(r"epoch (\d+)", str(info.value)).group(1))
    assert bad > 1
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["epoch"] for r in rows] == list(range(1, bad))
    latest = json.load(open(os.path.join(out, "checkpoint", "latest.json")))
    assert latest["epoch"] == bad - 1
    assert not os.path.exists(os.path.join(out, "model.pt"))


def test_threads_respect_omp_num_threads(monkeypatch):
    from pyg_dist.distributed import available_cpus, rank_threads
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert rank_threads(2) == max(1, available_cpus() // 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert rank_threads(2) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "0")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
        rank_threads(2)


def test_stopped_rank_is_killed_and_the_launcher_returns(graph, tmp_path):
    from tests.run.failure_workers import stop_mid_epoch
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        pyg_dist.spawn(stop_mid_epoch, 2, (str(tmp_path), 1), timeout=5)
    assert "rank 1 was stopped (SIGSTOP)" in str(info.value) and "rank 0: " in str(info.value)
    # the survivor's timeout, start-up, the stop grace and the kill: no hang
    assert time.monotonic() - start < 5 + 25


def _children(pid: int):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _descendants(pid: int):
    r"""Every process below :obj:`pid`: its children, theirs, and so on."""
    found, todo = [], [pid]
    while todo:
        children = _children(todo.pop())
        found += children
        todo += children
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""


def _ranks(launcher: int):
    r"""The ranks :obj:`launcher` started: its children running
    ``multiprocessing.spawn``, or the children of its forkserver."""
    ranks = []
    for child in _children(launcher):
        if "spawn_main" in _cmdline(child):
            ranks.append(child)
        elif "multiprocessing.forkserver" in _cmdline(child):
            ranks += _children(child)
    return sorted(ranks)


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_ranks_die_with_their_launcher(graph, tmp_path):
    r"""`pyg-dist train` is killed outright (SIGKILL: no handler runs): its
    ranks follow within seconds, the running one and one stopped (SIGSTOP:
    no code of its own runs), none keeps training as an orphan (SIGTERM:
    see the next test)."""
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 2, root=root)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "pyg_dist.cli", "train", "--root", root, "--out", out,
         "--epochs", "100000", "--hidden", "8", "--no-progress", "--no-plots"],
        env=dict(os.environ, PYTHONWARNINGS="ignore"), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    metrics = os.path.join(out, "metrics.jsonl")
    deadline = time.monotonic() + 60
    while not (os.path.exists(metrics) and os.path.getsize(metrics)):
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.2)
    ranks = _descendants(launcher.pid)  # the ranks, and a forkserver if they fork from one
    assert len(_ranks(launcher.pid)) == 2 and set(_ranks(launcher.pid)) <= set(ranks)
    stopped = _ranks(launcher.pid)[1]
    os.kill(stopped, signal.SIGSTOP)
    while open(f"/proc/{stopped}/stat").read().rsplit(")", 1)[1].split()[0] not in "Tt":
        time.sleep(0.05)
    launcher.send_signal(signal.SIGKILL)  # before its STOPPED_GRACE would kill the rank
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(_alive(r) for r in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(r) for r in ranks), "ranks outlived their launcher"
    lines = open(metrics).read().count("\n")
    time.sleep(1.5)
    assert open(metrics).read().count("\n") == lines  # nobody writes any more


def _train_past_epoch_1(cmd, out: str, env, **popen) -> subprocess.Popen:
    r"""The training command :obj:`cmd`, started and waited for until its
    first epoch is in ``out/metrics.jsonl``."""
    launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=env, **popen)
    metrics = os.path.join(out, "metrics.jsonl")
    deadline = time.monotonic() + 60
    while not (os.path.exists(metrics) and os.path.getsize(metrics)):
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.2)
    return launcher


def test_sigterm_checkpoints_and_stops_then_resumes(graph, tmp_path):
    r"""A scheduler's preemption: SIGTERM to the launcher ends the current
    epoch on every rank, writes a checkpoint (though none was due) and
    exits non-zero; --resume continues from it."""
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 2, root=root)
    cmd = [sys.executable, "-m", "pyg_dist.cli", "train", "--root", root, "--out", out,
           "--hidden", "8", "--no-progress", "--no-plots", "--checkpoint-every", "1000"]
    launcher = _train_past_epoch_1(cmd + ["--epochs", "100000"], out,
                                   dict(os.environ, PYTHONWARNINGS="ignore"))
    metrics = os.path.join(out, "metrics.jsonl")
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode != 0 and "stopped by SIGTERM after epoch" in err, err[-2000:]
    epochs = [json.loads(line)["epoch"] for line in open(metrics)]
    latest = json.load(open(os.path.join(out, "checkpoint", "latest.json")))["epoch"]
    assert latest == epochs[-1]
    done = subprocess.run(cmd + ["--epochs", str(latest + 2), "--resume"], timeout=120,
                          capture_output=True, text=True,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert [json.loads(line)["epoch"] for line in open(metrics)] == list(range(1, latest + 3))


@pytest.mark.parametrize("nprocs", [0, -2, 1.5, "2"])
def test_spawn_refuses_no_ranks(nprocs):
    with pytest.raises(ValueError, match="nprocs must be a whole number >= 1"):
        pyg_dist.spawn(int, nprocs)


def _fail_beside_a_collective(tmp_path, how: str, timeout: float):
    r"""Spawns :func:`~tests.run.failure_workers.fail_beside_a_collective`; its
    :class:`SpawnError` and the seconds from each rank's mark to the end."""
    from pyg_dist.distributed import SpawnError
    from tests.run.failure_workers import fail_beside_a_collective
    mark = str(tmp_path / "mark")
    with pytest.raises(SpawnError) as info:
        pyg_dist.spawn(fail_beside_a_collective, 2, (how, mark), timeout=timeout)
    end = time.time()
    return info.value, [end - float(open(f"{mark}.{r}").read()) for r in range(2)]


def test_stopped_rank_ends_spawn_within_seconds_not_the_timeout(tmp_path):
    r"""SIGSTOP on a rank with the default 300 s collective timeout: it is
    killed after STOPPED_GRACE, the survivor's collective fails at once and
    spawn raises seconds later, the first line naming the stopped rank."""
    from pyg_dist.distributed import FAILURE_GRACE, STOPPED_GRACE
    error, since = _fail_beside_a_collective(tmp_path, "stop", timeout=300)
    assert since[1] < STOPPED_GRACE + FAILURE_GRACE + 5, since
    assert str(error).splitlines()[0] == "rank 1 was stopped (SIGSTOP) for more than 5 s: killed"
    assert "rank 0: RankLostError: lost rank 1" in error.details


def test_rank_waiting_for_a_sleeping_rank_ends_after_its_timeout(tmp_path):
    r"""Rank 0 waits in an all-reduce for rank 1, which sleeps: rank 0's
    collective times out, and rank 1 is killed FAILURE_GRACE later."""
    from pyg_dist.distributed import FAILURE_GRACE, Heartbeat
    error, since = _fail_beside_a_collective(tmp_path, "sleep", timeout=5)
    assert since[0] < 5 + Heartbeat.silence + FAILURE_GRACE + 4, since
    assert error.cause.startswith("rank 0: RuntimeError: ") and "Timed out" in error.cause
    assert error.errors[1] == f"did not finish within {FAILURE_GRACE:g} s of the first " \
                              f"failure (killed)"


def test_first_line_is_the_root_cause(tmp_path):
    r"""Rank 1 raises while rank 0 is in a collective: the first line is
    rank 1's error, not rank 0's lost connection; every traceback follows."""
    error, since = _fail_beside_a_collective(tmp_path, "raise", timeout=300)
    lines = str(error).splitlines()
    assert lines[0] == error.cause == "rank 1: ValueError: boom"
    assert lines[1] == "2 of 2 ranks failed:" and "\n".join(lines[1:]) == error.details
    assert "lost rank 1" in error.errors[0] and 'raise ValueError("boom")' in error.errors[1]
    assert since[1] < 10, since


def test_killed_rank_first_line_names_the_signal(tmp_path):
    error, since = _fail_beside_a_collective(tmp_path, "kill", timeout=300)
    assert str(error).splitlines()[0] == "rank 1 died (killed by SIGKILL)"
    assert since[1] < 10, since


def _cli_training_on_2_parts(tmp_path, env, *flags: str) -> subprocess.Popen:
    r"""``pyg-dist partition`` of a 2,000-node default graph into 2 parts,
    then ``pyg-dist train`` of it into ``tmp_path/run`` (with :obj:`flags`),
    running past its first epoch."""
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    cli = [sys.executable, "-m", "pyg_dist.cli"]
    subprocess.run(cli + ["partition", "--num-parts", "2", "--root", root, "--num-nodes",
                          "2000"], check=True, capture_output=True, timeout=120, env=env)
    return _train_past_epoch_1(
        cli + ["train", "--root", root, "--out", out, "--hidden", "8", "--no-progress",
               "--no-plots", "--epochs", "100000", *flags], out, env)


def test_ctrl_c_checkpoints_and_stops_in_one_line(tmp_path):
    r"""Ctrl-C (SIGINT) to `pyg-dist train` ends like SIGTERM: every rank
    ends its epoch and checkpoints, and the launcher prints one line that
    says so (no KeyboardInterrupt traceback) and where the ranks'
    tracebacks are."""
    out = str(tmp_path / "run")
    launcher = _cli_training_on_2_parts(tmp_path, dict(os.environ, PYTHONWARNINGS="ignore"),
                                        "--checkpoint-every", "1")
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    lines = err.strip().splitlines()
    assert launcher.returncode != 0 and "Traceback" not in err, err[-2000:]
    assert lines[0].startswith("pyg-dist train: error: Ctrl-C (SIGINT") and \
        "stopped by SIGTERM after epoch" in lines[0] and "--resume" in lines[0], err[-2000:]
    log = re.fullmatch(r"\(tracebacks of every rank: (.+)\)", lines[1]).group(1)
    assert "TrainingStopped" in open(log).read()
    os.remove(log)
    assert os.path.exists(os.path.join(out, "checkpoint", "latest.json"))


def test_killed_rank_of_a_cli_run_is_two_lines_without_warnings(tmp_path):
    r"""``kill -9`` of rank 0 (which hosts the store) in a real ``pyg-dist
    train`` with the user's warning settings: stderr is the cause and the
    log's name, no C++ frames of the lost store and no torch warnings."""
    launcher = _cli_training_on_2_parts(
        tmp_path, {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"})
    ranks = _ranks(launcher.pid)
    assert len(ranks) == 2
    os.kill(ranks[0], signal.SIGKILL)
    _, err = launcher.communicate(timeout=60)
    lines = err.strip().splitlines()
    assert launcher.returncode == 1 and len(lines) == 2, err[-3000:]
    assert lines[0] == "pyg-dist train: error: rank 0 died (killed by SIGKILL)"
    log = lines[1].split(": ", 1)[1].rstrip(")")
    assert lines[1].startswith("(tracebacks of every rank: ") and os.path.exists(log)
    os.remove(log)


def test_ctrl_c_of_a_single_rank_run_is_one_line(graph, tmp_path):
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 1, root=root)
    # started as a terminal starts a command in the foreground: Ctrl-C's
    # disposition the default, whatever this test process' is (an ignored
    # SIGINT is inherited, and Python then takes no Ctrl-C: a shell's
    # background job)
    launcher = _train_past_epoch_1(
        [sys.executable, "-m", "pyg_dist.cli", "train", "--root", root, "--out", out,
         "--hidden", "8", "--no-progress", "--no-plots", "--epochs", "100000"], out,
        dict(os.environ, PYTHONWARNINGS="ignore"),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    launcher.send_signal(signal.SIGINT)
    try:
        _, err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()  # no run left behind if it did not stop
    assert launcher.returncode == 130 and err.strip() == "pyg-dist train: interrupted (Ctrl-C)"


def test_stopped_heartbeat_thread_has_ended():
    # A heartbeat thread left inside store.add while the interpreter exits
    # can abort the process: stopping it waits for the thread.
    from datetime import timedelta

    import torch.distributed as dist

    from pyg_dist.distributed import Heartbeat, free_port, stop_heartbeat
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10),
                           wait_for_workers=False)
    Heartbeat.start("127.0.0.1", port, 0, 1)
    beat = Heartbeat.current
    assert beat is not None and beat.thread.is_alive()
    time.sleep(0.05)  # a beat or so
    stop_heartbeat()
    assert Heartbeat.current is None and not beat.thread.is_alive()
    assert int(server.get("pyg_dist/heartbeat/0")) >= 1


def _cli(*args: str):
    return [sys.executable, "-m", "pyg_dist.cli", *args]


def _quiet_env():
    return dict(os.environ, PYTHONWARNINGS="ignore")


def _gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


@pytest.mark.parametrize("to", ["launcher", "process group"])
def test_sighup_checkpoints_and_stops_in_one_line(graph, tmp_path, to):
    r"""SIGHUP (a closed terminal or SSH session: to the launcher, or to its
    whole process group, forkserver and ranks included) ends like SIGTERM:
    every rank ends its epoch and checkpoints, the launcher's line says
    SIGHUP, no process is left."""
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 2, root=root)
    launcher = subprocess.Popen(
        _cli("train", "--root", root, "--out", out, "--hidden", "8", "--no-progress",
             "--no-plots", "--epochs", "100000", "--checkpoint-every", "1000"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_quiet_env(),
        start_new_session=True)  # its own process group, as a terminal's job has
    try:
        metrics = os.path.join(out, "metrics.jsonl")
        deadline = time.monotonic() + 60
        while not (os.path.exists(metrics) and os.path.getsize(metrics)):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.2)
        family = _descendants(launcher.pid)
        if to == "launcher":
            launcher.send_signal(signal.SIGHUP)
        else:
            os.killpg(launcher.pid, signal.SIGHUP)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    lines = err.strip().splitlines()
    assert launcher.returncode == 1 and len(lines) == 2, err[-3000:]
    assert re.fullmatch(r"pyg-dist train: error: SIGHUP \(forwarded to the ranks as SIGTERM\):"
                        r" rank \d: TrainingStopped: stopped by SIG(HUP|TERM) after epoch \d+; "
                        r"checkpoint written: continue with --resume", lines[0]), lines[0]
    os.remove(lines[1].split(": ", 1)[1].rstrip(")"))
    epochs = [json.loads(line)["epoch"] for line in open(metrics)]
    latest = json.load(open(os.path.join(out, "checkpoint", "latest.json")))["epoch"]
    assert latest == epochs[-1]
    assert _gone_within(family, 10), "processes outlived the launcher"


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory):
    r"""2 parts of a 240-node graph and a 300-layer model trained on the
    whole graph (one epoch, one rank): predicting with it takes seconds."""
    from pyg_dist.train import TrainConfig, train
    from tests.conftest import small_graph
    folder = tmp_path_factory.mktemp("deep")
    one, two, model = str(folder / "one"), str(folder / "two"), str(folder / "model")
    pyg_dist.partition_graph(small_graph(), 1, root=one)
    pyg_dist.partition_graph(small_graph(), 2, root=two)
    train(one, TrainConfig(num_layers=300, hidden=4, epochs=1, progress=False), model)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return two, model


def _forkserver_without_ranks(launcher: int) -> bool:
    return any("multiprocessing.forkserver" in _cmdline(c) and not _children(c)
               for c in _children(launcher))


@pytest.mark.parametrize("when", ["before the ranks", "in the ranks"])
def test_sigterm_to_predict_is_one_line_and_no_manifest(deep_model, tmp_path, when):
    r"""SIGTERM to `pyg-dist predict`, while it starts its ranks or while they
    predict: one line that names it, at once, no predictions manifest and
    no temporary file, no process left."""
    root, model = deep_model
    out, log = str(tmp_path / "pred"), str(tmp_path / "stderr")
    with open(log, "w") as stderr:
        launcher = subprocess.Popen(
            _cli("predict", "--root", root, "--model-dir", model, "--out", out),
            stdout=subprocess.DEVNULL, stderr=stderr, env=_quiet_env())
    try:
        deadline = time.monotonic() + 60
        ready = (lambda: _forkserver_without_ranks(launcher.pid)) if when == "before the ranks" \
            else (lambda: "predict:" in open(log).read())  # rank 0's bar: set-up done
        while not ready():
            assert time.monotonic() < deadline and launcher.poll() is None, open(log).read()
            time.sleep(0.02)
        family = _descendants(launcher.pid)
        launcher.send_signal(signal.SIGTERM)
        start = time.monotonic()
        launcher.wait(timeout=60)
        took = time.monotonic() - start
    finally:
        if launcher.poll() is None:
            launcher.kill()
    err = open(log).read()
    assert launcher.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.rstrip().endswith("pyg-dist predict: interrupted (SIGTERM)"), err[-3000:]
    assert took < 15, took
    left = os.listdir(out) if os.path.isdir(out) else []
    assert "predictions.json" not in left and not any(f.endswith(".tmp") for f in left), left
    assert _gone_within(family, 10), "processes outlived the launcher"


def test_sigterm_during_a_long_set_up_stops_within_seconds(graph, tmp_path):
    r"""SIGTERM while the ranks build a 3,000-layer model (set-up takes tens
    of seconds, its first epoch a minute): there is no epoch to finish, so
    they stop at once, and the launcher's one line names SIGTERM."""
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 2, root=root)
    launcher = subprocess.Popen(
        _cli("train", "--root", root, "--out", out, "--layers", "3000", "--hidden", "4",
             "--no-progress", "--no-plots", "--epochs", "2"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_quiet_env())
    try:
        deadline = time.monotonic() + 60
        while len(_ranks(launcher.pid)) < 2:
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.05)
        time.sleep(1.0)  # into the set-up
        family = _descendants(launcher.pid)
        launcher.send_signal(signal.SIGTERM)
        start = time.monotonic()
        _, err = launcher.communicate(timeout=120)
        took = time.monotonic() - start
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert not os.path.exists(os.path.join(out, "metrics.jsonl"))  # still in its set-up
    assert launcher.returncode == 130 and err.strip() == "pyg-dist train: interrupted (SIGTERM)", \
        err[-3000:]
    assert took < 15, took
    assert _gone_within(family, 10), "processes outlived the launcher"


@pytest.mark.parametrize("flags", [("--layers", "100000"), ("--hidden", "1000000")])
def test_a_model_larger_than_memory_is_refused_before_any_rank(graph, tmp_path, flags):
    r"""A model whose parameters or activations alone exceed this machine's
    memory is refused in one line with the estimate and the memory, before
    any rank starts (not after minutes of building and an OOM kill). The
    address space is capped, so that a regression fails here instead of
    exhausting the machine."""
    import resource
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    pyg_dist.partition_graph(graph, 2, root=root)
    cap = 8 << 30

    def capped():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    start = time.monotonic()
    done = subprocess.run(_cli("train", "--root", root, "--out", out, "--epochs", "1", *flags),
                          capture_output=True, text=True, env=_quiet_env(), timeout=120,
                          preexec_fn=capped)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    assert re.fullmatch(r"pyg-dist train: error: --layers [\d,]+ --hidden [\d,]+ \(sage\): "
                        r"training needs at least [\d.,]+ [GT]iB of memory on this machine, "
                        r"which has [\d.]+ GiB \(2 ranks x [\d,]+ parameters x 16 B .*\): use "
                        r"fewer --layers or a smaller --hidden", lines[0]), lines[0]
    assert time.monotonic() - start < 60 and not os.path.exists(out)


def test_no_free_port_is_one_line(graph, tmp_path):
    r"""Every ephemeral port taken (in a network namespace of the test's own,
    its range narrowed to two ports, both held): one line naming the range,
    not a traceback."""
    import shutil
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs root, unshare and ip (a network namespace of its own)")
    from tests.conftest import REPO
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(graph, 2, root=root)
    argv = _cli("train", "--root", root, "--epochs", "1", "--no-progress")
    code = (f"import sys; from tests.run.failure_workers import run_without_free_ports; "
            f"sys.exit(run_without_free_ports(40000, 40001, {argv!r}))")
    done = subprocess.run(["unshare", "--net", sys.executable, "-c", code], cwd=REPO,
                          capture_output=True, text=True, env=_quiet_env(), timeout=120)
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"cannot create a network namespace: {done.stderr.strip()}")
    assert done.returncode == 1 and done.stderr.strip() == (
        "pyg-dist train: error: no free TCP port on 127.0.0.1 for the ranks' rendezvous: "
        "ports 40000-40001 (net.ipv4.ip_local_port_range) are all taken (Address already in "
        "use); end what holds them or widen the range"), done.stderr[-3000:]
