"""ByteGNN's block partitioner: blocks by multi-source BFS, greedy
assignment balancing train/val/test, and the K-hop remote volume."""
import torch

import pyg_dist
from pyg_dist.partition.block import (block_assignment, khop_remote_volume,
                                      neighbourhood_blocks)
from pyg_dist.partition.metis import random_assignment


def test_blocks_keep_the_first_center_that_reaches_them():
    # path 0 - 1 - 2 - 3 - 4 - 5 with centers 0 and 5, two hops
    edge_index = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    block = neighbourhood_blocks(edge_index, 6, torch.tensor([0, 5]), 2)
    assert block.tolist() == [0, 0, 0, 1, 1, 1]
    # centers 0 and 4 both reach node 2 in hop 2: the first center keeps it
    block = neighbourhood_blocks(edge_index, 6, torch.tensor([0, 4]), 2)
    assert block.tolist() == [0, 0, 0, 1, 1, 1]
    block = neighbourhood_blocks(edge_index, 6, torch.tensor([4, 0]), 2)
    assert block.tolist() == [1, 1, 0, 0, 0, 0]
    block = neighbourhood_blocks(edge_index, 7, torch.tensor([0]), 1)
    assert block.tolist()[:2] == [0, 0] and sorted(block.tolist()[2:]) == [1, 2, 3, 4, 5]


def _graph():
    r"""A community graph whose labelled nodes are few (8% train, 2% val,
    5% test), as in the graphs ByteGNN partitions."""
    from tests.conftest import small_graph
    data = small_graph(num_nodes=600, seed=4)
    r = torch.rand(data.num_nodes, generator=torch.Generator().manual_seed(0))
    data.train_mask, data.val_mask, data.test_mask = r < 0.08, (r >= 0.08) & (r < 0.1), \
        (r >= 0.1) & (r < 0.15)
    return data


def test_every_node_once_balanced_and_deterministic(tmp_path):
    data = _graph()
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask], 1)
    a = block_assignment(data.edge_index, data.num_nodes, masks, 4, num_hops=2)
    b = block_assignment(data.edge_index, data.num_nodes, masks, 4, num_hops=2)
    assert torch.equal(a, b) and a.numel() == data.num_nodes
    assert a.min() == 0 and a.max() == 3  # every node in exactly one of 4 parts
    for column in range(3):
        counts = torch.bincount(a[masks[:, column]], minlength=4).double()
        assert counts.max() <= 1.05 * counts.mean() + 1, (column, counts)
    # same on-disk format: it loads like any partition
    book = pyg_dist.partition_graph(data, 4, method="block", root=str(tmp_path))
    assert book.meta["method"] == "block" and book.meta["block_hops"] == 2
    assert pyg_dist.DistData.load(str(tmp_path), 0, world_size=4).num_inner > 0


def test_blocks_keep_sampling_local():
    r"""A K-hop neighbourhood around the training nodes reaches fewer remote
    nodes with block partitions than with random ones."""
    data = _graph()
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask], 1)
    block = block_assignment(data.edge_index, data.num_nodes, masks, 4, num_hops=2)
    rand = random_assignment(data.num_nodes, 4)
    volume = [sum(khop_remote_volume(data.edge_index, data.num_nodes, a, data.train_mask, 1))
              for a in (block, rand)]
    assert volume[0] < 0.7 * volume[1], volume
