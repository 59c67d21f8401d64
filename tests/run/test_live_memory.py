"""Live memory beside RSS: the peak of glibc malloc's bytes in
use, per rank and epoch, in metrics.jsonl and summary.json."""
import json
import os
import time

import pytest
import torch

from pyg_dist.utils.allocator import PeakSampler, malloc_in_use

glibc = pytest.mark.skipif(malloc_in_use() is None, reason="needs glibc's mallinfo2")
MiB = 2**20


@glibc
def test_sampler_sees_a_tensor_freed_between_reads():
    sampler = PeakSampler(interval=0.002)
    try:
        start = sampler.reset()
        x = torch.ones(16 * MiB)  # 64 MiB, freed before any explicit read
        time.sleep(0.05)  # the thread's reads
        del x
        assert sampler.peak - start >= 64 * MiB
        start = sampler.reset()  # a new window starts where memory is now
        assert sampler.peak == start and malloc_in_use() - start < 64 * MiB
    finally:
        sampler.close()


def _train(tmp_path, cli, num_nodes: int, epochs: int, hidden: int, *flags):
    r"""Rows and summary of ``pyg-dist train`` on 2 parts of a generated graph."""
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    cli("partition", "--num-nodes", str(num_nodes), "--num-parts", "2", "--root", root,
        "--data-dir", str(tmp_path / "data"))
    cli("train", "--root", root, "--out", out, "--epochs", str(epochs), "--hidden",
        str(hidden), "--no-progress", "--no-plots", *flags)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return rows, json.load(open(os.path.join(out, "summary.json")))


@glibc
def test_training_reports_live_memory_and_machine_code(tmp_path, cli):
    rows, summary = _train(tmp_path, cli, 2000, 2, 64)
    for row in rows:
        live, base = row["live_mem_per_rank"], row["baseline_live_mem_per_rank"]
        assert len(live) == len(base) == len(row["code_mem_per_rank"]) == 2
        # a step's activations and gradients: above the baseline on every rank
        assert all(p > b for p, b in zip(live, base))
        assert row["live_mem_bytes"] == max(live)
        assert row["code_mem_bytes"] == max(row["code_mem_per_rank"])
        # malloc's bytes are part of the process' resident memory
        assert all(p <= r for p, r in zip(live, row["peak_mem_per_rank"]))
    assert summary["live_mem_bytes"] == max(r["live_mem_bytes"] for r in rows)
    assert summary["baseline_live_mem_bytes"] == rows[-1]["baseline_live_mem_bytes"]
    assert summary["malloc_thread_cache"] is False  # the default's ranks start without it
    # read at an epoch's start: the first steps ran kernels the baseline had not
    assert all(now > first for now, first in zip(rows[1]["code_mem_per_rank"],
                                                 rows[0]["code_mem_per_rank"]))


def _torch_huge_pages_in_rank():
    from pyg_dist.utils.allocator import follow_live_memory
    return follow_live_memory()


@glibc
@pytest.mark.parametrize("launcher_set", [True, False])
def test_compact_malloc_gives_torch_huge_pages_when_set_before_torch(monkeypatch,
                                                                     launcher_set):
    import pyg_dist
    from pyg_dist.utils import hugepages
    from pyg_dist.utils.allocator import THP_ENV
    if launcher_set:  # as run_training sets it for --malloc compact (restored after)
        monkeypatch.setenv(THP_ENV, "1")
    else:  # a rank whose torch allocated its first large buffer before the setting
        monkeypatch.delenv(THP_ENV, raising=False)
    huge = pyg_dist.spawn(_torch_huge_pages_in_rank, 1, timeout=60)[0]
    assert huge == (launcher_set and hugepages._MADVISE is not None)


@glibc
def test_compact_malloc_keeps_resident_memory_near_live_memory(tmp_path, cli, monkeypatch):
    from pyg_dist.utils.allocator import THP_ENV
    monkeypatch.delenv(THP_ENV, raising=False)
    rows, summary = _train(tmp_path, cli, 3000, 3, 128, "--malloc", "compact")
    assert THP_ENV not in os.environ  # set for the ranks only
    assert summary["config"]["malloc"] == "compact"
    for row in rows[1:]:
        for rank in range(2):
            resident = (row["peak_mem_per_rank"][rank] - row["baseline_mem_per_rank"][rank]
                        - row["code_mem_per_rank"][rank])
            live = row["live_mem_per_rank"][rank] - row["baseline_live_mem_per_rank"][rank]
            assert resident <= 1.5 * live, (row["epoch"], rank, resident / MiB, live / MiB)


_FREED_STAYS = """
import sys, torch
from pyg_dist.metrics import current_memory_bytes
from pyg_dist.utils.allocator import reuse_freed_memory
if sys.argv[1] == "reuse":
    assert reuse_freed_memory() is True
buffers = [torch.ones(5 * 2**20) for _ in range(3)]  # 3 x 20 MiB, touched
before = current_memory_bytes()
del buffers
print((before - current_memory_bytes()) / 2**20)
"""


