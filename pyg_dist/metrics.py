"""Peak memory per rank (and, below, the epoch metrics of a run)."""
import resource
import torch


def reset_peak_memory(device: torch.device = torch.device("cpu")) -> None:
    r"""Starts a new peak-memory window (e.g. per epoch): resets CUDA's peak
    allocation counter, or on Linux the process' resident-set high-water
    mark (``/proc/self/clear_refs``); elsewhere the peak stays the
    process-lifetime one."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory_bytes(device: torch.device = torch.device("cpu")) -> int:
    r"""Peak memory of this process since the last :func:`reset_peak_memory`:
    allocated GPU memory on CUDA, the resident set size (RSS) high-water
    mark on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
