r"""ByteGNN's pipelined sampling: mini-batches sampled ahead of the trainer
by background workers, as many in flight as keep the trainer fed."""
import threading
import time
from typing import Any, Callable, Dict, Optional


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class SamplerPool:
    r"""Runs ``produce(job, worker)`` for jobs :math:`0, 1, 2, \dots` on
    :obj:`num_workers` background threads, ahead of a consumer that takes
    them in order with :meth:`get` (ByteGNN §4.2.1–4.2.2, simplified).

    Job :math:`j` always runs on worker :math:`j \bmod W` and each worker
    runs its jobs in order, so workers of different ranks that share a
    process group per worker issue their collectives in the same order
    whatever the timing.

    **Adaptive depth.** At most :attr:`target` jobs past the consumer's next
    one may be started. ByteGNN's coarse-grained scheduler launches a new
    sampling DAG when :math:`T_\mathrm{sample} / (T_\mathrm{train} \cdot
    Q_\mathrm{size})` is large; here, on every :meth:`get`, the depth grows
    by one when the consumer found the queue empty and had to wait (sampling
    is behind) and shrinks by one when the ready queue outlasts one sampling
    time (:math:`T_\mathrm{sample} < T_\mathrm{train} \cdot Q_\mathrm{size}`:
    over-supplied, sampling only competes with training for the CPU).
    :math:`T` are moving averages of the measured times.

    :meth:`report` gives the trainer's idle time (waiting in :meth:`get`),
    the mean ready-queue length it found and the mean depth.
    """

    def __init__(self, produce: Callable[[int, int], Any], num_workers: int,
                 adaptive: bool = True, momentum: float = 0.8, first_job: int = 0) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 (got {num_workers})")
        self.produce, self.num_workers, self.adaptive = produce, num_workers, adaptive
        self.momentum = momentum
        self.target = 1 if adaptive else num_workers
        self.next_job = first_job
        self.stop_at: Optional[int] = None  # once closing: jobs below it still run
        self.ready: Dict[int, Any] = {}
        self.error: Optional[BaseException] = None
        self.cond = threading.Condition()
        self.sample_time: Optional[float] = None
        self.train_time: Optional[float] = None
        self._returned: Optional[float] = None
        self.reset_report()
        self.threads = [threading.Thread(target=self._work, args=(w, first_job), daemon=True,
                                         name=f"pyg_dist-sampler-{w}")
                        for w in range(num_workers)]
        for t in self.threads:
            t.start()

    def _permitted(self, job: int) -> bool:
        if self.stop_at is not None:
            return job < self.stop_at
        return job < self.next_job + self.target

    def _work(self, worker: int, first_job: int) -> None:
        job = first_job + worker  # the same job-to-worker map on every rank
        while True:
            with self.cond:
                while not self._permitted(job):
                    if self.stop_at is not None or self.error is not None:
                        return
                    self.cond.wait()
            start = time.perf_counter()
            try:
                result = self.produce(job, worker)
            except BaseException as e:  # handed to the consumer, which raises it
                result = _Failure(e)
            with self.cond:
                self.ready[job] = result
                self.sample_time = self._average(self.sample_time,
                                                 time.perf_counter() - start)
                if isinstance(result, _Failure) and self.error is None:
                    self.error = result.error
                self.cond.notify_all()
            if isinstance(result, _Failure):
                return
            job += self.num_workers

    def _average(self, old: Optional[float], new: float) -> float:
        return new if old is None else self.momentum * old + (1 - self.momentum) * new

    def get(self, job: int) -> Any:
        r"""Job :obj:`job`'s result (the next one in order), waiting for it
        if needed; a worker's exception is raised here."""
        if job != self.next_job:
            raise ValueError(f"jobs are taken in order: expected {self.next_job}, got {job}")
        asked = time.perf_counter()
        with self.cond:
            queue = sum(1 for j in self.ready if j >= job)
            while job not in self.ready and self.error is None:
                self.cond.wait()
            result = self.ready.pop(job, None)
            idle = time.perf_counter() - asked
            if self._returned is not None:
                self.train_time = self._average(self.train_time, asked - self._returned)
            self._adapt(queue, idle)
            self.next_job = job + 1
            self.cond.notify_all()
        self._record(queue, idle)
        self._returned = time.perf_counter()
        if result is None or isinstance(result, _Failure):
            error = result.error if isinstance(result, _Failure) else self.error
            raise RuntimeError(f"sampling mini-batch {job} failed: {error}") from error
        return result

    def _adapt(self, queue: int, idle: float) -> None:
        if not self.adaptive or self.train_time is None or self.sample_time is None:
            return
        if queue == 0 and idle > 0.05 * self.train_time:  # the trainer starves
            self.target = min(self.target + 1, self.num_workers)
        elif queue > 0 and self.sample_time < self.train_time * queue:
            self.target = max(self.target - 1, 1)

    def reset_report(self) -> None:
        self.idle, self.gets, self.queue_sum, self.depth_sum = 0.0, 0, 0, 0

    def _record(self, queue: int, idle: float) -> None:
        self.idle += idle
        self.gets += 1
        self.queue_sum += queue
        self.depth_sum += self.target

    def report(self) -> Dict[str, float]:
        r"""Since :meth:`reset_report`: the consumer's idle seconds, the mean
        ready-queue length and the mean depth it found."""
        n = max(self.gets, 1)
        return {"idle": self.idle, "queue_len": self.queue_sum / n,
                "in_flight": self.depth_sum / n}

    def close(self, timeout: Optional[float] = None) -> None:
        r"""Stops the workers once every job any rank may have started runs
        (all jobs below the consumer's next one plus the largest depth), so
        workers of other ranks are never left waiting in a collective; ranks
        must close after taking the same number of jobs."""
        with self.cond:
            self.stop_at = self.next_job + self.num_workers
            self.cond.notify_all()
        for t in self.threads:
            t.join(timeout)
