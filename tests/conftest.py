import os
import os.path as osp

import pytest
import torch

from pyg_dist.datasets import synthetic_communities
from pyg_dist.distributed import FORKSERVER_IGNORES_ENV

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
# the longest first: `make test` runs the suite on three workers (pytest-xdist),
# and starting these first keeps a worker from ending alone on one of them.
LONGEST_FIRST = ("notebooks/", "tests/test_benchmarks.py", "tests/run/test_failures.py",
                 "tests/run/test_notebook.py", "tests/run/test_multinode.py",
                 "tests/run/test_cli.py")


def pytest_configure(config):
    # pytest sets PYTEST_CURRENT_TEST anew for each test and no library reads
    # it: its change need not make spawn() replace its forkserver (a new one
    # imports torch and PyG again, seconds for every test that spawns ranks).
    ignored = os.environ.get(FORKSERVER_IGNORES_ENV)
    os.environ[FORKSERVER_IGNORES_ENV] = ",".join(filter(None, (ignored, "PYTEST_CURRENT_TEST")))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Workers share the cores: a worker's own tensor operations (the
        # single-process references) run on one thread, so none waits in an
        # OpenMP barrier for a core another worker holds. Ranks set their own.
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, p in enumerate(LONGEST_FIRST) if path.startswith(p)),
                    len(LONGEST_FIRST))
    items.sort(key=rank)  # stable: each file keeps its order


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
