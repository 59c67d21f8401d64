"""The end-to-end demo behind ``make demo`` / ``pyg-dist demo``."""
import json
import os.path as osp
import time
from typing import Optional

from pyg_dist.config import TrainConfig
from pyg_dist.train import train_single_process


def demo(workdir: str = "runs/demo", nproc: int = 4, epochs: int = 30,
         num_nodes: Optional[int] = None) -> dict:
    r"""Generates the embedded default graph, partitions it into
    :obj:`nproc` METIS parts, trains a 3-layer GraphSAGE with :obj:`nproc`
    processes, trains the same model in single-process PyG, and prints both
    side by side."""
    from pyg_dist.datasets import load_default
    from pyg_dist.launch import run_training
    from pyg_dist.partition import partition_graph

    kwargs = {"num_nodes": num_nodes} if num_nodes else {}
    data = load_default(osp.join(workdir, "data"), **kwargs)
    print(f"default graph: {data.num_nodes:,} nodes, {data.num_edges:,} edges, "
          f"{data.num_features} features, {int(data.y.max()) + 1} classes")
    root = osp.join(workdir, f"parts{nproc}")
    start = time.perf_counter()
    book = partition_graph(data, nproc, root=root)
    print(f"partitioned into {nproc} parts in {time.perf_counter() - start:.1f} s")
    print(book.summary())

    config = TrainConfig(model="sage", num_layers=3, hidden=64, dropout=0.5,
                         lr=0.01, epochs=epochs, progress=False,
                         overwrite=True)  # the demo's own scratch folder
    dist_summary = run_training(root, config, osp.join(workdir, "run"), nproc)
    print(f"\npyg_dist ({nproc} ranks), per-epoch metrics: "
          f"{osp.join(workdir, 'run', 'metrics.jsonl')}")
    with open(osp.join(workdir, "run", "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            print(f"epoch {r['epoch']:3d}  loss {r['loss']:.4f}  train {r['train_acc']:.4f}  "
                  f"val {r['val_acc']:.4f}  test {r['test_acc']:.4f}  time {r['time']:.2f}s "
                  f"(comm {r['time_comm']:.2f}s)  sent {r['bytes_sent'] / 2**20:.1f} MiB")
    single, _ = train_single_process(data, config)
    rows = [("single-process PyG", single), (f"pyg_dist x{nproc}", dist_summary)]
    print(f"\n{'':20} {'test acc':>9} {'best val':>9} {'epoch s':>8} {'comm s':>7} "
          f"{'peak MiB/rank':>14}")
    for name, s in rows:
        print(f"{name:20} {s['test_acc']:9.4f} {s['best_val_acc']:9.4f} "
              f"{s['epoch_time']:8.3f} {s['time_comm']:7.3f} "
              f"{s['peak_mem_bytes'] / 2**20:14.0f}")
    print(f"epoch time ratio pyg_dist/PyG: {dist_summary['epoch_time'] / single['epoch_time']:.2f}x "
          f"(on {nproc} ranks sharing this machine's cores)")
    return {"single": single, "distributed": dist_summary}
