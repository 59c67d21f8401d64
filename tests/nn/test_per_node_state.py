"""Per-node state (an embedding or a buffer with one row per node) and
another rank's partition are refused by distribute() before any work: a
rank's rows are its own nodes in partition order, so a table indexed by row
position would read other nodes' rows."""
import torch
import torch.distributed as dist
from torch_geometric.nn import SAGEConv

import pyg_dist


class _Embedded(torch.nn.Module):
    r"""Learnable node embeddings, indexed by row position, then a conv
    (a common PyG pattern in one process)."""

    def __init__(self, num_embeddings: int, channels: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(num_embeddings, 4)
        self.conv = SAGEConv(channels + 4, 3)

    def forward(self, x, edge_index):
        rows = torch.arange(x.size(0)) % self.emb.num_embeddings
        return self.conv(torch.cat([x, self.emb(rows)], -1), edge_index)


class _Biased(torch.nn.Module):
    r"""A user module with a per-node bias buffer."""

    def __init__(self, num_nodes: int, channels: int) -> None:
        super().__init__()
        self.conv = SAGEConv(channels, 3)
        self.register_buffer("node_bias", torch.zeros(num_nodes, 3))

    def forward(self, x, edge_index):
        return self.conv(x, edge_index) + self.node_bias[:x.size(0)]


def _distribute(root: str, rank_of_part):
    part = pyg_dist.DistData.load(root, dist.get_rank() if rank_of_part is None
                                  else rank_of_part)
    n, c = part.num_global_nodes, part.num_features
    results = {}
    for name, model in (("embedding", _Embedded(n, c)), ("buffer", _Biased(n, c)),
                        ("categories", _Embedded(7, c))):
        try:
            pyg_dist.nn.distribute(model, part)
            results[name] = "accepted"
        except (NotImplementedError, ValueError) as e:
            results[name] = str(e)
    return results


def test_per_node_state_is_refused_and_other_tables_kept(graph, tmp_path):
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    for results in pyg_dist.spawn(_distribute, 2, (str(tmp_path), None), timeout=60):
        assert f"'emb' (Embedding): {graph.num_nodes} embeddings, one per node" \
            in results["embedding"], results
        assert f"'node_bias' has {graph.num_nodes} rows, one per node" in results["buffer"]
        assert results["categories"] == "accepted"


def _own_or_other(root: str, _):
    return _distribute(root, 1 - dist.get_rank())


def test_another_ranks_partition_is_refused(graph, tmp_path):
    pyg_dist.partition_graph(graph, 2, root=str(tmp_path))
    for rank, results in enumerate(pyg_dist.spawn(_own_or_other, 2, (str(tmp_path), None),
                                                  timeout=60)):
        assert results["categories"] == (f"distribute() was given partition {1 - rank} of 2, "
                                         f"but this is rank {rank} of 2: load this rank's own "
                                         f"(DistData.load(root, dist.get_rank()))")


class _Weighted(torch.nn.Module):
    r"""A user layer keeping its weight as [in, out]."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(channels, 3))


def test_a_weight_over_one_hot_features_is_not_per_node_state():
    r"""With one-hot node features (x = I, as on small classic graphs) a
    weight has one row per node and per feature alike: it is kept; a
    buffer of one row per node is not."""
    from pyg_dist.nn.support import per_node_refusal
    assert per_node_refusal(_Weighted(34), num_nodes=34, num_features=34) is None
    assert "one per node" in per_node_refusal(_Weighted(34), num_nodes=34, num_features=8)
    assert "one per node" in per_node_refusal(_Biased(34, 34), num_nodes=34, num_features=34)
