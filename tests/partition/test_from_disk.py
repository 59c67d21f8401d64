"""Out-of-core partitioning of a graph folder: parts equal the in-memory
path's for the same assignment, bad files are refused in one line, and a
run that is killed, interrupted or finds the disk full leaves the partition
already in its root whole."""
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from pyg_dist import DistData
from pyg_dist.config import TrainConfig
from pyg_dist.integrity import CorruptFileError
from pyg_dist.partition import PartitionBook, partition_graph
from pyg_dist.partition.from_disk import partition_folder
from pyg_dist.utils.npy import GraphFileError
from tests.conftest import flip_bytes, small_graph

MASKS = ("train_mask", "val_mask", "test_mask")


def write_folder(data, folder, edge_dtype=np.int64, x_dtype=np.float32):
    r"""``data`` as a graph folder of ``.npy`` files."""
    os.makedirs(folder, exist_ok=True)
    np.save(osp.join(folder, "src.npy"), data.edge_index[0].numpy().astype(edge_dtype))
    np.save(osp.join(folder, "dst.npy"), data.edge_index[1].numpy().astype(edge_dtype))
    np.save(osp.join(folder, "x.npy"), data.x.numpy().astype(x_dtype))
    np.save(osp.join(folder, "y.npy"), data.y.numpy())
    for key in MASKS:
        np.save(osp.join(folder, f"{key}.npy"), data[key].numpy())
    return folder


