import json
import os
import os.path as osp

import numpy as np
import pytest
import torch

from pyg_dist.datasets import rmat_disk
from pyg_dist.datasets.rmat_disk import _FIELD, _torch_rng, write_rmat

SMALL = dict(scale=14, num_features=32, num_classes=8, seed=3)
NPY = ("src.npy", "dst.npy", "x.npy", "y.npy", "train_mask.npy", "val_mask.npy",
       "test_mask.npy")


def _load(folder):
    return {name[:-4]: np.load(osp.join(folder, name)) for name in NPY}


def _degrees(g, N):
    return np.bincount(g["src"], minlength=N), np.bincount(g["dst"], minlength=N)


def _field(meta):
    r"""The graph's :math:`\mathbf{z}` (not written), redrawn from its seed."""
    N, C = meta["num_nodes"], meta["num_classes"]
    return torch.empty(N, C).normal_(generator=_torch_rng(meta["seed"], _FIELD))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("rmat") / "graph")
    return out, write_rmat(out, **SMALL)


def test_files(folder):
    out, meta = folder
    N, E = 2**14, 16 * 2**14
    with open(osp.join(out, "graph.json")) as f:
        assert json.load(f) == meta
    assert meta["generator"] == "rmat" and meta["num_nodes"] == N
    assert meta["num_edges"] == E and meta["num_features"] == 32
    assert meta["num_classes"] == 8 and meta["seed"] == 3
    assert sorted(os.listdir(out)) == sorted(NPY + ("graph.json", ))
    g = _load(out)
    for key in ("src", "dst"):
        assert g[key].dtype == np.int32 and g[key].shape == (E, )
        assert 0 <= g[key].min() and g[key].max() < N
    assert g["x"].dtype == np.float32 and g["x"].shape == (N, 32)
    assert g["y"].dtype == np.int64 and g["y"].shape == (N, )
    masks = np.stack([g["train_mask"], g["val_mask"], g["test_mask"]])
    assert masks.dtype == bool and masks.shape == (3, N)
    assert masks.sum(1).tolist() == [int(0.01 * N), int(0.002 * N), int(0.005 * N)]
    assert masks.sum(0).max() == 1  # disjoint


def test_labels_and_features(folder):
    out, meta = folder
    g = _load(out)
    N, C = meta["num_nodes"], meta["num_classes"]
    z = _field(meta).double()
    src, dst = torch.from_numpy(g["src"]).long(), torch.from_numpy(g["dst"]).long()
    # Messages flow src -> dst: a node averages over its in-edges' sources.
    total = torch.zeros(N, C, dtype=torch.float64).index_add_(0, dst, z[src])
    degree = torch.bincount(dst, minlength=N)[:, None]
    field = 0.1 * z + 0.9 * total / degree.clamp(min=1)
    field = torch.where(degree > 0, field, z).numpy()
    y = field.argmax(1)
    top2 = np.sort(field, 1)[:, -2:]
    differ = y != g["y"]
    # float32 sums may only flip a near tie.
    assert differ.sum() <= 2 and (top2[differ, 1] - top2[differ, 0] < 1e-4).all()
    share = np.bincount(g["y"], minlength=C) / N
    assert share.min() > 0.5 / C and share.max() < 2 / C

    # x = z M + 0.5 noise: the least-squares fit on z leaves the noise.
    x = torch.from_numpy(g["x"]).double()
    fit = z @ torch.linalg.lstsq(z, x).solution
    assert abs(float((x - fit).std()) - 0.5) < 0.01
    assert 0.7 < float(fit.var(0).mean()) < 1.3


def test_no_in_edges(tmp_path):
    # With smoothing 1 the label is the neighbours' mean alone: a node
    # without in-edges falls back to its own field.
    meta = write_rmat(str(tmp_path), scale=10, smoothing=1.0, num_features=8,
                      num_classes=4, seed=5)
    g = _load(str(tmp_path))
    alone = np.bincount(g["dst"], minlength=2**10) == 0
    assert alone.sum() > 50
    assert np.array_equal(g["y"][alone], _field(meta)[alone].argmax(1).numpy())


