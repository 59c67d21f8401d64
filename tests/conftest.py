import os
import os.path as osp

import pytest
import torch

from pyg_dist.datasets import synthetic_communities

#: The repository's root folder.
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def small_graph(num_nodes: int = 240, seed: int = 0, directed: bool = False):
    r"""A small community graph with masks; optionally made directed by
    dropping one direction of a third of the edges."""
    data = synthetic_communities(num_nodes=num_nodes, num_classes=5, num_features=12,
                                 num_communities=8, avg_degree=8, seed=seed)
    if directed:
        gen = torch.Generator().manual_seed(seed)
        keep = torch.rand(data.num_edges, generator=gen) > 0.33
        data.edge_index = data.edge_index[:, keep]
    return data


def flip_bytes(path: str, offset: int, count: int = 8) -> None:
    r"""Inverts :obj:`count` bytes of the file at :obj:`offset` (damage)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(count)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


# Files whose tests run whole programs in fresh interpreters (10-60 s each),
# the longest first.
LONG = ("notebooks/", "tests/test_benchmarks.py", "tests/run/test_failures.py",
        "tests/run/test_notebook.py", "tests/run/test_multinode.py", "tests/run/test_cli.py")


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two workers share the cores: a worker's own tensor operations (the
        # single-process references) run on one thread, so neither waits in an
        # OpenMP barrier for a core the other worker holds. Ranks set their own.
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    r"""Under ``-n N --dist worksteal`` (``make test``), xdist hands worker
    :math:`w` the :math:`w`-th of :math:`N` consecutive, equal shares of the
    collection and later moves tests from the end of one worker's queue to
    another's. So the long tests are dealt out in turn to the starts of the
    shares: every worker begins with its part of them, and none is left
    running them after the others ran out of short ones."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))  # set in xdist's workers
    if workers < 2:
        return
    def rank(item) -> int:
        return next(i for i, prefix in enumerate(LONG) if item.nodeid.startswith(prefix))
    long = sorted((item for item in items if item.nodeid.startswith(LONG)), key=rank)
    short = [item for item in items if not item.nodeid.startswith(LONG)]
    ordered = []
    for w in range(workers):
        share = (len(items) - len(ordered)) // (workers - w)  # as xdist cuts the shares
        dealt = long[w::workers]
        ordered += dealt + short[:share - len(dealt)]
        del short[:share - len(dealt)]
    items[:] = ordered + short


@pytest.fixture(autouse=True)
def no_leftover_process_group():
    r"""Tests that join a world of one in this process leave none behind."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="session")
def graph():
    return small_graph()


@pytest.fixture(scope="session")
def directed_graph():
    return small_graph(directed=True, seed=1)
