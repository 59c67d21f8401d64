"""Partitioning: determinism, balance, halo statistics, files and bad input."""
import json
import os
import os.path as osp

import pytest
import torch

import pyg_dist
from pyg_dist import DistData, PartitionBook, partition_graph
from tests.conftest import small_graph


def test_deterministic_for_a_seed(graph, tmp_path):
    a = partition_graph(graph, 3, seed=7)
    b = partition_graph(graph, 3, seed=7)
    assert torch.equal(a.perm, b.perm) and torch.equal(a.partptr, b.partptr)
    partition_graph(graph, 3, seed=7, root=str(tmp_path / "a"))
    partition_graph(graph, 3, seed=7, root=str(tmp_path / "b"))
    for r in range(3):
        pa = DistData.load(str(tmp_path / "a"), r, world_size=3)
        pb = DistData.load(str(tmp_path / "b"), r, world_size=3)
        assert torch.equal(pa.edge_index, pb.edge_index) and torch.equal(pa.n_id, pb.n_id)


def test_masks_balanced_within_metis_tolerance():
    data = small_graph(num_nodes=4000)
    data.train_mask = data.train_mask & (data.community < 2)  # clustered labels
    plain = partition_graph(data, 4, balance=())
    train = torch.tensor([s["num_train"] for s in plain.stats], dtype=torch.float)
    assert train.max() > 1.5 * train.mean()  # METIS alone: very uneven
    book = partition_graph(data, 4)
    for key in ("num_train", "num_val", "num_test"):
        counts = torch.tensor([s[key] for s in book.stats], dtype=torch.float)
        # METIS' default imbalance tolerance: 3% (ufactor 30), rounded up.
        assert counts.max() <= torch.ceil(1.03 * counts.mean()) + 1, (key, counts)
    inner = torch.tensor([s["num_inner"] for s in book.stats], dtype=torch.float)
    assert inner.max() <= 1.1 * inner.mean()


def _brute_force_halo(data, assignment, r):
    halo = set()
    for s, d in data.edge_index.t().tolist():
        if assignment[d] == r and assignment[s] != r:
            halo.add(s)
    return halo


@pytest.mark.parametrize("method", ["metis", "random"])
def test_halo_statistics_equal_brute_force(graph, tmp_path, method):
    root = str(tmp_path)
    book = partition_graph(graph, 3, method=method, root=root)
    assignment = book.owner(book.inv_perm).tolist()  # original id -> part
    volume = 0
    for r in range(3):
        part = DistData.load(root, r, world_size=3)
        halo = _brute_force_halo(graph, assignment, r)
        assert part.num_halo == book.stats[r]["num_halo"] == len(halo)
        assert set(part.n_id[part.num_inner:].tolist()) == halo
        assert set(part.n_id[:part.num_inner].tolist()) == {
            i for i, p in enumerate(assignment) if p == r}
        # every in-edge of an inner node is present, with correct endpoints
        src, dst = part.n_id[part.edge_index[0]], part.n_id[part.edge_index[1]]
        local = {(s, d) for s, d in zip(src.tolist(), dst.tolist())}
        expect = {(s, d) for s, d in graph.edge_index.t().tolist() if assignment[d] == r}
        assert local == expect
        # halo rows are grouped by owner, matching the receive counts
        assert torch.equal(part.halo_owner, part.halo_owner.sort().values)
        assert part.recv_counts.tolist() == torch.bincount(part.halo_owner, minlength=3).tolist()
        assert torch.equal(part.deg_in, torch.bincount(graph.edge_index[1],
                                                       minlength=graph.num_nodes)[part.n_id])
        volume += len(halo)
    cut = sum(assignment[s] != assignment[d] for s, d in graph.edge_index.t().tolist())
    assert book.meta["comm_volume"] == volume and book.meta["edge_cut"] == cut
    # what r sends to q is exactly q's halo owned by r, in q's halo order
    parts = [DistData.load(root, r, world_size=3) for r in range(3)]
    for r, p in enumerate(parts):
        sends = p.send_index.split(p.send_counts.tolist())
        for q, idx in enumerate(sends):
            received = parts[q].global_id[parts[q].num_inner:][parts[q].halo_owner == r]
            assert torch.equal(p.global_id[idx], received)


def test_metis_beats_random_on_communities():
    data = small_graph(num_nodes=2000)
    metis = partition_graph(data, 4, objective="vol")
    cut = partition_graph(data, 4, objective="cut")
    rand = partition_graph(data, 4, method="random")
    assert metis.meta["comm_volume"] < 0.5 * rand.meta["comm_volume"]
    assert cut.meta["edge_cut"] < 0.5 * rand.meta["edge_cut"]


def test_meta_and_book_round_trip(graph, tmp_path):
    book = partition_graph(graph, 2, root=str(tmp_path))
    loaded = PartitionBook.load(str(tmp_path))
    assert torch.equal(loaded.perm, book.perm) and loaded.meta == json.loads(
        json.dumps(book.meta))
    assert "edge_cut" in book.summary()


