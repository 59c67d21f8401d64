"""Live memory beside RSS (issue 35): the peak of glibc malloc's bytes in
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


@glibc
def test_training_reports_live_memory(tmp_path, cli):
    root, out = str(tmp_path / "parts"), str(tmp_path / "run")
    cli("partition", "--num-nodes", "2000", "--num-parts", "2", "--root", root,
        "--data-dir", str(tmp_path / "data"))
    cli("train", "--root", root, "--out", out, "--epochs", "2", "--hidden", "64",
        "--no-progress", "--no-plots")
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    for row in rows:
        live, base = row["live_mem_per_rank"], row["baseline_live_mem_per_rank"]
        assert len(live) == len(base) == 2
        # a step's activations and gradients: above the baseline on every rank
        assert all(p > b for p, b in zip(live, base))
        assert row["live_mem_bytes"] == max(live)
        # malloc's bytes are part of the process' resident memory
        assert all(p <= r for p, r in zip(live, row["peak_mem_per_rank"]))
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["live_mem_bytes"] == max(r["live_mem_bytes"] for r in rows)
    assert summary["baseline_live_mem_bytes"] == rows[-1]["baseline_live_mem_bytes"]
