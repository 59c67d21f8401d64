"""Values the command line takes as a user types them, sizes it refuses
before any work, and runs that end without warnings a user would read as a
problem."""
import os
import subprocess
import sys
import time

from pyg_dist.cli import _negative_values_attached
from tests.conftest import REPO


def pyg_dist_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pyg_dist.cli", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_negative_values_are_values():
    assert _negative_values_attached(["train", "--fanout", "-1,-1,-1", "--seed", "-3"]) == \
        ["train", "--fanout=-1,-1,-1", "--seed=-3"]
    # a flag that takes no value stays itself; a value given with = is kept
    assert _negative_values_attached(["--overwrite", "--fanout=-1,5", "--lr", "1e-3"]) == \
        ["--overwrite", "--fanout=-1,5", "--lr", "1e-3"]


def test_fanout_all_neighbours_as_the_readme_writes_it(tmp_path):
    # parsing gets past --fanout -1,-1,-1 (argparse took it for a flag):
    # the run then fails on the missing partition directory, in one line
    p = pyg_dist_cli("train", "--root", str(tmp_path / "none"), "--loader", "neighbor",
                     "--fanout", "-1,-1,-1")
    assert p.returncode != 0
    assert "expected one argument" not in p.stderr
    assert "is not a partition directory" in p.stderr


def test_a_generated_graph_too_large_for_the_machine_is_refused(tmp_path):
    start = time.monotonic()
    p = pyg_dist_cli("partition", "--num-nodes", "1000000000", "--num-parts", "2",
                     "--root", str(tmp_path / "parts"), "--data-dir", str(tmp_path / "data"))
    assert p.returncode == 1 and time.monotonic() - start < 60
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "GiB to generate and partition" in lines[0], p.stderr
    assert not os.path.exists(tmp_path / "parts" / "meta.json")


def test_single_process_training_warns_nothing(tmp_path):
    # torch warns once per process: a fresh interpreter, warnings as errors
    code = ("from tests.conftest import small_graph\n"
            "from pyg_dist.train import TrainConfig, train_single_process\n"
            "train_single_process(small_graph(), TrainConfig(hidden=8, epochs=1, "
            "progress=False))\n")
    p = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code],
                       capture_output=True, text=True, timeout=120,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr


import pytest  # noqa: E402  (the partition and rmat refusals below)

# Each with what its one line says; refused before any work (no --root).
PARTITION_REFUSALS = [
    (["--num-batches", "0"], "--num-batches must be >= 1 (got '0')"),
    (["--num-batches", "-3"], "--num-batches must be >= 1 (got '-3')"),
    (["--num-batches", "2", "--batch-layers", "0"], "--batch-layers must be >= 1"),
    (["--batch-layers", "2"], "--batch-layers needs --num-batches"),
    (["--partitioner-degree", "-1"], "--partitioner-degree must be a finite number >= 0"),
    (["--partitioner-degree", "4"], "--partitioner-degree needs --from"),
    (["--method", "block", "--objective", "cut"], "--objective does not apply to --method block"),
    (["--method", "random", "--objective", "cut"], "--objective does not apply to --method random"),
    (["--method", "kaminpar", "--objective", "vol"],
     "--objective does not apply to --method kaminpar"),
    (["--block-hops", "3"], "--block-hops does not apply to --method metis"),
    (["--method", "block", "--block-hops", "-1"], "--block-hops must be >= 0 (got '-1')"),
    (["--method", "block", "--seed", "3"], "--seed does not apply to --method block"),
]


def _refused(capsys, args, says):
    from pyg_dist.cli import main
    start = time.monotonic()
    with pytest.raises(SystemExit) as info:
        main(["partition", "--num-parts", "2", *args])
    assert info.value.code != 0 and time.monotonic() - start < 10
    message = capsys.readouterr().err + str(info.value.code)
    assert says in message, message
    return message


@pytest.mark.parametrize("args,says", PARTITION_REFUSALS)
def test_a_partition_flag_out_of_range_or_made_meaningless_is_refused(tmp_path, capsys, args,
                                                                       says):
    root = tmp_path / "parts"
    _refused(capsys, ["--root", str(root), "--num-nodes", "300", "--data-dir",
                      str(tmp_path / "data"), *args], says)
    assert not root.exists()


def test_flags_of_a_graph_the_partition_does_not_read_are_refused(tmp_path, capsys):
    from pyg_dist.datasets.rmat_disk import write_rmat
    folder = str(tmp_path / "graph")
    write_rmat(folder, 8, num_features=16)
    root = tmp_path / "parts"
    for args, says in (
            (["--from", folder, "--data-dir", str(tmp_path)],
             "--data-dir does not apply to --from"),
            (["--from", folder, "--data-seed", "1"], "--data-seed does not apply to --from"),
            (["--from", folder, "--objective", "cut"],
             "--objective does not apply to --method kaminpar"),
            (["--from", folder, "--method", "metis", "--partitioner-degree", "3"],
             "--partitioner-degree does not apply to --method metis"),
            (["--dataset", "flickr", "--data-seed", "1"],
             "--data-seed does not apply to --dataset flickr"),
            (["--dataset", "flickr", "--num-nodes", "300"],
             "--num-nodes does not apply to --dataset flickr")):
        _refused(capsys, ["--root", str(root), *args], says)
        assert not root.exists()


def test_more_batches_than_training_nodes_are_refused_before_partitioning(tmp_path, capsys):
    root = tmp_path / "parts"
    message = _refused(capsys, ["--root", str(root), "--num-nodes", "300", "--data-dir",
                                str(tmp_path / "data"), "--num-batches", "100000"],
                       "--num-batches 100000 exceeds the graph's")
    assert "training nodes" in message and "Traceback" not in message
    assert not root.exists()  # nothing partitioned, and no empty root left


def test_rmat_refuses_an_out_that_is_a_file_or_holds_anything(tmp_path, capsys):
    from pyg_dist.cli import main
    rmat = ["rmat", "--scale", "4", "--num-features", "16", "--out"]
    graph, other, empty = tmp_path / "graph", tmp_path / "other", tmp_path / "empty"
    main([*rmat, str(graph)])
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    for out, says in ((tmp_path / "file", "is a file, not a directory"),
                      (graph, f"--out '{graph}' is not empty"),
                      (other, f"--out '{other}' is not empty")):
        before = sorted(os.listdir(out)) if out.is_dir() else out.read_text()
        with pytest.raises(SystemExit) as info:
            main([*rmat, str(out)])
        message = str(info.value.code)
        assert "\n" not in message and says in message, message
        assert (sorted(os.listdir(out)) if out.is_dir() else out.read_text()) == before
    empty.mkdir()
    main([*rmat, str(empty)])
    assert "graph.json" in os.listdir(empty)
