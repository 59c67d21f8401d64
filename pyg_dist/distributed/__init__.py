r"""Process groups and the processes that form them, one concern a module:

- :mod:`~pyg_dist.distributed.group`: set-up (:func:`init`), the device,
  free ports and collectives over every rank;
- :mod:`~pyg_dist.distributed.heartbeat`: naming the rank that was lost;
- :mod:`~pyg_dist.distributed.signals`: stop signals, and ranks that die
  with their launcher;
- :mod:`~pyg_dist.distributed.placement`: CPU threads per rank;
- :mod:`~pyg_dist.distributed.forkserver`: where :func:`spawn`'s ranks
  start from;
- :mod:`~pyg_dist.distributed.spawner`: :func:`spawn` and its one-line
  errors.

Every public name is importable from here."""
from pyg_dist.distributed.group import (DEFAULT_TIMEOUT, NoFreePortError, default_backend,
                                        device, free_port, gather_over_ranks, init,
                                        max_over_ranks, new_gloo_group, sum_over_ranks,
                                        under_torchrun)
from pyg_dist.distributed.heartbeat import (Heartbeat, RankLostError, lost_ranks,
                                            name_lost_ranks, stop_heartbeat)
from pyg_dist.distributed.placement import available_cpus, rank_threads
from pyg_dist.distributed.signals import (STOP_SIGNALS, Interrupted, die_with_parent,
                                          handling_stop_signals, starting_ranks,
                                          stop_at_epoch_end, stop_requested, stop_signal)
from pyg_dist.distributed.forkserver import (FORKSERVER_IGNORES_ENV, FORKSERVER_PRELOAD,
                                             START_METHOD_ENV)
from pyg_dist.distributed.spawner import (FAILURE_GRACE, STOP_GRACE, STOPPED_GRACE,
                                          SpawnError, died_message, dumps, is_stopped,
                                          silent_failure, spawn)

__all__ = [
    "DEFAULT_TIMEOUT", "NoFreePortError", "default_backend", "device", "free_port",
    "gather_over_ranks", "init", "max_over_ranks", "new_gloo_group", "sum_over_ranks",
    "under_torchrun", "Heartbeat", "RankLostError", "lost_ranks", "name_lost_ranks",
    "stop_heartbeat", "available_cpus", "rank_threads", "STOP_SIGNALS", "Interrupted",
    "die_with_parent", "handling_stop_signals", "starting_ranks", "stop_at_epoch_end",
    "stop_requested", "stop_signal", "FORKSERVER_IGNORES_ENV", "FORKSERVER_PRELOAD",
    "START_METHOD_ENV", "FAILURE_GRACE", "STOP_GRACE", "STOPPED_GRACE", "SpawnError",
    "died_message", "dumps", "is_stopped", "silent_failure", "spawn",
]
