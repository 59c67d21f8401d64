"""The figures a run writes (``pyg_dist.plots``)."""
import json
import os.path as osp
import warnings

from pyg_dist.plots import plot_run


def _metrics(out_dir: str, accuracy) -> None:
    with open(osp.join(out_dir, "metrics.jsonl"), "w") as f:
        for epoch in range(3):
            f.write(json.dumps({"epoch": epoch, "loss": 1.0 / (epoch + 1), "time": 0.1,
                                "train_acc": accuracy, "val_acc": accuracy,
                                "test_acc": accuracy}) + "\n")


def test_a_run_evaluated_at_no_epoch_plots_without_warnings(tmp_path):
    _metrics(str(tmp_path), None)  # --eval-every 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = plot_run(str(tmp_path))
    assert paths and all(osp.getsize(p) > 0 for p in paths)


def test_an_evaluated_run_plots_its_accuracies(tmp_path):
    _metrics(str(tmp_path), 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_run(str(tmp_path))
