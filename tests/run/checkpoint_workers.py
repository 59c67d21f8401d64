"""Functions that run inside spawned ranks for tests/run/test_checkpoint.py."""
import os
import torch
import torch.distributed as dist


def _params(out_dir: str) -> dict:
    return torch.load(os.path.join(out_dir, "model.pt"), weights_only=True)


def resume_runs(root: str, out: str, configs: dict):
    r"""Per config: an uninterrupted run, and the same run stopped after
    half its epochs (checkpointing) then resumed. Returns both runs'
    parameters and losses."""
    import dataclasses
    from pyg_dist.train import train
    results = {}
    for name, config in configs.items():
        whole, parts = f"{out}/{name}-whole", f"{out}/{name}-parts"
        a = train(root, config, whole)
        half = dataclasses.replace(config, epochs=config.epochs // 2, checkpoint_every=1)
        train(root, half, parts)
        b = train(root, dataclasses.replace(config, resume=True, checkpoint_every=1), parts)
        if dist.get_rank() == 0:  # rank 0 wrote the models (the others may be ahead)
            results[name] = (_params(whole), _params(parts), a["final_loss"],
                             b["final_loss"], a["epochs"], b["epochs"])
    return results


def train_and_die(root: str, out: str, config, victim: int, epoch: int):
    r"""Trains; the victim rank exits abruptly in the middle of :obj:`epoch`
    (before it waits for its gradient all-reduce)."""
    import pyg_dist.train as train_module
    from pyg_dist.reducer import GradientReducer
    wait, calls = GradientReducer.wait, [0]

    def dying_wait(self):
        calls[0] += 1
        if calls[0] == epoch and dist.get_rank() == victim:
            os._exit(3)
        return wait(self)

    GradientReducer.wait = dying_wait
    return train_module.train(root, config, out)