def test_node_blocks(tmp_path, monkeypatch):
    kwargs = dict(scale=10, num_features=16, num_classes=4)
    meta = write_rmat(str(tmp_path / "one"), **kwargs)
    # 64 feature rows per node block: 16 blocks.
    monkeypatch.setattr(rmat_disk, "_FEATURE_BYTES", 64 * 16 * 4)
    write_rmat(str(tmp_path / "many"), **kwargs)
    g, h = _load(str(tmp_path / "one")), _load(str(tmp_path / "many"))
    for key in ("src", "dst", "y", "train_mask"):
        assert np.array_equal(g[key], h[key]), key
    # Every block draws its own noise.
    z, x = _field(meta).double(), torch.from_numpy(h["x"]).double()
    noise = (x - z @ torch.linalg.lstsq(z, x).solution).numpy()
    assert np.abs(noise[:64] - noise[64:128]).mean() > 0.3


def test_degree_distribution(tmp_path):
    # Asymmetric quadrants: raw node 0 (the largest hub) has
    # E (a + b)^s out-edges, E (a + c)^s in-edges and E (a + d)^s self-loops.
    s, a, b, c = 14, 0.6, 0.1, 0.2
    E = 16 * 2**s
    write_rmat(str(tmp_path), scale=s, a=a, b=b, c=c, num_features=8, num_classes=4)
    g = _load(str(tmp_path))
    out_degree, in_degree = _degrees(g, 2**s)
    assert abs(out_degree.max() / (E * (a + b)**s) - 1) < 0.1
    assert abs(in_degree.max() / (E * (a + c)**s) - 1) < 0.05
    assert out_degree.argmax() == in_degree.argmax()
    assert abs((g["src"] == g["dst"]).sum() / (E * (1 - b - c)**s) - 1) < 0.1


def test_heavy_tail(folder):
    g = _load(folder[0])
    out_degree, in_degree = _degrees(g, 2**14)
    assert in_degree.max() > 20 * in_degree.mean()
    assert out_degree.max() > 20 * out_degree.mean()


def test_one_quadrant(tmp_path):
    # All edges in one quadrant at every level: one node pair. The cuts at
    # 0 and 2**32 must give empty and full quadrants.
    pairs = {}
    for name, abc in (("a", (1, 0, 0)), ("b", (0, 1, 0)), ("c", (0, 0, 1)),
                      ("d", (0, 0, 0))):
        out = str(tmp_path / name)
        write_rmat(out, scale=6, edge_factor=4, num_features=4, num_classes=2,
                   a=abc[0], b=abc[1], c=abc[2])
        g = _load(out)
        assert len(np.unique(g["src"])) == 1 and len(np.unique(g["dst"])) == 1
        pairs[name] = (g["src"][0], g["dst"][0])
    first, last = pairs["a"][0], pairs["d"][0]  # the ids of raw nodes 0, N - 1
    assert first != last
    assert pairs == {"a": (first, first), "b": (first, last), "c": (last, first),
                     "d": (last, last)}


def test_deterministic_and_chunk_free(folder, tmp_path):
    out = folder[0]
    src, B = np.load(osp.join(out, "src.npy")), rmat_disk._EDGE_BLOCK
    assert len(src) == 4 * B  # every block has its own stream
    assert len({src[i * B:(i + 1) * B].tobytes() for i in range(4)}) == 4
    # One block per chunk, and chunks of 3 blocks that do not divide E.
    for chunk_edges in (1, 3 << 16):
        again = str(tmp_path / str(chunk_edges))
        write_rmat(again, **SMALL, chunk_edges=chunk_edges)
        for name in NPY + ("graph.json", ):
            with open(osp.join(out, name), "rb") as f1, \
                    open(osp.join(again, name), "rb") as f2:
                assert f1.read() == f2.read(), (chunk_edges, name)
    other = str(tmp_path / "other")
    write_rmat(other, **{**SMALL, "seed": 4})
    g, h = _load(out), _load(other)
    for key in ("src", "dst", "x", "y", "train_mask"):
        assert not np.array_equal(g[key], h[key]), key