@glibc
@pytest.mark.parametrize("mode", ["reuse", "system"])
def test_reuse_mode_keeps_freed_buffers_for_the_next_step(mode):
    import subprocess
    import sys
    returned = float(subprocess.run([sys.executable, "-c", _FREED_STAYS, mode], check=True,
                                    capture_output=True, text=True).stdout)
    if mode == "reuse":  # in the heap, whose top is not trimmed: nothing to fault in again
        assert returned < 5, returned
    else:  # glibc's defaults map them alone and unmap them
        assert returned > 50, returned


def test_training_reuses_freed_memory_by_default():
    from pyg_dist.config import TrainConfig
    assert TrainConfig().malloc == "reuse"


def test_unknown_malloc_mode_is_refused():
    from pyg_dist.config import TrainConfig
    with pytest.raises(ValueError, match="malloc must be one of reuse, system, compact"):
        TrainConfig(malloc="jemalloc").validate()


@pytest.mark.parametrize("device, released, peak, expected", [
    ("cpu", (500, 380), 520, False),  # all 120 released pages faulted back in
    ("cpu", (500, 380), 450, False),  # 70 of 120 faulted back in
    ("cpu", (500, 380), 420, True),  # 40 of 120 faulted back in: it paid
    ("cpu", (500, 500), 600, True),  # nothing released, nothing to fault
    ("cpu", None, 300, False),  # no release this epoch: none until an evaluation
    ("cuda", (500, 380), 520, True),  # the peak is the GPU's: host pages unknown
])
def test_free_pages_released_while_the_steps_leave_them_out(device, released, peak, expected):
    from types import SimpleNamespace

    from pyg_dist.train import _Run
    run = SimpleNamespace(device=torch.device(device), epochs_released=2)
    assert _Run._releases_next(run, released, peak) is expected
    # after the first epoch's release, always once more (its one-off buffers)
    run.epochs_released = 1
    assert _Run._releases_next(run, released, peak) is (released is not None)


_ISLAND = """
import ctypes
from pyg_dist.utils.allocator import _LIBC as libc, reuse_freed_memory
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t, )
libc.free.argtypes = (ctypes.c_void_p, )
libc.malloc_usable_size.restype = ctypes.c_size_t
libc.malloc_usable_size.argtypes = (ctypes.c_void_p, )
assert reuse_freed_memory()  # chunks from the heap, its top kept
big = 8 * 2**20
a = libc.malloc(big)
after = lambda p: p + libc.malloc_usable_size(p) + 8  # the next chunk's user pointer
small = libc.malloc(1000)
while small != after(a):  # until one comes from the top, right after a
    small = libc.malloc(1000)  # (the others stay allocated)
b = libc.malloc(big)
fence = libc.malloc(1000)  # keeps b off the heap's top
assert b == after(small) and fence == after(b)
for chunk in (a, small, b):
    libc.free(chunk)
before = libc.mallinfo2().arena
both = libc.malloc(2 * big)  # fits where a, small and b were, if they merged
print((libc.mallinfo2().arena - before) / 2**20)
"""


@glibc
@pytest.mark.parametrize("cache", [True, False])
def test_without_the_thread_cache_freed_neighbours_merge(cache):
    # A small chunk freed between two freed buffers stays in glibc's
    # per-thread cache, counted in use: the buffers do not merge and a
    # request for both grows the heap. With the cache off it merges.
    import subprocess
    import sys
    from pyg_dist.utils.allocator import rank_environment
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if not cache:
        env.update(rank_environment("reuse", env))
    grown = float(subprocess.run([sys.executable, "-c", _ISLAND], env=env, check=True,
                                 capture_output=True, text=True).stdout)
    if cache:
        assert grown >= 16, grown
    else:
        assert grown == 0, grown


def test_rank_environment_adds_to_what_the_user_set():
    from pyg_dist.utils.allocator import NO_THREAD_CACHE, THP_ENV, rank_environment
    assert rank_environment("reuse", {}) == {"GLIBC_TUNABLES": NO_THREAD_CACHE}
    assert rank_environment("system", {}) == {}
    assert rank_environment("compact", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:" + NO_THREAD_CACHE, THP_ENV: "1"}
    mine = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=3", THP_ENV: "0"}
    assert rank_environment("compact", mine) == {}  # the user's values are kept


def _rank_thread_cache():
    from pyg_dist.utils.allocator import thread_cache_on
    return thread_cache_on()


@glibc
@pytest.mark.parametrize("malloc", ["reuse", "system"])
def test_spawned_ranks_start_with_their_mode_s_environment(monkeypatch, malloc):
    import pyg_dist
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    on = pyg_dist.spawn(_rank_thread_cache, 2, timeout=60, malloc=malloc)
    assert on == [malloc == "system"] * 2
    assert "GLIBC_TUNABLES" not in os.environ  # set for the ranks only
