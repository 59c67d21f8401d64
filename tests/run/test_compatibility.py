"""What outside readers rely on keeps working: result files written by
earlier versions load, and old command-line flags still parse (with a
DeprecationWarning naming the new one). Names inside the package are not
kept (nothing is released before 1.0)."""
import json

import pytest

from pyg_dist.config import TrainConfig, build_model, upgrade


def test_files_of_the_previous_release_load_silently(tmp_path, recwarn):
    old = {**TrainConfig(loader="neighbor", hidden=8).to_dict(), "fanout": [5, 5, 5],
           "batch_size": 1024, "sampler_workers": 0, "adaptive_depth": True,
           "background_sampling": True, "extra": {}}
    del old["loader_args"]
    assert TrainConfig.from_dict(old).loader_args == {"fanout": [5, 5, 5]}
    assert upgrade(old)["loader_args"] == {"fanout": [5, 5, 5]}
    from pyg_dist.train import load_model
    model = build_model(TrainConfig(hidden=8), 4, 3)
    from pyg_dist.integrity import save_checked
    described = save_checked(model.state_dict(), str(tmp_path / "model.pt"))
    (tmp_path / "model.json").write_text(json.dumps({"config": old, "in_channels": 4,
                                                     "out_channels": 3,
                                                     "files": {"model.pt": described}}))
    assert load_model(str(tmp_path)).state_dict().keys() == model.state_dict().keys()
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)
                and "pyg_dist" in str(w.message)]


def test_old_cli_flag(tmp_path):
    from pyg_dist.cli import main
    with pytest.warns(DeprecationWarning, match="--sampler-workers is deprecated"):
        with pytest.raises(SystemExit):  # the flag parses; the missing partitions stop it
            main(["train", "--root", str(tmp_path), "--loader", "neighbor",
                  "--sampler-workers", "2"])
