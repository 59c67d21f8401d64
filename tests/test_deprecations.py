"""Old names, module paths, config fields and flags keep working for one
release, each with a DeprecationWarning naming its replacement."""
import importlib
import json
import sys

import pytest

import pyg_dist
from pyg_dist.config import TrainConfig, build_model, upgrade
from pyg_dist.loader import (PartitionFeatureStore, PartitionNeighborLoader,
                             PartitionNeighborSampler, PlanPrefetcher, TrainBatch)


@pytest.mark.parametrize("module,old,new", [
    ("pyg_dist.nn", "DistContext", pyg_dist.nn.HaloContext),
    ("pyg_dist.loader", "DistNeighborLoader", PartitionNeighborLoader),
    ("pyg_dist.loader", "DistNeighborSampler", PartitionNeighborSampler),
    ("pyg_dist.loader", "DistFeatureStore", PartitionFeatureStore),
    ("pyg_dist.loader", "Batch", TrainBatch),
    ("pyg_dist.sampler", "PlanPrefetcher", PlanPrefetcher),
])
def test_renamed_classes(module, old, new):
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated"):
        assert getattr(importlib.import_module(module), old) is new


@pytest.mark.parametrize("old,name", [
    ("pyg_dist.loader.cost", "HopGraph"),
    ("pyg_dist.loader.balance", "save_batch_parts"),
    ("pyg_dist.loader.neighbor_loader", "PartitionNeighborLoader"),
    ("pyg_dist.loader.pipeline", "SamplerPool"),
    ("pyg_dist.sampler.prefetch", "PlanPrefetcher"),
])
def test_moved_modules(old, name):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated"):
        module = importlib.import_module(old)
    new = importlib.import_module(pyg_dist.deprecation.MOVED_MODULES[old])
    assert getattr(module, name) is getattr(new, name)


def test_metrics_comm_stats():
    from pyg_dist.comm.stats import CommStats
    with pytest.warns(DeprecationWarning, match="metrics.CommStats"):
        from pyg_dist.metrics import CommStats as old
    assert old is CommStats


def test_legacy_config_fields_become_loader_args():
    with pytest.warns(DeprecationWarning) as record:
        config = TrainConfig(loader="neighbor", fanout=[3, 3, 3], sampler_workers=2)
    assert ["fanout=" in str(w.message) for w in record] == [True, False]
    assert config.loader_args == {"fanout": [3, 3, 3], "workers": 2}
    config.validate()
    with pytest.warns(DeprecationWarning, match="background_sampling"):
        assert TrainConfig(background_sampling=False).loader_args == {"background": False}
    # The full loader ignored neighbour fields before; it still does (with the warning).
    with pytest.warns(DeprecationWarning):
        TrainConfig(batch_size=40).validate()


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
