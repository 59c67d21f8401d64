"""``HaloCache``: how fresh the halo rows a layer aggregates must be."""
from typing import Any, Dict, Sequence, Tuple

from torch import Tensor

from pyg_dist.comm import HaloPlan
from pyg_dist.options import Option


class HaloCache:
    r"""Every distributed layer obtains the halo rows of its input through
    the model's cache (forward) and hands their gradients back through it
    (backward): :meth:`fetch` returns the rows of :obj:`x` (this rank's
    inner rows) that :obj:`plan` receives, with autograd.

    A cache decides *when* the rows travel: :class:`ExactCache` exchanges
    them now; stale caches return older values and exchange on their own
    schedule. Which rows a plan needs is the sampler's business, so any cache
    composes with any :mod:`~pyg_dist.sampler`: a cache that exchanges ahead
    (:attr:`lookahead` iterations) is given the plans of the coming
    iterations, drawn that far ahead.

    Caches serve training passes only: a forward under
    :func:`torch.no_grad` (evaluation, inference) is always exact.

    The training loop calls :meth:`step` after every iteration and
    :meth:`finish` when it stops, normally or by an exception, so that no
    exchange is left in flight.
    """
    #: Serves rows older than the current iteration (layers then exchange
    #: their input before dropout and drop the received rows themselves).
    stale: bool = False
    #: Plans must be drawn this many iterations ahead.
    lookahead: int = 0
    #: Its hyper-parameters, as the command line offers them.
    options: Tuple[Option, ...] = ()
    #: Serves an exchange that moves whole blocks
    #: (:attr:`~pyg_dist.comm.exchange.Exchange.whole_blocks`); which
    #: exchanges serve stale caches, each exchange says.
    whole_blocks: bool = False

    def __init__(self) -> None:
        self.iteration = 0
        self.ctx = None

    @classmethod
    def check(cls, **params) -> None:
        r"""Raises :class:`ValueError` for invalid hyper-parameters."""

    def attach(self, ctx) -> None:
        r"""Called once with the model's :class:`~pyg_dist.nn.HaloContext`."""
        self.ctx = ctx

    def fetch(self, key: str, x: Tensor, plan: HaloPlan,
              upcoming: Sequence[HaloPlan] = ()) -> Tensor:
        raise NotImplementedError

    def exact_fetch(self, key: str, x: Tensor, plan: HaloPlan) -> Tensor:
        r"""The rows of :obj:`plan` now, by the context's exchange."""
        ctx = self.ctx
        return ctx.exchange.fetch(ctx, key, x, plan, ctx.codec)

    def step(self) -> None:
        r"""Ends a training iteration."""
        self.iteration += 1

    def finish(self) -> None:
        r"""Completes every exchange in flight and drops the stale state."""

    def state_dict(self) -> Dict[str, Any]:
        r"""What a checkpoint keeps to resume exactly (stale rows, versions)."""
        return {"iteration": self.iteration}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.iteration = state["iteration"]

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.extra_repr()})"

    def extra_repr(self) -> str:
        return ""


class ExactCache(HaloCache):
    r"""Exchanges the rows of the current iteration, synchronously (the
    exact partition-parallel computation)."""
    whole_blocks = True

    def fetch(self, key: str, x: Tensor, plan: HaloPlan,
              upcoming: Sequence[HaloPlan] = ()) -> Tensor:
        return self.exact_fetch(key, x, plan)
