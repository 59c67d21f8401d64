r"""Multi-hop models under distribute(): epoch time, bytes and exactness.

APPNP (``K=10``: ten propagations, so ten halo exchanges forward and ten
backward per epoch) and SGC (``SGConv``, ``K=2``) on the embedded default
graph, trained full-graph with Adam:

1. **single-process PyG** on the whole graph (CSR ``adj_t``, the fastest
   form), with the machine's threads;
2. **pyg_dist** on ``--parts`` METIS partitions (one spawned process per
   part, ``cores // parts`` threads each).

Reported per model: mean epoch time over the epochs after the first, its
ratio to PyG, the halo bytes all ranks receive per epoch, the number of
exchanges per epoch, and the largest difference of the distributed model's
first-epoch outputs from PyG's, relative to their largest magnitude (the
exactness check). Results: a table and ``benchmarks/results/multihop.json``.

Usage::

    python benchmarks/multihop.py                       # 20K nodes, 4 parts
    python benchmarks/multihop.py --num-nodes 5000 --epochs 3
"""
import argparse
import json
import os
import os.path as osp
import platform
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch_geometric.nn import APPNP, SGConv
from torch_geometric.utils import to_torch_csr_tensor

import pyg_dist
from pyg_dist.datasets import load_default

RESULTS = osp.join(osp.dirname(osp.abspath(__file__)), "results", "multihop.json")


class APPNPNet(torch.nn.Module):
    r"""PyG's APPNP example: a 2-layer MLP, then K steps of propagation."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, K: int) -> None:
        super().__init__()
        self.lin1 = torch.nn.Linear(in_channels, hidden)
        self.lin2 = torch.nn.Linear(hidden, out_channels)
        self.prop = APPNP(K=K, alpha=0.1)

    def forward(self, x, edge_index):
        return self.prop(self.lin2(self.lin1(x).relu()), edge_index)


def build(name: str, in_channels: int, out_channels: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "APPNP K=10":
        return APPNPNet(in_channels, 64, out_channels, K=10)
    return SGConv(in_channels, out_channels, K=2)


def _epochs(model, x, adj, y, mask, num_train: int, epochs: int, step=None):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    times, first = [], None
    for _ in range(epochs):
        start = time.perf_counter()
        optimizer.zero_grad()
        out = model(x, adj)
        if first is None:
            first = out.detach().clone()
        loss = F.cross_entropy(out[mask], y[mask], reduction="sum") / num_train
        loss.backward()
        if step is not None:
            step(model)
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times, first


def _allreduce_grads(model: torch.nn.Module) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad)


def rank_run(root: str, name: str, epochs: int, num_classes: int):
    part = pyg_dist.DistData.load(root, dist.get_rank())
    model = pyg_dist.nn.distribute(build(name, part.num_features, num_classes), part)
    mask = part.train_mask
    num_train = torch.tensor(int(mask.sum()))
    dist.all_reduce(num_train)
    times, first = _epochs(model, part.x, part.adj_t, part.y, mask, int(num_train), epochs,
                           step=_allreduce_grads)
    # every epoch exchanges under the same keys: one per propagation and direction
    exchanges = sum(1 for k in model.comm_stats.bytes_recv if k != "gcn_norm")
    return {"times": times, "bytes": model.comm_stats.total_bytes_recv / epochs,
            "exchanges": exchanges, "n_id": part.n_id[:part.num_inner], "first": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-nodes", type=int, default=20_000)
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    data = load_default(num_nodes=args.num_nodes)
    num_classes = int(data.y.max()) + 1
    adj_t = to_torch_csr_tensor(data.edge_index.flip(0), size=(data.num_nodes, ) * 2)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        root = osp.join(workdir, "parts")
        pyg_dist.partition_graph(data, args.parts, root=root)
        for name in ("APPNP K=10", "SGC K=2"):
            model = build(name, data.num_features, num_classes)
            times, want = _epochs(model, data.x, adj_t, data.y, data.train_mask,
                                  int(data.train_mask.sum()), args.epochs)
            ranks = pyg_dist.spawn(rank_run, args.parts, (root, name, args.epochs,
                                                          num_classes), timeout=600)
            got = torch.cat([r["first"] for r in ranks])
            n_id = torch.cat([r["n_id"] for r in ranks])
            error = float((got - want[n_id]).abs().max() / want.abs().max())
            pyg_s = sum(times[1:]) / (len(times) - 1)
            dist_s = max(sum(r["times"][1:]) / (len(r["times"]) - 1) for r in ranks)
            rows.append({"model": name, "pyg_epoch_s": pyg_s, "dist_epoch_s": dist_s,
                         "ratio": dist_s / pyg_s, "bytes_per_epoch": sum(
                             r["bytes"] for r in ranks),
                         "exchanges_per_epoch": ranks[0]["exchanges"],
                         "max_rel_error": error})
    print(f"{args.num_nodes:,} nodes, {data.num_edges:,} edges, {args.parts} parts, "
          f"{os.cpu_count()} cores, {args.epochs} epochs")
    print("| model | PyG s/epoch | pyg_dist s/epoch | x PyG | halo MB/epoch | "
          "exchanges/epoch | max rel. error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['pyg_epoch_s']:.3f} | {r['dist_epoch_s']:.3f} | "
              f"{r['ratio']:.2f} | {r['bytes_per_epoch'] / 1e6:.2f} | "
              f"{r['exchanges_per_epoch']} | {r['max_rel_error']:.1e} |")
    os.makedirs(osp.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": {"cpus": os.cpu_count(), "processor": platform.processor(),
                               "torch": torch.__version__},
                   "args": vars(args), "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
