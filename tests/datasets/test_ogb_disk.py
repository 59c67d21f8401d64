"""OGB's binary layout (ogbn-papers100M's download) streamed into a graph
folder: a tiny dataset laid out on disk as the download leaves it, converted
in chunks of a few values, equals what loading it whole gives."""
import gzip
import io
import json
import os
import os.path as osp
import zipfile

import numpy as np
import pytest
import torch

from pyg_dist.datasets import load
from pyg_dist.datasets.ogb_disk import is_ogb_raw, ogb_to_graph_dir
from pyg_dist.utils.npy import GraphFileError, NpyWriter

N, F, E = 40, 5, 120


def _members(**arrays):
    return {f"{key}.npy": _npy_bytes(a) for key, a in arrays.items()}


def _npy_bytes(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _write_npz(path, members, compression=zipfile.ZIP_DEFLATED):
    r"""An ``.npz`` archive of raw member bytes (so tests can damage one)."""
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, data in members.items():
            z.writestr(name, data)


def _csv_gz(path, ids):
    with gzip.open(path, "wt") as f:
        f.write("".join(f"{i}\n" for i in ids))


def tiny_papers(seed=0, feat_dtype=np.float32):
    r"""The arrays of a tiny ogbn-papers100M: directed citations with a
    self-loop, a pair citing both ways and a duplicate; float labels with
    NaN for a third of the nodes; a split of labelled nodes only."""
    rng = np.random.default_rng(seed)
    edge_index = rng.integers(0, N, (2, E), dtype=np.int64)
    edge_index[:, :4] = [[3, 1, 2, 5], [3, 2, 1, 6]]
    edge_index[:, 4] = edge_index[:, 3]
    label = rng.integers(0, 4, (N, 1)).astype(np.float64)
    label[rng.random(N) < 0.3] = np.nan
    labelled = rng.permutation(np.flatnonzero(~np.isnan(label[:, 0])))
    split = dict(zip(("train", "valid", "test"), np.split(labelled, [12, 18])))
    return {"edge_index": edge_index,
            "node_feat": rng.standard_normal((N, F)).astype(feat_dtype),
            "node_year": rng.integers(1990, 2020, (N, 1)),
            "num_nodes_list": np.array([N]), "num_edges_list": np.array([E]),
            "node_label": label, "split": split}


def write_papers(root, arrays, compressed=True, split_pt=False):
    r"""``root/ogbn_papers100M`` as papers100M-bin.zip unpacks: ``raw/``
    with the two ``.npz`` archives (``np.savez_compressed``, as OGB's),
    the time split and the release marker."""
    folder = osp.join(root, "ogbn_papers100M")
    raw, split = osp.join(folder, "raw"), osp.join(folder, "split", "time")
    os.makedirs(raw), os.makedirs(split)
    save = np.savez_compressed if compressed else np.savez
    save(osp.join(raw, "data.npz"), **{k: v for k, v in arrays.items()
                                       if k not in ("node_label", "split")})
    save(osp.join(raw, "node-label.npz"), node_label=arrays["node_label"])
    if split_pt:
        torch.save({k: torch.from_numpy(v) for k, v in arrays["split"].items()},
                   osp.join(split, "split_dict.pt"))
    else:
        for part, ids in arrays["split"].items():
            _csv_gz(osp.join(split, f"{part}.csv.gz"), ids)
    open(osp.join(folder, "RELEASE_v1.txt"), "w").close()
    return folder


def read_folder(out):
    arrays = {name[:-4]: np.load(osp.join(out, name)) for name in os.listdir(out)
              if name.endswith(".npy")}
    with open(osp.join(out, "graph.json")) as f:
        return arrays, json.load(f)


def expected_masks(arrays):
    masks = {}
    for ours, theirs in (("train", "train"), ("val", "valid"), ("test", "test")):
        masks[ours] = np.zeros(N, dtype=bool)
        masks[ours][arrays["split"][theirs]] = True
    return masks


@pytest.mark.parametrize("compressed,split_pt,undirected,feat_dtype", [
    (True, False, True, np.float32),
    (False, False, True, np.float32),
    (True, True, False, np.float16),
    (False, False, False, np.float64),
])
def test_converted_folder_equals_the_arrays(tmp_path, compressed, split_pt, undirected,
                                            feat_dtype):
    arrays = tiny_papers(feat_dtype=feat_dtype)
    folder = write_papers(str(tmp_path), arrays, compressed, split_pt)
    assert is_ogb_raw(folder) and not is_ogb_raw(str(tmp_path))
    out = str(tmp_path / "graph")
    meta = ogb_to_graph_dir(folder, out, undirected=undirected, chunk_rows=7)
    got, written = read_folder(out)
    assert meta == written == {"source": "ogb", "name": "ogbn_papers100M", "num_nodes": N,
                               "num_edges": 2 * E if undirected else E,
                               "num_features": F, "undirected": undirected}
    src, dst = arrays["edge_index"]
    if undirected:  # the E edges, then the E reversed ones, nothing removed
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    assert got["src"].dtype == got["dst"].dtype == np.int32
    assert np.array_equal(got["src"], src) and np.array_equal(got["dst"], dst)
    assert got["x"].dtype == (np.float16 if feat_dtype == np.float16 else np.float32)
    assert np.array_equal(got["x"], arrays["node_feat"].astype(got["x"].dtype))
    label = arrays["node_label"][:, 0]
    assert got["y"].dtype == np.int64
    assert np.array_equal(got["y"], np.where(np.isnan(label), -1, label).astype(np.int64))
    for key, mask in expected_masks(arrays).items():
        assert got[f"{key}_mask"].dtype == bool
        assert np.array_equal(got[f"{key}_mask"], mask)
    assert sorted(os.listdir(out)) == sorted(
        ["graph.json", "src.npy", "dst.npy", "x.npy", "y.npy", "train_mask.npy",
         "val_mask.npy", "test_mask.npy"])


def test_same_graph_as_the_in_memory_ogb_loader(tmp_path):
    arrays = tiny_papers(seed=1)
    folder = write_papers(str(tmp_path), arrays)
    out = str(tmp_path / "graph")
    ogb_to_graph_dir(folder, out, chunk_rows=7)
    got, _ = read_folder(out)
    data = load("ogbn-papers100M", str(tmp_path))  # ogb's PygNodePropPredDataset
    assert np.array_equal(got["x"], data.x.numpy())
    assert np.array_equal(got["y"], data.y.numpy())
    for key in ("train", "val", "test"):
        assert np.array_equal(got[f"{key}_mask"], data[f"{key}_mask"].numpy())
    # The loader coalesces; the folder keeps every citation in both directions.
    assert set(zip(got["src"].tolist(), got["dst"].tolist())) == \
        set(map(tuple, data.edge_index.t().tolist()))


def test_moves_at_most_chunk_rows_values_at_a_time(tmp_path, monkeypatch):
    folder = write_papers(str(tmp_path), tiny_papers())
    sizes, write = [], NpyWriter.write

    def counted(self, rows):
        sizes.append(rows.size)
        write(self, rows)

    monkeypatch.setattr(NpyWriter, "write", counted)
    ogb_to_graph_dir(folder, str(tmp_path / "graph"), chunk_rows=7)
    assert max(sizes) <= 7 and sum(sizes) == 2 * 2 * E + N * F + N + 3 * N


def test_refuses_a_folder_holding_its_outputs(tmp_path):
    folder = write_papers(str(tmp_path), tiny_papers())
    for name in ("graph.json", "x.npy"):
        out = tmp_path / f"out_{name}"
        out.mkdir()
        (out / name).write_text("")
        with pytest.raises(ValueError, match="already exists") as info:
            ogb_to_graph_dir(folder, str(out))
        assert str(out / name) in str(info.value)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _short_member(path, key):
    r"""Rewrites :obj:`path` with member :obj:`key` cut short (a valid zip
    whose array ends before its header says)."""
    with np.load(path) as npz:
        members = _members(**{k: npz[k] for k in npz.files})
    members[f"{key}.npy"] = members[f"{key}.npy"][:-16]
    _write_npz(path, members)


def _replace(path, **arrays):
    with np.load(path) as npz:
        members = _members(**{**{k: npz[k] for k in npz.files}, **arrays})
    _write_npz(path, members)


def _data(raw):
    return osp.join(raw, "data.npz")


def _labels(raw):
    return osp.join(raw, "node-label.npz")


def _no_node_feat(raw):
    _write_npz(_data(raw), _members(edge_index=np.zeros((2, 1), np.int64),
                                    num_nodes_list=np.array([N]),
                                    num_edges_list=np.array([1])))


def _id_out_of_range(raw):
    last = np.array([[0], [N]])  # the last destination, deep in the stream
    _replace(_data(raw), edge_index=np.concatenate([np.zeros((2, E - 1), np.int64), last], 1))


BAD_INPUTS = {  # case -> (damage to raw/, the file named, what the message says)
    "truncated data.npz": (lambda raw: _truncate(_data(raw)),
                           "data.npz", "not a readable .npz"),
    "edge_index cut short": (lambda raw: _short_member(_data(raw), "edge_index"),
                             "data.npz:edge_index", "truncated"),
    "node_label cut short": (lambda raw: _short_member(_labels(raw), "node_label"),
                             "node-label.npz:node_label", "truncated"),
    "no node-label.npz": (lambda raw: os.remove(_labels(raw)),
                          "node-label.npz", "does not exist"),
    "no node_feat": (_no_node_feat, "data.npz", "no member 'node_feat'"),
    "edge id out of range": (_id_out_of_range, "data.npz:edge_index",
                             f"node ids [0-9]+..{N} outside"),
    "negative edge id": (lambda raw: _replace(_data(raw), edge_index=np.full((2, E), -1)),
                         "data.npz:edge_index", "node ids -1..-1 outside"),
    "float edge ids": (lambda raw: _replace(_data(raw), edge_index=np.zeros((2, E))),
                       "data.npz:edge_index", "float64, not integer"),
    "fortran order": (lambda raw: _replace(_data(raw), edge_index=np.asfortranarray(
        np.zeros((2, E), np.int64))), "data.npz:edge_index", "Fortran order"),
    "no split file": (lambda raw: os.remove(osp.join(raw, "..", "split", "time",
                                                     "valid.csv.gz")),
                      "valid.csv.gz", "does not exist"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_refused_naming_the_file(tmp_path, case):
    damage, named, says = BAD_INPUTS[case]
    folder = write_papers(str(tmp_path), tiny_papers())
    damage(osp.join(folder, "raw"))
    out = tmp_path / "graph"
    with pytest.raises(GraphFileError, match=says) as info:
        ogb_to_graph_dir(folder, str(out), chunk_rows=7)
    message = str(info.value)
    assert "\n" not in message and named in message
    assert not out.exists() or os.listdir(out) == []  # no graph.json, no part file
