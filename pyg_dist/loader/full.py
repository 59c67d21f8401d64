r"""``FullGraphLoader``: full-graph partition-parallel epochs, with the halo
plans drawn ahead of the training loop (``PlanPrefetcher``), optionally in
a background thread."""
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Deque, Iterator, List, Optional, Tuple

import torch.distributed as dist

from pyg_dist.comm import HaloPlan
from pyg_dist.comm.stats import CommStats
from pyg_dist.data import DistData
from pyg_dist.distributed import sum_over_ranks
from pyg_dist.loader.base import Loader, LoaderInputs
from pyg_dist.loader.batch import TrainBatch
from pyg_dist.options import Option
from pyg_dist.sampler.base import BoundarySampler


class PlanPrefetcher:
    r"""Hands the training loop the plan of iteration :math:`t` together
    with those of iterations :math:`t+1, \dots, t+\tau` (a cache with
    :attr:`~pyg_dist.cache.HaloCache.lookahead` :math:`\tau` exchanges their
    rows ahead).

    With :obj:`background`, the plan of iteration :math:`t+\tau+1` is drawn
    in a worker thread while iteration :math:`t` computes (PSC-GCN samples
    ahead in parallel with training). The sampler's main-thread part,
    :meth:`~pyg_dist.sampler.BoundarySampler.prepare`, still runs in order
    in the training loop, so a run stays deterministic; the sampler's own
    collectives go to a process group of their own (gloo), and its bytes are
    added to :obj:`stats` when its plan is used.
    """

    def __init__(self, sampler: BoundarySampler, lookahead: int, background: bool = False,
                 stats: Optional[CommStats] = None) -> None:
        self.sampler, self.lookahead, self.stats = sampler, lookahead, stats
        self.pending: Deque[Future] = deque()
        self.iteration = 0
        self.executor: Optional[ThreadPoolExecutor] = None
        self.group = None
        if background:
            if sampler.device.type != "cpu":
                raise ValueError("background sampling runs its collectives on gloo: "
                                 "CPU partitions only")
            if dist.is_initialized() and dist.get_world_size() > 1:
                self.group = sampler.group = dist.new_group(backend="gloo")
            sampler.stats = CommStats()
            self.executor = ThreadPoolExecutor(1, thread_name_prefix="pyg_dist-sampler")

    def _submit(self) -> None:
        draw = self.sampler.prepare(self.iteration)
        self.iteration += 1
        if self.executor is None:
            future: Future = Future()
            future.set_result((draw(), 0, 0))
        else:
            future = self.executor.submit(self._draw, draw)
        self.pending.append(future)

    def _draw(self, draw) -> Tuple[HaloPlan, int, int]:
        stats = self.sampler.stats
        stats.reset()
        plan = draw()
        return plan, stats.total_bytes_sent, stats.total_bytes_recv

    def next(self) -> Tuple[HaloPlan, List[HaloPlan]]:
        r"""``(plan of this iteration, plans of the next lookahead ones)``."""
        while len(self.pending) <= self.lookahead:
            self._submit()
        plan, sent, recv = self.pending.popleft().result()
        if self.stats is not None and (sent or recv):
            self.stats.add_bytes("plan", sent, recv)
        upcoming = [future.result()[0] for future in self.pending]
        if self.executor is not None:  # the next plan is drawn while this one trains
            self._submit()
        return plan, upcoming

    def state_dict(self) -> dict:
        r"""The iterations whose plans were used (those drawn ahead are drawn
        again on resume: plans are functions of the iteration)."""
        return {"iteration": self.iteration - len(self.pending)}

    def load_state_dict(self, state: dict) -> None:
        if self.pending:
            raise RuntimeError("load_state_dict before the first plan is drawn")
        self.iteration = state["iteration"]

    def close(self) -> None:
        r"""Waits for the plans in flight (their collectives must complete on
        every rank) and releases the thread and the sampler's group."""
        try:
            for future in self.pending:
                future.result()
        finally:
            self.pending.clear()
            if self.executor is not None:
                self.executor.shutdown()
                self.executor = None
            if self.group is not None:
                dist.destroy_process_group(self.group)
                self.group = None


class FullGraphLoader(Loader):
    r"""One :class:`~pyg_dist.loader.TrainBatch` per epoch: the whole
    partition (its input features, adjacency and train nodes) with the halo
    plan that :obj:`sampler` draws for the iteration, and the plans of the
    next :obj:`lookahead` iterations (see :class:`PlanPrefetcher`). The
    loss is normalised by the train nodes of all ranks, so the summed
    gradients equal single-process full-graph training.

    Args:
        data: this rank's partition.
        sampler: draws each iteration's plan (attached to the model).
        lookahead: plans drawn ahead (the cache's
            :attr:`~pyg_dist.cache.HaloCache.lookahead`).
        background: draw them in a background thread (CPU only).
        stats: counts the sampler's bytes and times the drawing
            (``sample``; its own collectives count as ``comm``).
    """
    full_graph = True
    options = (Option("background", True, "draw the plans of a pipelined cache in the "
                      "training loop (default: in a background thread, on CPU)",
                      flag="--no-background-sampling",
                      switch=False, run_control=True), )

    def __init__(self, data: DistData, sampler: BoundarySampler, lookahead: int = 0,
                 background: bool = False, stats: Optional[CommStats] = None) -> None:
        self.data = data
        self.stats = stats if stats is not None else CommStats()
        self.prefetcher = PlanPrefetcher(sampler, lookahead, background, self.stats)
        self.num_train = int(sum_over_ranks(data.train_mask.sum().double())) or 1

    @classmethod
    def from_inputs(cls, inputs: LoaderInputs, background: bool = True) -> "FullGraphLoader":
        lookahead = inputs.context.cache.lookahead
        return cls(inputs.data, inputs.sampler, lookahead, stats=inputs.stats,
                   background=background and lookahead > 0 and inputs.device.type == "cpu")

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[TrainBatch]:
        stats, data = self.stats, self.data
        comm_before = stats.time["comm"]
        with stats.timer("sample"):  # plans are drawn as far ahead as the cache exchanges
            plan, upcoming = self.prefetcher.next()
        # Waiting in the sampler's own collective counts as communication.
        stats.time["sample"] -= stats.time["comm"] - comm_before
        yield TrainBatch(x=data.x, adj_t=data.adj_t, y=data.y, targets=data.train_mask,
                         loss_count=self.num_train, plans=plan, upcoming=upcoming,
                         input_features=True, halo_rows=plan.num_recv,
                         edge_index=data.edge_index, data=data,
                         n_id=data.n_id[:data.num_inner])

    def state_dict(self) -> dict:
        return self.prefetcher.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.prefetcher.load_state_dict(state)

    def close(self) -> None:
        self.prefetcher.close()
