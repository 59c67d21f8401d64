r"""How many CPU threads each rank of a node computes with: a scheduler's
or the user's share (``OMP_NUM_THREADS``) or this process' cores divided
among the local ranks, so that ranks side by side do not oversubscribe the
cores they share."""
import os

def available_cpus() -> int:
    r"""The cores this process may run on (its affinity mask: SLURM's
    ``--cpus-per-task``, ``taskset``), else all the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_threads(local_ranks: int) -> int:
    r"""Intra-op threads for each of :obj:`local_ranks` ranks on this node:
    ``OMP_NUM_THREADS`` when set (a scheduler's or the user's share of the
    node), else the cores of this process' affinity mask divided among the
    local ranks."""
    value = os.environ.get("OMP_NUM_THREADS")
    if value:
        try:
            threads = int(value)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ValueError(f"OMP_NUM_THREADS must be a whole number >= 1 (got '{value}')")
        return threads
    return max(1, available_cpus() // max(local_ranks, 1))