def test_edge_attributes_follow_their_edges(tmp_path):
    data = small_graph()
    data.edge_weight = torch.rand(data.num_edges)
    partition_graph(data, 2, root=str(tmp_path))
    lookup = {(s, d): w for (s, d), w in zip(data.edge_index.t().tolist(),
                                             data.edge_weight.tolist())}
    for r in range(2):
        part = DistData.load(str(tmp_path), r, world_size=2)
        src, dst = part.n_id[part.edge_index[0]], part.n_id[part.edge_index[1]]
        for s, d, w in zip(src.tolist(), dst.tolist(), part.edge_weight.tolist()):
            assert lookup[s, d] == w


@pytest.mark.parametrize("kwargs,message", [
    ({"num_parts": 0}, "num_parts must be a positive integer"),
    ({"num_parts": 10_000}, "exceeds the number of nodes"),
    ({"num_parts": 2, "method": "spectral"}, "Unknown partition method"),
    ({"num_parts": 2, "objective": "edges"}, "Unknown METIS objective"),
    ({"num_parts": 2, "balance": ("train_mask", "holdout_mask")}, "holdout_mask"),
])
def test_bad_input(graph, kwargs, message):
    with pytest.raises(ValueError, match=message):
        partition_graph(graph, **kwargs)


def test_edge_index_out_of_range():
    data = small_graph()
    data.edge_index = data.edge_index.clone()
    data.edge_index[0, 0] = data.num_nodes + 5
    with pytest.raises(ValueError, match="outside"):
        partition_graph(data, 2)


def test_load_refuses_mismatches(graph, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    partition_graph(graph, 2, root=a)
    partition_graph(small_graph(seed=5), 2, root=b)
    with pytest.raises(RuntimeError, match="holds 2 partitions but the world size is 3"):
        DistData.load(a, 0, world_size=3)
    with pytest.raises(FileNotFoundError, match="meta.json"):
        DistData.load(str(tmp_path / "nothing"), 0, world_size=2)
    # a part file of another graph
    import shutil
    shutil.copy(osp.join(b, "part_1.pt"), osp.join(a, "part_1.pt"))
    with pytest.raises(RuntimeError, match="graph_hash"):
        DistData.load(a, 1, world_size=2)
    # missing and truncated files
    shutil.copy(osp.join(b, "part_0.pt"), osp.join(tmp_path, "keep.pt"))
    osp.exists(osp.join(b, "part_0.pt")) and __import__("os").remove(osp.join(b, "part_0.pt"))
    with pytest.raises(FileNotFoundError, match="part_0.pt"):
        DistData.load(b, 0, world_size=2)
    with open(osp.join(b, "part_1.pt"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(RuntimeError, match="corrupt, truncated"):
        DistData.load(b, 1, world_size=2)
    meta = json.load(open(osp.join(a, "meta.json")))
    meta["format_version"] = 99
    json.dump(meta, open(osp.join(a, "meta.json"), "w"))
    with pytest.raises(RuntimeError, match="format version 99"):
        DistData.load(a, 0, world_size=2)


def test_distribute_needs_matching_group(graph, tmp_path):
    partition_graph(graph, 2, root=str(tmp_path))
    part = DistData.load(str(tmp_path), 0, world_size=2)
    from torch_geometric.nn import GraphSAGE
    with pytest.raises(RuntimeError, match="2 parts but the process group has 1"):
        pyg_dist.nn.distribute(GraphSAGE(part.num_features, 8, 2, 3), part)


def test_adjacency_has_64bit_indices(graph, tmp_path):
    r"""int32 CSR indices gave wrong mean-aggregation gradients on large
    partitions (torch 2.13, CPU); keep them 64-bit."""
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    adj_t = pyg_dist.DistData.load(str(tmp_path), 0, world_size=2).adj_t
    assert adj_t.crow_indices().dtype == adj_t.col_indices().dtype == torch.long


def test_a_new_partition_replaces_the_old_one_whole(tmp_path, capsys):
    from pyg_dist.cli import main
    root = tmp_path / "parts"
    common = ["partition", "--num-nodes", "300", "--data-dir", str(tmp_path / "data"),
              "--root", str(root)]
    main([*common, "--num-parts", "3", "--num-batches", "2", "--balance-batches"])
    assert f"cohesive batches to {root / 'batches.pt'}:" in capsys.readouterr().out
    (root / "notes.txt").write_text("mine")
    assert {"batches.pt", "batch_parts", "part_2.pt"} <= set(os.listdir(root))
    # Fewer parts and no batches: what belonged to the old partition goes with
    # it (nothing describes it any more), the user's files stay.
    main([*common, "--num-parts", "2"])
    assert sorted(os.listdir(root)) == ["book.pt", "meta.json", "notes.txt", "part_0.pt",
                                        "part_1.pt"]
    assert PartitionBook.load(str(root)).num_parts == 2
    assert "cohesive batches" not in capsys.readouterr().out
