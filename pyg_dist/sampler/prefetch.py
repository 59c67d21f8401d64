"""Plans drawn ahead of the training loop, optionally in a background thread."""
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Deque, List, Optional, Tuple

import torch.distributed as dist

from pyg_dist.comm import HaloPlan
from pyg_dist.metrics import CommStats
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
