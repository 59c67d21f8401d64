r"""``CohesiveBatchLoader``: CM-GCN's mini-batches over a partition."""
import os.path as osp
import shutil
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_dist.comm.stats import CommStats
from pyg_dist.data import DistData
from pyg_dist.distributed import sum_over_ranks
from pyg_dist.integrity import CorruptFileError, load_checked, save_checked
from pyg_dist.loader.base import Loader, LoaderInputs
from pyg_dist.loader.batch import TrainBatch
from pyg_dist.loader.cohesive.balance import (BATCH_PARTS_DIR, has_batch_parts,
                                              load_batch_part)
from pyg_dist.loader.cohesive.batch_partition import cohesive_batches
from pyg_dist.loader.cohesive.batch_plan import BatchGraph, batch_subgraph, sample_layers
from pyg_dist.loader.cohesive.cost import MODEL_KINDS, CostModel, HopGraph
from pyg_dist.partition.book import add_files, described, read_meta
from pyg_dist.sampler import BoundarySampler

BATCHES_FILE = "batches.pt"


def save_batches(root: str, batch_of: Tensor, cost: Optional[CostModel] = None) -> str:
    r"""Stores the batch of every node (original ids; ``-1``: in no batch)
    next to the partitions in :obj:`root`, with the cost model the batches
    minimise (its widths and constants, :func:`load_batch_cost`), and
    records its size and checksum in ``meta.json``."""
    read_meta(root)  # a partition directory, before anything is written
    path = osp.join(root, BATCHES_FILE)
    item = {"batch_of": batch_of.long().cpu()}
    if cost is not None:
        item["cost"] = cost.to_dict()
    shutil.rmtree(osp.join(root, BATCH_PARTS_DIR), ignore_errors=True)  # of older batches
    add_files(root, {BATCHES_FILE: save_checked(item, path)}, replace=BATCH_PARTS_DIR)
    return path


def _read_batches(root: str) -> dict:
    r"""``batches.pt`` of :obj:`root`, checked against the size and
    checksum ``meta.json`` records, and its batches against the graph: one
    entry per node, batch ids ``0..M-1`` with none empty, and as many
    nodes in batches as training nodes."""
    path = osp.join(root, BATCHES_FILE)
    meta = read_meta(root)
    if not osp.exists(path):
        raise FileNotFoundError(f"'{path}' is missing: compute the batches with "
                                f"pyg_dist.loader.cohesive_batches and save_batches")
    item = load_checked(path, described(root, meta, BATCHES_FILE))
    batch_of = item.get("batch_of") if isinstance(item, dict) else None
    if not isinstance(batch_of, Tensor):
        raise CorruptFileError(f"'{path}' is not a pyg_dist batch file")
    parts = meta.get("parts", [])
    num_train = (sum(s["num_train"] for s in parts)
                 if parts and all("num_train" in s for s in parts) else None)
    check_batches(batch_of, meta["num_nodes"], num_train, path)
    return item


def check_batches(batch_of: Tensor, num_nodes: int, num_train: Optional[int],
                  where: str) -> None:
    r"""Refuses, naming :obj:`where`, a :obj:`batch_of` that does not hold
    one batch id (or ``-1``) per node of a :obj:`num_nodes`-node graph,
    whose ids are not ``0..M-1`` with every batch non-empty, or (given
    :obj:`num_train`) whose batches do not hold that many nodes."""
    def bad(what: str):
        return CorruptFileError(f"'{where}' is corrupt: {what}")

    if batch_of.dtype != torch.long or batch_of.dim() != 1 or batch_of.numel() != num_nodes:
        raise bad(f"batch_of is not one int64 entry per node ({num_nodes} nodes)")
    assigned = batch_of[batch_of >= 0]
    if int(batch_of.min()) < -1 or assigned.numel() == 0:
        raise bad("batch ids below -1, or no node in a batch")
    sizes = torch.bincount(assigned)
    if bool((sizes == 0).any()):
        raise bad(f"batch ids run to {sizes.numel() - 1} but batch "
                  f"{int((sizes == 0).nonzero()[0])} holds no node")
    if num_train is not None and assigned.numel() != num_train:
        raise bad(f"its batches hold {assigned.numel()} nodes, the graph has {num_train} "
                  f"training nodes")


