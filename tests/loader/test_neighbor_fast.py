"""The neighbour loader's fast paths compute what the plain ones do: the
dense first-occurrence table, 32-bit edge sort keys, packed integer
replies of the feature store, and the background worker training uses by
default."""
import json

import pytest
import torch

import pyg_dist
from pyg_dist.config import TrainConfig, upgrade
from pyg_dist.loader.neighbor.sampler import (_append_new, _append_new_dense,
                                              _append_new_sorted)
from pyg_dist.train import load_model
from tests.loader.neighbor_fast_workers import (dense_and_sorted_batches, pulled_rows,
                                                train_run)


def test_dense_first_occurrences_equal_the_sort():
    gen = torch.Generator().manual_seed(0)
    for _ in range(400):
        span = int(torch.randint(1, 60, (1, ), generator=gen))
        offset = int(torch.randint(0, 1000, (1, ), generator=gen))
        known = int(torch.randint(0, span + 1, (1, ), generator=gen))
        node = torch.randperm(span, generator=gen)[:known] + offset
        candidates = torch.randint(0, span, (int(torch.randint(0, 80, (1, ), generator=gen)), ),
                                   generator=gen) + offset
        both = torch.cat([node, candidates])
        if both.numel() == 0:
            continue
        low = int(both.min())
        dense = _append_new_dense(node, both, low, int(both.max()) - low + 1)
        plain = _append_new_sorted(node, both)
        assert torch.equal(dense[0], plain[0]) and torch.equal(dense[1], plain[1])
        full, position = _append_new(node, candidates)
        assert torch.equal(full[position], candidates)  # every candidate where it landed
        assert torch.equal(full[:known], node) and full.unique().numel() == full.numel()
    empty = torch.empty(0, dtype=torch.long)
    assert [t.numel() for t in _append_new(empty, empty)] == [0, 0]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from tests.conftest import small_graph
    graph = small_graph()
    root = str(tmp_path_factory.mktemp("neighbor_fast"))
    pyg_dist.partition_graph(graph, 2, root=root)
    return graph, root


def test_dense_table_batches_equal_sorted_batches(parts):
    graph, root = parts
    for result in pyg_dist.spawn(dense_and_sorted_batches, 2, (root, ), timeout=120):
        assert len(result["dense"]) == len(result["sorted"]) > 0
        for a, b in zip(result["dense"], result["sorted"]):
            for key in ("n_id", "global_id", "edge_index", "x", "y"):
                assert torch.equal(a[key], b[key]), key
            assert a["num_sampled_nodes"] == b["num_sampled_nodes"]
            # the edges in (node, neighbour) order, as a 64-bit key sorts them
            row, col = a["edge_index"]
            key = col * a["n_id"].numel() + row
            assert torch.equal(key, key.sort().values)
            assert torch.equal(a["x"], graph.x[a["n_id"]])


@pytest.mark.parametrize("label_kind", ["long", "long2", "float"])
def test_packed_replies_pull_the_owners_rows(parts, label_kind):
    graph, root = parts
    y = {"long": graph.y, "long2": torch.stack([graph.y, graph.y * 10, -graph.y], dim=1),
         "float": graph.y.float() / 7}[label_kind]
    for rank, result in enumerate(pyg_dist.spawn(pulled_rows, 2, (root, label_kind),
                                                 timeout=120)):
        rows = result["rows"]
        n_id = rows["n_id"]  # original ids of the relabelled ones asked for
        assert n_id.numel() == result["ids"].numel()
        assert torch.equal(rows["x"], graph.x[n_id])
        assert rows["y"].dtype == y.dtype and torch.equal(rows["y"], y[n_id])
        assert result["empty"] == {"x": (0, graph.num_features), "y": (0, ) + y.shape[1:],
                                   "n_id": (0, )}
        assert result["recv"] > 0


def test_default_training_samples_in_the_background_with_the_same_results(parts, tmp_path):
    r"""``train()`` with the neighbour loader's defaults (one background
    worker) ends with the parameters and losses of sampling in the loop,
    bit for bit."""
    _, root = parts
    runs = {}
    for name, extra in (("default", {}), ("loop", {"workers": 0})):
        config = TrainConfig(model="sage", num_layers=2, hidden=16, epochs=3, progress=False,
                             loader="neighbor",
                             loader_args={"fanout": [4, 3], "batch_size": 16, **extra})
        out = str(tmp_path / name)
        summary = pyg_dist.spawn(train_run, 2, (root, config, out), timeout=180)[0]
        rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
        runs[name] = (summary, rows, load_model(out).state_dict())
    (summary, rows, state), (_, loop_rows, loop_state) = runs["default"], runs["loop"]
    assert [r["loss"] for r in rows] == [r["loss"] for r in loop_rows]
    assert state.keys() == loop_state.keys()
    assert all(torch.equal(state[k], loop_state[k]) for k in state)
    assert all(r["in_flight"] >= 1 for r in rows)  # the pool's depth: it sampled ahead
    assert all(r["in_flight"] == 0 for r in loop_rows)
    assert summary["config"]["sampler_workers"] == 1  # the legacy field: the value in effect


def test_old_files_keep_their_workers():
    r"""A file of the release that wrote only the legacy fields: its default
    (0 workers) is dropped, any other value is kept."""
    old = {**TrainConfig(loader="neighbor").to_dict(), "sampler_workers": 2}
    del old["loader_args"]
    assert upgrade(old)["loader_args"]["workers"] == 2
    old["sampler_workers"] = 0
    assert "workers" not in upgrade(old)["loader_args"]
    assert TrainConfig(loader="neighbor").to_dict()["sampler_workers"] == 1
