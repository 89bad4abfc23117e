"""Dynamic batching for models that take a batch (classifiers): Triton's dynamic batcher, in pure Python.

Items queue in a :class:`~runtime.serving.scheduler.Scheduler` (priority classes, per-class bounds, deadlines). One worker
thread takes the first item, then collects more until ``max_batch`` items or until ``max_wait_ms`` after that first
item was queued, whichever comes first, and calls ``run(items) -> results`` once for the whole batch. Each caller
holds a ``concurrent.futures.Future`` for its own result.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, Generic, TypeVar

from runtime.errors import BackendError, BadInput, Cancelled, DeadlineExceeded, QueueFull
from runtime.serving.scheduler import DEFAULT_SERVICE_S, MAX_RETRY_AFTER_S, Job, Priority, Scheduler

log = logging.getLogger(__name__)

X = TypeVar("X")
Y = TypeVar("Y")


def _fail(future: Future, error: BaseException) -> None:
    """Fail a future unless it is already settled (a caller may cancel it at any moment)."""
    try:
        future.set_exception(error)
    except InvalidStateError:
        pass


class DynamicBatcher(Generic[X, Y]):
    """One worker thread batching ``submit``-ted items into ``run`` calls. Thread-safe; ``close()`` when done."""

    def __init__(self, run: Callable[[list[X]], list[Y]], *, max_batch: int = 8, max_wait_ms: float = 5,
                 max_queued: int = 64, name: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise BadInput(f"max_batch must be a positive integer, not {max_batch!r}")
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, (int, float)) or not 0 <= max_wait_ms < 3.6e6:
            raise BadInput(f"max_wait_ms must be a number of milliseconds from 0 to 3600000, not {max_wait_ms!r}")
        self.run = run
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.name = name or "batcher"
        self.clock = clock
        self.scheduler = Scheduler(max_queued=max_queued, clock=clock)
        self.scheduler.on_drop = self._dropped
        self._lock = threading.Lock()
        self._stats = {"batches": 0, "items": 0, "failed_batches": 0, "expired": 0, "cancelled": 0}
        self._worker = threading.Thread(target=self._loop, name=f"edgerun-{self.name}", daemon=True)
        self._worker.start()

    # -- the caller's side ------------------------------------------------------------------------------------------

    def submit(self, item: X, *, priority: Priority = Priority.INTERACTIVE, deadline: float | None = None) -> Future:
        """Queue one item; its future gets ``run``'s result for it, or the error. QueueFull is raised at once when
        the item's class is full, Cancelled once closed; an item already past its deadline fails with
        DeadlineExceeded without being queued. Cancelling the future takes the item out of the queue."""
        future: Future = Future()
        priority = Priority.parse(priority) if isinstance(priority, str) else Priority(priority)
        job = Job(payload=(item, future), priority=priority, deadline=deadline)
        if job.expired(self.clock()):
            self._count("expired")
            _fail(future, DeadlineExceeded(f"{self.name}: the item's deadline had passed before it was queued"))
            return future
        future.add_done_callback(lambda f: job.cancel() if f.cancelled() else None)
        self.scheduler.submit(job)  # QueueFull / Cancelled propagate to the caller
        return future

    def check_room(self, priority: Priority = Priority.INTERACTIVE) -> None:
        """QueueFull now when ``priority``'s class is at its bound, so that a caller refuses before it pays for
        its item (an image's decode). ``submit`` still checks: a place may be taken in between."""
        priority = Priority.parse(priority) if isinstance(priority, str) else Priority(priority)
        depth, bound = self.scheduler.depth(), self.scheduler.bounds[priority]
        if depth[priority] >= bound:
            self.scheduler.sweep()  # cancelled and expired items hold no places (as in Scheduler.submit)
            depth = self.scheduler.depth()
        if depth[priority] < bound:
            return
        rate = self.scheduler.service_rate()
        ahead = 1 + sum(n for p, n in depth.items() if p < priority)  # as Scheduler.submit estimates it
        retry_after = min(MAX_RETRY_AFTER_S, ahead / rate if rate else ahead * DEFAULT_SERVICE_S)
        raise QueueFull(f"{self.name}: the {priority.name.lower()} queue is full ({bound} queued); "
                        f"retry after {retry_after:.3g} s", retry_after)

    def stats(self) -> dict[str, Any]:
        """batches, items (run), mean_batch_size, failed_batches, expired, cancelled, queued per class, and the
        limits (max_batch, max_wait_ms)."""
        with self._lock:
            out: dict[str, Any] = dict(self._stats)
        out["max_batch"], out["max_wait_ms"] = self.max_batch, self.max_wait_s * 1000.0
        out["mean_batch_size"] = out["items"] / out["batches"] if out["batches"] else 0.0
        out["queued"] = {p.name.lower(): n for p, n in self.scheduler.depth().items()}
        return out

    def close(self, timeout: float | None = None) -> None:
        """Stop: queued items (and a batch still being collected) fail with Cancelled; a batch already running
        finishes; the worker thread is joined."""
        self.scheduler.close()  # wakes the worker; queued jobs reach _dropped as "cancelled"
        if self._worker is not threading.current_thread():
            self._worker.join(timeout)

    def __enter__(self) -> DynamicBatcher[X, Y]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the worker -------------------------------------------------------------------------------------------------

    def _dropped(self, job: Job, reason: str) -> None:
        item_future: Future = job.payload[1]
        if reason == "deadline":
            self._count("expired")
            _fail(item_future, DeadlineExceeded(f"{self.name}: the item's deadline passed while it was queued"))
        else:
            self._count("cancelled")
            if not item_future.cancelled():
                _fail(item_future, Cancelled(f"{self.name}: cancelled before it ran"))

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def _loop(self) -> None:
        sched = self.scheduler
        while not sched.closed:
            if not sched.wait(None):
                continue
            first = sched.pop()
            if first is None:  # only cancelled/expired work was queued
                continue
            batch = [first]
            window_end = (first.enqueued_at or self.clock()) + self.max_wait_s
            while len(batch) < self.max_batch and not sched.closed:
                job = sched.pop()
                if job is not None:
                    batch.append(job)
                    continue
                remaining = window_end - self.clock()
                if remaining <= 0:
                    break
                sched.wait(remaining)
            if sched.closed:
                for job in batch:
                    self._dropped(job, "cancelled")
                break
            self._run(batch)

    def _run(self, batch: list[Job]) -> None:
        now = self.clock()
        live: list[tuple[X, Future]] = []
        for job in batch:
            item, future = job.payload
            if job.expired(now):  # its deadline passed while the batch was being collected
                self._dropped(job, "deadline")
            elif future.set_running_or_notify_cancel():  # False: the caller cancelled it
                live.append((item, future))
            else:
                self._count("cancelled")
        if not live:
            return
        started = self.clock()
        try:
            results = self.run([item for item, _ in live])
            if not isinstance(results, (list, tuple)) or len(results) != len(live):
                got = len(results) if isinstance(results, (list, tuple)) else type(results).__name__
                raise BackendError(f"{self.name}: run() returned {got} results for a batch of {len(live)}")
        except Exception as exc:  # run's error belongs to this batch's callers only
            log.warning("%s: a batch of %d failed: %s", self.name, len(live), exc)
            self._count("failed_batches")
            for _, future in live:
                _fail(future, exc)
        else:
            for (_, future), result in zip(live, results, strict=True):
                future.set_result(result)
        finally:
            self.scheduler.note_served(self.clock() - started, len(live))
            with self._lock:
                self._stats["batches"] += 1
                self._stats["items"] += len(live)