def load_batches(root: str) -> Tensor:
    return _read_batches(root)["batch_of"]


def load_batch_cost(root: str) -> Optional[CostModel]:
    r"""The cost model the stored batches minimise (widths, constants and
    where they were measured); ``None`` for batch files written before
    they held one."""
    return _cost_of(_read_batches(root), root)


def _cost_of(item: dict, root: str) -> Optional[CostModel]:
    if "cost" not in item:
        return None
    return CostModel.from_dict(item["cost"], where=f"'{osp.join(root, BATCHES_FILE)}'")


def check_batch_cost(cost: CostModel, num_layers: int, num_features: int) -> None:
    r"""Refuses a cost model whose widths do not fit a
    :obj:`num_layers`-layer model over :obj:`num_features` features."""
    if cost.num_layers != num_layers or int(cost.dims[0]) != num_features:
        raise ValueError(f"the cost model's widths {list(cost.dims)} do not fit a "
                         f"{num_layers}-layer model over {num_features} features")


def gather_cohesive_batches(data: DistData, num_batches: int, num_layers: int,
                            seed: int = 0, group=None, cost: Optional[CostModel] = None,
                            hidden: int = 64, model: str = "sage") -> Tensor:
    r""":func:`~pyg_dist.loader.cohesive_batches` of the training nodes of
    the whole graph, computed on rank 0 from every rank's in-edges and
    training nodes (original ids) and broadcast: the batch of every node
    (``-1``: none). A collective.

    The batches minimise :obj:`cost`, or without it the cost model rank 0
    measures (:meth:`CostModel.calibrate`) for a :obj:`model`-kind model of
    widths :math:`[F, h, \dots, h, C]` with :math:`h` = :obj:`hidden` (the
    model that will train; 64 is :class:`~pyg_dist.TrainConfig`'s default)
    on the graph's mean in-degree."""
    return _gather_batches(data, num_batches, num_layers, seed, group, cost, hidden,
                           model)[0]


def _gather_batches(data: DistData, num_batches: int, num_layers: int, seed: int, group,
                    cost: Optional[CostModel], hidden: int, model: str
                    ) -> Tuple[Tensor, CostModel]:
    r""":func:`gather_cohesive_batches` and the cost model it used (on
    every rank)."""
    if cost is not None:  # on every rank, before any collective
        check_batch_cost(cost, num_layers, data.num_features)
    if hidden < 1:
        raise ValueError(f"hidden must be >= 1 (got {hidden})")
    if model not in MODEL_KINDS:
        raise ValueError(f"Unknown model kind '{model}' (choose from "
                         f"{', '.join(MODEL_KINDS)})")
    inner = data.n_id[:data.num_inner].cpu()
    mine = (data.n_id[data.edge_index].cpu(), inner[data.train_mask.cpu()],
            data.num_features, data.y.size(1) if data.y.dim() > 1 else
            int(data.y.max()) + 1 if data.y.numel() else 0)
    root = 0 if group is None else dist.get_global_rank(group, 0)
    if dist.is_initialized():
        gathered = [None] * dist.get_world_size(group) if dist.get_rank(group) == 0 else None
        dist.gather_object(mine, gathered, dst=root, group=group)
    else:
        gathered = [mine]
    batch_of = torch.full((data.num_global_nodes, ), -1, dtype=torch.long)
    used = [None]
    if gathered is not None:
        edge_index = torch.cat([g[0] for g in gathered], 1)
        nodes = torch.cat([g[1] for g in gathered]).sort().values
        classes = max(g[3] for g in gathered)
        if cost is None:
            dims = [data.num_features] + [hidden] * (num_layers - 1) + [classes]
            degree = max(edge_index.size(1) / max(data.num_global_nodes, 1), 1.0)
            cost = CostModel.calibrate(dims, model=model, degree=degree)
        graph = HopGraph(edge_index, data.num_global_nodes, cost)
        batch_of[nodes] = cohesive_batches(graph, edge_index, nodes, num_batches, seed=seed)
        used = [cost.to_dict()]
    batch_of = batch_of.to(data.n_id.device)
    if dist.is_initialized():
        dist.broadcast(batch_of, src=root, group=group)
        dist.broadcast_object_list(used, src=root, group=group)
    return batch_of, CostModel.from_dict(used[0])