def assert_same_parts(root_a, root_b, num_parts):
    book_a, book_b = PartitionBook.load(root_a), PartitionBook.load(root_b)
    assert torch.equal(book_a.perm, book_b.perm) and torch.equal(book_a.partptr, book_b.partptr)
    for key in ("graph_hash", "partitioning_id", "edge_cut", "comm_volume", "num_edges",
                "num_classes", "num_train", "parts"):
        assert book_a.meta[key] == book_b.meta[key], key
    for r in range(num_parts):
        a, b = DistData.load(root_a, r), DistData.load(root_b, r)
        assert sorted(a.keys()) == sorted(b.keys())
        for key in a.keys():
            if key == "adj_t":  # built from edge_index at load
                continue
            if isinstance(a[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


def test_partitioner_input_is_the_symmetric_graph_in_32_bit_ids(tmp_path):
    kaminpar = pytest.importorskip("kaminpar")
    from pyg_dist.partition.metis import symmetric_csr
    from pyg_dist.partition.parhip import read_csr, write_symmetric
    n = 300
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, n, (2, 2000), generator=gen)
    edge_index[:, :50] = edge_index[:, 50:100]  # duplicates; self-loops occur by chance
    chunks = lambda: ((e[0].numpy(), e[1].numpy()) for e in edge_index.split(300, 1))
    path = str(tmp_path / "graph.parhip")
    write_symmetric(chunks, n, edge_index.size(1), path, str(tmp_path), bucket_entries=500)
    rowptr, col = symmetric_csr(edge_index, n)
    assert int(np.fromfile(path, dtype="<u8", count=1)[0]) == 11  # 32-bit neighbour ids
    file_rowptr, file_col = read_csr(path)
    assert np.array_equal(file_rowptr, rowptr.numpy())
    assert file_col.dtype == np.uint32 and np.array_equal(file_col, col.numpy())
    graph = kaminpar.load_graph(path, kaminpar.GraphFileFormat.PARHIP, compress=True)
    assert (graph.n(), graph.m()) == (n, col.numel())
    for u in (0, 17, n - 1):
        assert sorted(v for v, _ in graph.neighbors(u)) == col[rowptr[u]:rowptr[u + 1]].tolist()


@pytest.mark.parametrize("method", ["random", "metis"])
@pytest.mark.parametrize("directed", [False, True])
def test_parts_equal_the_in_memory_path(tmp_path, method, directed):
    data = small_graph(directed=directed, seed=3)
    del data.community  # a graph folder holds x, y and the masks only
    folder = write_folder(data, tmp_path / "graph", edge_dtype=np.int32)
    partition_graph(data, 3, method=method, root=str(tmp_path / "memory"), seed=5)
    # Tiny chunks and buckets: every streaming pass runs over several pieces.
    partition_folder(str(folder), 3, str(tmp_path / "disk"), method=method, seed=5,
                     chunk_edges=97, bucket_entries=150)
    assert_same_parts(tmp_path / "memory", tmp_path / "disk", 3)


def test_features_and_edges_are_mapped_and_checked(tmp_path):
    data = small_graph(seed=4)
    folder = write_folder(data, tmp_path / "graph", x_dtype=np.float16)
    partition_graph(str(folder), 2, method="random", root=str(tmp_path / "parts"))
    part = DistData.load(str(tmp_path / "parts"), 1)
    assert part.x.dtype == torch.float16
    with open("/proc/self/maps") as maps:  # the rows stay in the files, mapped
        mapped = maps.read()
    for name in ("part_1_x.npy", "part_1_edge_index.npy"):
        assert str(tmp_path / "parts" / name) in mapped
    torch.testing.assert_close(part.x, data.x.half()[part.n_id[:part.num_inner]])
    del part
    for name in ("part_1_x.npy", "part_1_edge_index.npy"):
        good = (tmp_path / "parts" / name).read_bytes()
        flip_bytes(str(tmp_path / "parts" / name), 300)
        with pytest.raises(CorruptFileError, match=name):
            DistData.load(str(tmp_path / "parts"), 1)
        (tmp_path / "parts" / name).write_bytes(good)


def test_kaminpar_balances_and_cuts_less_than_random(tmp_path):
    data = small_graph(num_nodes=600, seed=2)
    folder = write_folder(data, tmp_path / "graph")
    book = partition_graph(str(folder), 4, root=str(tmp_path / "kaminpar"), balance=())
    assert book.meta["method"] == "kaminpar"
    sizes = book.partptr.diff()
    assert int(sizes.max()) <= int(np.ceil(1.03 * 600 / 4))
    rand = partition_graph(str(folder), 4, method="random", root=str(tmp_path / "random"))
    assert book.meta["edge_cut"] < 0.5 * rand.meta["edge_cut"]
    with_masks = partition_graph(data, 4, method="kaminpar")  # in memory, masks balanced
    for stat in with_masks.stats:
        for key in MASKS:
            total = int(data[key].sum())
            assert stat[f"num_{key.split('_')[0]}"] <= int(np.ceil(1.03 * total / 4))


def test_kaminpar_reads_a_sample_above_its_degree_budget(tmp_path):
    data = small_graph(num_nodes=600, seed=2)
    folder = write_folder(data, tmp_path / "graph")
    book = partition_folder(str(folder), 4, str(tmp_path / "sampled"), balance=(),
                            partitioner_degree=3.0)
    read = book.meta["partitioner_input"]
    assert read["refined"] and 0.2 < read["keep_probability"] < 0.6
    assert int(book.partptr.diff().max()) <= int(np.ceil(1.03 * 600 / 4))
    full = partition_folder(str(folder), 4, str(tmp_path / "full"), balance=(),
                            partitioner_degree=None)
    assert full.meta["partitioner_input"]["keep_probability"] == 1.0
    rand = partition_folder(str(folder), 4, str(tmp_path / "random"), method="random")
    assert book.meta["edge_cut"] < 0.5 * rand.meta["edge_cut"]
    for seed in (-1, 5):  # any seed hashes (uint64 arithmetic wraps silently)
        partition_folder(str(folder), 4, str(tmp_path / f"seed{seed}"), balance=(),
                         partitioner_degree=3.0, seed=seed)
    with pytest.raises(ValueError, match="partitioner_degree must be positive"):
        partition_folder(str(folder), 4, str(tmp_path / "bad"), partitioner_degree=0)


def test_sampled_partitioner_input_keeps_both_directions_at_the_rate(tmp_path):
    from pyg_dist.partition.metis import symmetric_csr
    from pyg_dist.partition.parhip import read_csr, write_csr, write_sampled
    n = 2000
    edge_index = torch.randint(0, n, (2, 30000), generator=torch.Generator().manual_seed(1))
    rowptr, col = symmetric_csr(edge_index, n)
    write_csr(rowptr.numpy(), col.numpy(), str(tmp_path / "full"))
    kept = write_sampled(str(tmp_path / "full"), str(tmp_path / "a"), 0.3, seed=0,
                         chunk_entries=5000)
    sample_rowptr, sample_col = read_csr(str(tmp_path / "a"))
    src = np.repeat(np.arange(n), np.diff(sample_rowptr))
    pairs = set(zip(src.tolist(), sample_col.tolist()))
    assert kept == len(pairs) == sample_col.size
    assert all((v, u) in pairs for u, v in pairs)  # both directions or neither
    assert pairs <= set(zip(np.repeat(np.arange(n), np.diff(rowptr.numpy())).tolist(),
                            col.tolist()))
    undirected = col.numel() / 2  # kept ~ Binomial(undirected, 0.3): within 5 sigma
    assert abs(kept / 2 - 0.3 * undirected) < 5 * (undirected * 0.3 * 0.7) ** 0.5
    write_sampled(str(tmp_path / "full"), str(tmp_path / "b"), 0.3, seed=0)
    write_sampled(str(tmp_path / "full"), str(tmp_path / "c"), 0.3, seed=1)
    same = (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    assert same and (tmp_path / "a").read_bytes() != (tmp_path / "c").read_bytes()


def test_refinement_cuts_less_within_the_balance(tmp_path):
    from pyg_dist.partition.metis import random_assignment, symmetric_csr
    from pyg_dist.partition.parhip import write_csr
    from pyg_dist.partition.refine import refine
    data = small_graph(num_nodes=2000, seed=3)
    rowptr, col = symmetric_csr(data.edge_index, data.num_nodes)
    write_csr(rowptr.numpy(), col.numpy(), str(tmp_path / "g"))
    part = random_assignment(data.num_nodes, 4, seed=0).numpy()
    src, dst = np.repeat(np.arange(data.num_nodes), np.diff(rowptr.numpy())), col.numpy()
    before = int((part[src] != part[dst]).sum())
    refine(str(tmp_path / "g"), part, 4, rounds=10, chunk_entries=3000)
    after = int((part[src] != part[dst]).sum())
    assert after < 0.65 * before  # from a random start (the hard case)
    assert np.bincount(part, minlength=4).max() <= int(np.ceil(1.03 * data.num_nodes / 4))


def _refusal(folder, match, tmp_path):
    root = tmp_path / "out"
    with pytest.raises(GraphFileError, match=match) as info:
        partition_graph(str(folder), 2, method="random", root=str(root))
    assert "\n" not in str(info.value)
    assert not osp.exists(root / "meta.json")


def test_bad_files_are_refused_in_one_line(tmp_path):
    data = small_graph(seed=1)
    folder = write_folder(data, tmp_path / "graph")
    src = folder / "src.npy"
    good = src.read_bytes()
    src.write_bytes(good[:-40])  # truncated
    _refusal(folder, "src.npy' is truncated", tmp_path)
    np.save(src, data.edge_index[0].numpy().astype(np.float64))
    _refusal(folder, "src.npy' must be a 1-D array of integer", tmp_path)
    np.save(src, data.edge_index[0].numpy()[:-1])
    _refusal(folder, "src.npy' has 1,715 edges but .*dst.npy' 1,716", tmp_path)
    ids = data.edge_index[0].numpy().copy()
    ids[17] = data.num_nodes + 5
    np.save(src, ids)
    _refusal(folder, "src.npy' holds node id 245 at position 17", tmp_path)
    np.save(src, data.edge_index[0].numpy())
    np.save(folder / "y.npy", data.y.numpy()[:-2])
    _refusal(folder, "y.npy' must hold one row per node", tmp_path)
    os.remove(folder / "y.npy")
    os.remove(folder / "x.npy")
    _refusal(folder, "x.npy' does not exist", tmp_path)


def test_a_killed_run_leaves_the_old_partition_whole(tmp_path):
    data = small_graph(seed=1)
    folder = write_folder(data, tmp_path / "graph")
    root = tmp_path / "parts"
    partition_graph(str(folder), 2, method="random", root=str(root))
    before = {name: (root / name).read_bytes() for name in os.listdir(root)}
    # A second run killed outright while writing parts: the new files are
    # staged beside the old partition, which stays whole and loads.
    code = (f"import os, signal, pyg_dist.partition.from_disk as m\n"
            f"real = m._write_features\n"
            f"def die(*a, **k): os.kill(os.getpid(), signal.SIGKILL)\n"
            f"m._write_features = die\n"
            f"m.partition_folder({str(folder)!r}, 2, {str(root)!r}, method='random', seed=1)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert run.returncode == -9
    assert osp.isdir(root / ".partition-tmp")  # what SIGKILL leaves: no clean-up ran
    assert {name: (root / name).read_bytes() for name in before} == before
    DistData.load(str(root), 0)
    # The next run removes it and replaces the partition.
    book = partition_folder(str(folder), 2, str(root), method="random", seed=1)
    assert sorted(os.listdir(root)) == sorted(before)
    assert PartitionBook.load(str(root)).meta["partitioning_id"] == \
        book.meta["partitioning_id"] != json.loads(before["meta.json"])["partitioning_id"]


def test_cli_generates_partitions_and_trains_out_of_core(tmp_path):
    from pyg_dist.cli import main
    graph, parts, run = tmp_path / "rmat", tmp_path / "parts", tmp_path / "run"
    main(["rmat", "--scale", "10", "--out", str(graph), "--num-features", "16"])
    main(["partition", "--from", str(graph), "--num-parts", "2", "--root", str(parts)])
    assert PartitionBook.load(str(parts)).meta["method"] == "kaminpar"
    # --eval-every 0: no whole-graph inference (what a graph beyond memory needs).
    main(["train", "--root", str(parts), "--out", str(run), "--epochs", "2", "--hidden", "8",
          "--no-plots", "--no-progress", "--eval-every", "0"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["val_acc"] is None for r in rows)
    with pytest.raises(ValueError, match="eval_every must be >= 0"):
        TrainConfig(eval_every=-1).validate()
    with pytest.raises(SystemExit, match="--method block needs the graph in memory"):
        main(["partition", "--from", str(graph), "--num-parts", "2", "--root",
              str(tmp_path / "block"), "--method", "block"])


def test_cli_partitions_ogb_raw_layout(tmp_path):
    from pyg_dist.cli import main
    from tests.datasets.test_ogb_disk import tiny_papers, write_papers
    folder = write_papers(tmp_path, tiny_papers())
    main(["partition", "--from", str(folder), "--num-parts", "2", "--root", str(tmp_path / "p"),
          "--method", "random"])
    book = PartitionBook.load(str(tmp_path / "p"))
    assert book.meta["source"] == osp.join(str(folder), "pyg_dist_graph")
    assert book.meta["num_train"] > 0


def test_a_graph_without_edges_partitions(tmp_path):
    folder = tmp_path / "graph"
    os.makedirs(folder)
    np.save(folder / "src.npy", np.array([2, 3], dtype=np.int64))  # self-loops only
    np.save(folder / "dst.npy", np.array([2, 3], dtype=np.int64))
    np.save(folder / "x.npy", np.ones((10, 3), dtype=np.float32))
    book = partition_folder(str(folder), 2, str(tmp_path / "parts"))
    assert book.meta["partitioner_input"]["neighbours"] == 0
    assert DistData.load(str(tmp_path / "parts"), 1).num_inner == int(book.partptr.diff()[1])


def test_a_folder_of_edges_and_features_only(tmp_path):
    data = small_graph(seed=6)
    folder = tmp_path / "graph"
    folder.mkdir()
    np.save(folder / "src.npy", data.edge_index[0].numpy())
    np.save(folder / "dst.npy", data.edge_index[1].numpy())
    np.save(folder / "x.npy", data.x.numpy())
    book = partition_graph(str(folder), 2, root=str(tmp_path / "parts"))
    assert book.meta["balance"] == ["edges"] and book.meta["num_classes"] is None
    part = DistData.load(str(tmp_path / "parts"), 0)
    assert part.y is None and part.x.size(0) == part.num_inner
    with pytest.raises(GraphFileError, match="balance names 'train_mask'"):
        partition_graph(str(folder), 2, root=str(tmp_path / "p2"), balance=("train_mask", ))


@pytest.mark.parametrize("name", ["part_1_x.npy", "part_1_edge_index.npy"])
def test_the_preflight_names_a_bad_file_kept_apart(tmp_path, capsys, name):
    from tests.run.test_preflight import TRAIN, _refused
    folder = write_folder(small_graph(seed=6), tmp_path / "graph")
    root = str(tmp_path / "parts")
    partition_folder(str(folder), 2, root, method="random")
    flip_bytes(osp.join(root, name), 200)
    assert "corrupt" in _refused(capsys, "train", ["--root", root, *TRAIN], name)
    os.remove(osp.join(root, name))
    assert "missing" in _refused(capsys, "train", ["--root", root, *TRAIN], name)


def _files(root):
    return {name: (root / name).read_bytes() for name in sorted(os.listdir(root))}


def _kaminpar_children(pid):
    r"""The KaMinPar processes process :obj:`pid` started (Linux)."""
    found = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            for child in f.read().split():
                with open(f"/proc/{child}/cmdline", "rb") as cmd:
                    if b"kaminpar" in cmd.read():
                        found.append(int(child))
    except OSError:
        pass
    return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_leaves_the_old_partition_whole(tmp_path, signum):
    from pyg_dist.datasets.rmat_disk import write_rmat
    folder, root = str(tmp_path / "graph"), tmp_path / "parts"
    write_rmat(folder, 15, num_features=16)
    partition_folder(folder, 2, str(root), method="random")
    before = _files(root)
    run = subprocess.Popen([sys.executable, "-m", "pyg_dist.cli", "partition", "--from", folder,
                            "--num-parts", "2", "--root", str(root)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # SIGTERM while KaMinPar runs (in a child process: it holds the
    # interpreter lock for its whole run), the others once writing started.
    kaminpar = []
    while run.poll() is None:
        kaminpar = _kaminpar_children(run.pid)
        if kaminpar if signum == signal.SIGTERM else osp.isdir(root / ".partition-tmp"):
            break
        time.sleep(0.005)
    assert kaminpar or signum != signal.SIGTERM
    sent = time.monotonic()
    run.send_signal(signum)
    _, err = run.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    name = signal.Signals(signum).name
    assert run.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] == (f"pyg-dist partition: interrupted ({name}): nothing "
                                            f"was written; '{root}' is left as it was")
    assert "Traceback" not in err
    assert _files(root) == before  # the staging folder is gone, the old partition whole
    DistData.load(str(root), 1)
    assert not any(osp.exists(f"/proc/{pid}") for pid in kaminpar)


def test_the_disk_space_is_checked_before_any_work(tmp_path, small_disk):
    from pyg_dist.cli import main
    from pyg_dist.datasets.rmat_disk import write_rmat
    from pyg_dist.partition.from_disk import GraphFolder, disk_bytes
    folder = str(tmp_path / "graph")
    write_rmat(folder, 12, num_features=16)
    need = disk_bytes(GraphFolder(folder), 2)
    disk = small_disk("2M")
    assert need > 2 * 2**20  # a graph this disk cannot take
    start = time.monotonic()
    with pytest.raises(SystemExit) as info:
        main(["partition", "--from", folder, "--num-parts", "2", "--root", str(disk / "parts")])
    message = str(info.value.code)
    assert "\n" not in message and time.monotonic() - start < 10
    assert f"needs up to {need:,} bytes" in message and f"which has {2 * 2**20:,} free" in message
    assert os.listdir(disk) == []  # the root it would have created is not left behind


@pytest.mark.parametrize("from_disk", [True, False])
def test_a_full_disk_while_writing_leaves_the_old_partition_whole(tmp_path, small_disk,
                                                                 from_disk):
    from pyg_dist.cli import main
    data = small_graph(num_nodes=2000, seed=2)
    folder = write_folder(data, tmp_path / "graph")
    disk = small_disk("3M")
    root = disk / "parts"
    args = (["--from", str(folder), "--method", "random"] if from_disk
            else ["--num-nodes", "2000", "--data-dir", str(tmp_path / "data")])
    main(["partition", "--num-parts", "2", "--root", str(root), *args])
    before = _files(root)
    st = os.statvfs(disk)
    if from_disk:  # the estimate of the bytes passes: the files (inodes) run out
        used = st.f_files - st.f_ffree
        subprocess.run(["mount", "-o", f"remount,nr_inodes={used + 3}", str(disk)], check=True)
    else:  # nothing is estimated: the bytes run out half-way (torch.save's RuntimeError)
        (disk / "filler").write_bytes(
            b"\0" * (st.f_bavail * st.f_frsize - sum(map(len, before.values())) // 2))
    with pytest.raises(SystemExit) as info:
        main(["partition", "--num-parts", "2", "--root", str(root), "--seed", "1", *args])
    message = str(info.value.code)
    assert "\n" not in message and "no space left on the device" in message, message
    assert f"'{root}' is left as it was" in message
    assert _files(root) == before
    DistData.load(str(root), 0)