def test_refuses_existing(folder, tmp_path):
    with pytest.raises(ValueError, match="graph.json' already exists"):
        write_rmat(folder[0], **SMALL)
    np.save(tmp_path / "x.npy", np.zeros(3))
    with pytest.raises(ValueError, match="x.npy' already exists"):
        write_rmat(str(tmp_path), **SMALL)
    assert os.listdir(tmp_path) == ["x.npy"]
    assert np.array_equal(np.load(tmp_path / "x.npy"), np.zeros(3))


@pytest.mark.parametrize("kwargs, match", [
    (dict(scale=0), "scale"),
    (dict(scale=41), "scale"),
    (dict(edge_factor=0), "edge_factor"),
    (dict(num_classes=1), "num_classes"),
    (dict(num_features=4, num_classes=8), "num_features"),
    (dict(a=-0.1), "quadrant"),
    (dict(a=0.5, b=0.3, c=0.3), "quadrant"),
    (dict(smoothing=1.5), "smoothing"),
    (dict(feature_noise=-1.0), "feature_noise"),
    (dict(split=(0.5, 0.5, 0.1)), "split"),
    (dict(split=(0.5, -0.1, 0.1)), "split"),
    (dict(split=(0.5, 0.1)), "split"),
    (dict(chunk_edges=0), "chunk_edges"),
])
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        write_rmat(str(tmp_path / "g"), **{"scale": 6, **kwargs})
    assert not osp.exists(tmp_path / "g")


def test_failed_write_leaves_nothing(tmp_path):
    # x.npy's temporary file cannot be opened: the write fails after the
    # edges are on disk.
    os.makedirs(tmp_path / "x.npy.tmp")
    with pytest.raises(IsADirectoryError):
        write_rmat(str(tmp_path), scale=8, num_features=4, num_classes=2)
    assert os.listdir(tmp_path) == ["x.npy.tmp"]
    os.rmdir(tmp_path / "x.npy.tmp")
    write_rmat(str(tmp_path), scale=8, num_features=4, num_classes=2)
    assert osp.exists(tmp_path / "graph.json")


def test_the_disk_space_is_checked_before_any_work(small_disk):
    from pyg_dist.cli import main
    from pyg_dist.datasets.rmat_disk import rmat_bytes
    disk = small_disk("1M")
    need = rmat_bytes(13, num_features=16)
    with pytest.raises(SystemExit) as info:
        main(["rmat", "--scale", "13", "--num-features", "16", "--out", str(disk / "g")])
    message = str(info.value.code)
    assert "\n" not in message and f"needs up to {need:,} bytes" in message, message
    assert f"which has {2**20:,} free" in message and os.listdir(disk) == []
    # What fits is written, in no more than the bound.
    write_rmat(str(disk / "g"), 10, num_features=16)
    written = sum(osp.getsize(disk / "g" / name) for name in os.listdir(disk / "g"))
    assert written <= rmat_bytes(10, num_features=16) < 2 * written


def test_a_signal_removes_what_rmat_wrote(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "g"
    run = subprocess.Popen([sys.executable, "-m", "pyg_dist.cli", "rmat", "--scale", "20",
                            "--num-features", "16", "--out", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while run.poll() is None and not osp.exists(out / "src.npy.tmp"):
        time.sleep(0.005)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == (f"pyg-dist rmat: interrupted (SIGTERM): the files "
                                            f"written to '{out}' were removed")
    assert os.listdir(out) == []