class CohesiveBatchLoader(Loader):
    r"""Iterates over the mini-batches of an epoch on every rank in step:
    every training node is in exactly one batch, the batch order is
    shuffled per epoch from :obj:`seed` (the same on all ranks), and each
    batch comes with its computational graph (:func:`batch_subgraph`: the
    nodes it touches on this rank and its layer plans), built once and
    reused every epoch, so a batch computes and exchanges only what it
    needs.

    Args:
        data: this rank's partition.
        batch_of: the batch of every node of the whole graph by original id
            (``-1``: none), e.g. from :func:`~pyg_dist.loader.cohesive_batches`
            (``pyg-dist partition --num-batches`` stores it).
        num_layers: :math:`K`, the model's number of message-passing layers.
        num_batches: without :obj:`batch_of`, split the training nodes into
            this many cohesive batches now (:func:`gather_cohesive_batches`:
            the ranks send their edges to rank 0, which batches the whole
            graph; fine for graphs one process can hold, else precompute).
        seed: the shuffling seed.
        shuffle: shuffle the batch order per epoch.
        balanced_root: the partition directory holding balanced batch
            parts (:func:`~pyg_dist.loader.cohesive.balance.save_batch_parts`): each
            batch then runs on its cost-balanced split over the ranks
            instead of on the nodes' owners (§III-B).
        sampler: builds a :class:`~pyg_dist.sampler.BoundarySampler` for a
            batch's partition (e.g. ``lambda data: BNSSampler(data, p=0.1)``);
            every time a batch runs, its layer plans are restricted to a
            fresh draw (:func:`~pyg_dist.loader.cohesive.batch_plan.sample_layers`).
        cost: with :obj:`num_batches`, the cost model the batches minimise;
            without it rank 0 measures one (:meth:`CostModel.calibrate`) for
            the model that will train: kind :obj:`model` (``"sage"``,
            ``"gcn"``, ``"gin"``, ``"gat"``), width :obj:`hidden`. The cost
            model used is :attr:`cost` (that of ``batches.pt`` for stored
            batches; ``None`` when unknown).
    """

    inductive = False
    observing_samplers = False  # the vr sampler learns per layer over the whole partition
    stale_caches = False
    feature_caches = ()
    precompute = False
    refusal = ("loader 'cohesive' runs mini-batches with fresh halo rows: caches, the vr "
               "sampler (it learns per layer over the whole partition) and "
               "precompute_layer0 do not combine with it")
    refusal_inductive = ("inductive training runs with the full-graph or the neighbour "
                         "loader (cohesive batches are made on the whole graph)")

    def __init__(self, data: DistData, batch_of: Optional[Tensor] = None,
                 num_layers: Optional[int] = None, seed: int = 0,
                 shuffle: bool = True, group=None, stats: Optional[CommStats] = None,
                 balanced_root: Optional[str] = None,
                 sampler: Optional[Callable[[DistData], BoundarySampler]] = None,
                 num_batches: Optional[int] = None, cost: Optional[CostModel] = None,
                 hidden: int = 64, model: str = "sage") -> None:
        if num_layers is None or num_layers < 1:
            raise ValueError(f"num_layers must be >= 1 (got {num_layers})")
        self.cost = cost
        if batch_of is None:
            if num_batches is None:
                raise ValueError("give batch_of (precomputed batches) or num_batches")
            batch_of, self.cost = _gather_batches(data, num_batches, num_layers, seed, group,
                                                  cost, hidden, model)
        elif num_batches is not None and num_batches != int(batch_of.max()) + 1:
            raise ValueError(f"batch_of holds {int(batch_of.max()) + 1} batches, "
                             f"not num_batches={num_batches}")
        if batch_of.numel() != data.num_global_nodes:
            raise ValueError(f"batch_of has {batch_of.numel()} entries, the graph "
                             f"{data.num_global_nodes} nodes")
        self.data, self.num_layers, self.seed, self.shuffle = data, num_layers, seed, shuffle
        self.group, self.stats = group, stats
        self.balanced_root = balanced_root
        self.sampler = sampler
        self._samplers: Dict[int, BoundarySampler] = {}
        self.iteration = 0  # batches run so far: the samplers' draw index
        self.num_batches = int(batch_of.max()) + 1
        self.batch_of = batch_of.to(data.n_id.device)[data.n_id[:data.num_inner]]
        self.epoch = 0
        self._graphs: Dict[int, BatchGraph] = {}
        self._features: Dict[int, Tensor] = {}  # balanced parts' input features
        self._counts: dict = {}

    def __len__(self) -> int:
        return self.num_batches

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> List[int]:
        if not self.shuffle:
            return list(range(self.num_batches))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_batches, generator=g).tolist()

    @classmethod
    def from_inputs(cls, inputs: LoaderInputs) -> "CohesiveBatchLoader":
        root = inputs.root
        item = _read_batches(root)
        loader = cls(inputs.data, item["batch_of"], inputs.context.num_layers,
                     seed=inputs.seed, stats=inputs.stats, sampler=inputs.make_sampler,
                     balanced_root=root if has_batch_parts(root) else None,
                     cost=_cost_of(item, root))
        train_mask = getattr(inputs.data, "train_mask", None)
        if train_mask is not None and not torch.equal(loader.batch_of >= 0,
                                                      train_mask.to(loader.batch_of.device)):
            raise CorruptFileError(f"'{osp.join(root, BATCHES_FILE)}' does not fit the "
                                   f"partition: the nodes in its batches are not rank "
                                   f"{inputs.data.rank}'s training nodes")
        return loader

    def batch(self, index: int) -> TrainBatch:
        if index not in self._graphs:  # a collective: all ranks build it in step
            if self.balanced_root is None:
                graph = batch_subgraph(self.data, self.batch_of == index, self.num_layers,
                                       self.group, self.stats)
            else:  # the batch's balanced part holds the rows this rank computes
                part = load_batch_part(self.balanced_root, index, self.data.rank,
                                       self.num_layers).to(self.data.n_id.device)
                graph = batch_subgraph(part, part.batch_mask, self.num_layers,
                                       self.group, self.stats)
                self._features[index] = part.x
            self._graphs[index] = graph
        graph = self._graphs[index]
        x = self._features.get(index, self.data.x)[graph.data.inner_id]
        plans = graph.plans
        if self.sampler is not None:
            if index not in self._samplers:
                self._samplers[index] = self.sampler(graph.data)
            plans = sample_layers(plans, self._samplers[index].plan(self.iteration))
        data = graph.data
        targets = graph.targets & data.train_mask
        return TrainBatch(x=x, adj_t=data.adj_t, y=data.y, targets=targets,
                          loss_count=self.count(index, targets),
                          loss_weight=1.0 / self.num_batches, plans=plans,
                          halo_rows=plans[0].num_recv, edge_index=data.edge_index,
                          data=data, n_id=data.n_id[:data.num_inner],
                          extra={"index": index})

    def count(self, index: int, mask: Tensor) -> float:
        r"""The number of nodes of :obj:`mask` in batch :obj:`index` over all
        ranks (a loss normaliser), computed once per batch."""
        if index not in self._counts:
            self._counts[index] = max(float(sum_over_ranks(mask.sum().double())), 1.0)
        return self._counts[index]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "iteration": self.iteration}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.iteration = state["epoch"], state["iteration"]

    def __iter__(self) -> Iterator[TrainBatch]:
        for index in self.order():
            yield self.batch(index)
            self.iteration += 1
        self.epoch += 1
