"""Priority classes, bounded queues, deadlines, cancellation and aging for any kind of queued work.

Pure Python and thread-safe: no HTTP, no asyncio. The LLM engine, the dynamic batcher, the server, the kiosk and the
voice assistant all queue their work here. Times are ``time.monotonic()`` seconds (or the injected ``clock``).

- Three classes, :class:`Priority` ``URGENT`` < ``INTERACTIVE`` < ``BATCH``, each with its own bounded FIFO queue;
  a full class answers :class:`~runtime.errors.QueueFull` at once, with a ``retry_after`` from the recent service rate.
- Aging: a job is treated one class better per ``aging_s`` it has waited since it was first submitted, but never
  as URGENT; so BATCH work is never starved by a stream of INTERACTIVE work, and URGENT stays first.
- Cancelled and expired jobs are taken out at the next :meth:`Scheduler.pop` or :meth:`Scheduler.sweep` and handed
  to ``on_drop(job, "cancelled" | "deadline")``, outside the lock.
- Preemption: :meth:`Scheduler.choose_victim` names the running job to stop for a waiting URGENT one;
  :meth:`Scheduler.requeue` puts it back at the front of its class, never refused.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from runtime.errors import BadInput, Cancelled, QueueFull

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUED = 64
MAX_PREEMPTIONS = 2  # a batch job is preempted at most this often, so urgent work can never starve it
SERVICE_WINDOW = 32  # recent completions the retry_after estimate is computed from
DEFAULT_SERVICE_S = 1.0  # the service time assumed before anything has been served
MAX_RETRY_AFTER_S = 600.0


class Priority(IntEnum):
    """A request's class; lower is served first."""

    URGENT = 0
    INTERACTIVE = 1
    BATCH = 2

    @classmethod
    def parse(cls, text: str) -> Priority:
        """``"urgent"``, ``"interactive"`` or ``"batch"`` (any case, surrounding blanks ignored); BadInput otherwise."""
        if isinstance(text, Priority):
            return text
        name = text.strip().upper() if isinstance(text, str) else ""
        if name in cls.__members__:
            return cls[name]
        valid = ", ".join(p.name.lower() for p in cls)
        raise BadInput(f"unknown priority {text!r}; valid: {valid}")


_ids = itertools.count(1)


@dataclass(eq=False)
class Job:
    """A unit of queued work; ``payload`` is opaque to the scheduler.

    ``deadline`` is an absolute clock time (seconds); ``enqueued_at`` is set by the first :meth:`Scheduler.submit`
    and kept through requeues (aging counts from it). ``started_at`` and ``admitted_as`` (the class it was served
    as, after aging) are set by :meth:`Scheduler.pop`. ``preemptions`` counts its requeues: a BATCH job stays a
    victim candidate after aging (or an urgent request would wait behind old batch work for a whole answer), but
    only until it has been preempted ``max_preemptions`` times, which is what keeps it from starving.
    """

    payload: Any
    priority: Priority = Priority.INTERACTIVE
    deadline: float | None = None
    preemptible: bool = True
    id: int = field(default_factory=lambda: next(_ids))
    enqueued_at: float | None = None
    started_at: float | None = None
    admitted_as: Priority | None = None
    preemptions: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        """Mark the job cancelled: taken out of the queue at the next pop/sweep, or stopped by whoever runs it."""
        self.cancelled.set()

    @property
    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    def expired(self, now: float) -> bool:
        """True once ``now`` has reached the deadline."""
        return self.deadline is not None and now >= self.deadline


def _aged(priority: Priority, waited: float, aging_s: float) -> Priority:
    """The class a job of ``priority`` is treated as after ``waited`` seconds: one better per ``aging_s``, never URGENT."""
    if priority == Priority.URGENT or waited <= 0 or math.isinf(aging_s):
        return priority
    return Priority(max(int(Priority.INTERACTIVE), int(priority) - int(waited // aging_s)))


def _bounds(max_queued: int | Mapping[Priority, int]) -> dict[Priority, int]:
    given = max_queued if isinstance(max_queued, Mapping) else {p: max_queued for p in Priority}
    bounds = {p: DEFAULT_MAX_QUEUED for p in Priority}  # a mapping that leaves out a class leaves it at the default
    for name, value in given.items():
        key = Priority.parse(name) if isinstance(name, str) else name  # a config file names the classes
        if not isinstance(key, Priority):
            raise BadInput(f"max_queued key {key!r} is not a priority; valid: {', '.join(p.name.lower() for p in Priority)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadInput(f"max_queued for {key.name.lower()} must be a positive integer, not {value!r}")
        bounds[key] = value
    return bounds


class Scheduler:
    """Bounded priority queues with aging, deadlines, cancellation and preemption choices. Thread-safe."""

    def __init__(self, *, max_queued: int | Mapping[Priority, int] = DEFAULT_MAX_QUEUED, aging_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, max_preemptions: int = MAX_PREEMPTIONS) -> None:
        if isinstance(aging_s, bool) or not isinstance(aging_s, (int, float)) or not aging_s > 0:
            raise BadInput(f"aging_s must be a positive number of seconds (math.inf: no aging), not {aging_s!r}")
        self.bounds = _bounds(max_queued)
        self.aging_s = float(aging_s)
        if isinstance(max_preemptions, bool) or not isinstance(max_preemptions, int) or max_preemptions < 0:
            raise BadInput(f"max_preemptions must be a whole number >= 0, not {max_preemptions!r}")
        self.max_preemptions = max_preemptions
        self.clock = clock
        self.on_drop: Callable[[Job, str], None] | None = None
        self._queues: dict[Priority, deque[Job]] = {p: deque() for p in Priority}
        self._queued_ids: set[int] = set()
        self._served: deque[tuple[float, float, int]] = deque(maxlen=SERVICE_WINDOW)  # (finished at, seconds, jobs)
        self._closed = False
        self._cond = threading.Condition()

    # -- queueing ---------------------------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue ``job`` at the back of its class; QueueFull (never blocks) when that class is at its bound,
        Cancelled once the scheduler is closed."""
        if not isinstance(job, Job):
            raise TypeError(f"Scheduler.submit takes a Job, not {type(job).__name__}")
        job.priority = Priority(job.priority)
        dropped: list[tuple[Job, str]] = []
        with self._cond:
            if self._closed:
                raise Cancelled("the scheduler is closed; no new work is accepted")
            if job.id in self._queued_ids:
                raise ValueError(f"job {job.id} is already queued")
            now = self.clock()
            queue = self._queues[job.priority]
            if len(queue) >= self.bounds[job.priority]:
                dropped = self._take_out_dead(now)  # cancelled/expired jobs do not hold places
            if len(queue) >= self.bounds[job.priority]:
                retry_after = self._retry_after(job.priority, now)
                full = QueueFull(f"the {job.priority.name.lower()} queue is full ({self.bounds[job.priority]} queued); "
                                 f"retry after {retry_after:.3g} s", retry_after)
            else:
                full = None
                if job.enqueued_at is None:
                    job.enqueued_at = now
                queue.append(job)
                self._queued_ids.add(job.id)
                self._cond.notify_all()
        self._report(dropped)
        if full is not None:
            raise full

    def requeue(self, job: Job) -> None:
        """Put a preempted job back at the FRONT of its class; never refused (not even at the bound). Once the
        scheduler is closed the job goes to ``on_drop(job, "cancelled")`` instead, like the rest of the queue."""
        with self._cond:
            closed = self._closed
            if not closed:
                if job.id in self._queued_ids:
                    raise ValueError(f"job {job.id} is already queued")
                if job.enqueued_at is None:
                    job.enqueued_at = self.clock()
                job.started_at = job.admitted_as = None
                job.preemptions += 1
                self._queues[Priority(job.priority)].appendleft(job)
                self._queued_ids.add(job.id)
                self._cond.notify_all()
        if closed:
            self._report([(job, "cancelled")])

    def pop(self, now: float | None = None) -> Job | None:
        """Take out the job to serve next: the best effective class (after aging), the oldest first within it.
        Cancelled and expired jobs are taken out too and handed to ``on_drop`` before this returns."""
        with self._cond:
            now = self.clock() if now is None else now
            dropped = self._take_out_dead(now)
            best = self._best(now)
            if best is not None:
                job, effective = best
                queue = self._queues[job.priority]
                if queue[0] is job:
                    queue.popleft()
                else:  # a job ahead of it was cancelled (Job.cancel takes no lock) since the clean-up: left for the next
                    queue.remove(job)
                self._queued_ids.discard(job.id)
                job.started_at, job.admitted_as = now, effective
        self._report(dropped)
        return None if best is None else best[0]

    def sweep(self, now: float | None = None) -> list[Job]:
        """Take out every cancelled or expired queued job now (``on_drop`` for each); a worker that is busy calls
        this between steps so that a deadline is answered when it passes, not when a place frees up."""
        with self._cond:
            dropped = self._take_out_dead(self.clock() if now is None else now)
        self._report(dropped)
        return [job for job, _ in dropped]

    def drain(self) -> list[Job]:
        """Take out every queued job (no ``on_drop``), best class first; for a shutdown or a hand-over."""
        with self._cond:
            jobs = [job for p in Priority for job in self._queues[p]]
            for queue in self._queues.values():
                queue.clear()
            self._queued_ids.clear()
        return jobs

    def close(self) -> list[Job]:
        """Refuse new work from now on (submit raises Cancelled), wake every waiter, and take out what is queued,
        each handed to ``on_drop(job, "cancelled")``. Returns those jobs."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        jobs = self.drain()
        self._report([(job, "cancelled") for job in jobs])
        return jobs

    @property
    def closed(self) -> bool:
        return self._closed

    def wait(self, timeout: float | None) -> bool:
        """Block until something is queued (True), the timeout passes or the scheduler is closed (False)."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or bool(self._queued_ids), timeout)
            return bool(self._queued_ids) and not self._closed

    # -- reading the state ------------------------------------------------------------------------------------------

    def best_waiting(self, now: float | None = None) -> Priority | None:
        """The effective class of the job :meth:`pop` would serve now (cancelled/expired ones skipped); None if none."""
        with self._cond:
            now = self.clock() if now is None else now
            best = self._best(now)
        return None if best is None else best[1]

    def choose_victim(self, running: Sequence[Job], now: float | None = None) -> Job | None:
        """When the best waiting job is URGENT, the running job to preempt for it: preemptible, of the BATCH class
        (whatever class aging served it as: aged batch work would otherwise fill every slot and make urgent requests
        wait for whole answers), preempted fewer than ``max_preemptions`` times (so preemption cannot starve it), the
        one started most recently (the least work lost). None if no URGENT job waits or no running job qualifies."""
        if self.best_waiting(now) != Priority.URGENT:
            return None
        candidates = [j for j in running if j.preemptible and not j.is_cancelled and j.priority == Priority.BATCH
                      and j.preemptions < self.max_preemptions]
        return max(candidates, key=lambda j: (j.started_at if j.started_at is not None else -math.inf, j.id),
                   default=None)

    def depth(self) -> dict[Priority, int]:
        """Queued jobs per class (their own class, before aging)."""
        with self._cond:
            return {p: len(q) for p, q in self._queues.items()}

    def __len__(self) -> int:
        with self._cond:
            return len(self._queued_ids)

    # -- the service rate -------------------------------------------------------------------------------------------

    def note_served(self, seconds: float, jobs: int = 1) -> None:
        """Record that ``jobs`` jobs (a batch) were served together in ``seconds``, finishing now; feeds the
        QueueFull ``retry_after``."""
        if seconds >= 0 and math.isfinite(seconds) and jobs >= 1:
            with self._cond:
                self._served.append((self.clock(), float(seconds), int(jobs)))

    def service_rate(self) -> float | None:
        """Jobs finished per second of busy time over the recent window: parallel workers count together, idle
        gaps between jobs do not count; None before anything was served (or only in no time)."""
        with self._cond:
            return self._rate()

    def _rate(self) -> float | None:
        busy, reach = 0.0, -math.inf  # the union of the recent jobs' [start, end] intervals
        for start, end in sorted((end - seconds, end) for end, seconds, _ in self._served):
            if end > reach:
                busy += end - max(start, reach)
                reach = end
        return sum(n for _, _, n in self._served) / busy if busy > 0 else None

    def _retry_after(self, priority: Priority, now: float) -> float:
        # A place in this class frees when its head is served, after every better class's queued work.
        ahead = 1 + sum(len(self._queues[p]) for p in Priority if p < priority)
        rate = self._rate()
        per_job = 1.0 / rate if rate else DEFAULT_SERVICE_S
        return min(MAX_RETRY_AFTER_S, max(0.001, ahead * per_job))

    # -- internals (the lock is held) -------------------------------------------------------------------------------

    def _effective(self, job: Job, now: float) -> Priority:
        return _aged(job.priority, now - (job.enqueued_at if job.enqueued_at is not None else now), self.aging_s)

    def _best(self, now: float) -> tuple[Job, Priority] | None:
        # Each class is served in its queue's order (FIFO, a requeued job first), so only the first live job of
        # each class competes; between classes the better effective class wins, then the longer wait.
        heads = []
        for queue in self._queues.values():
            head = next((j for j in queue if not (j.is_cancelled or j.expired(now))), None)
            if head is not None:
                heads.append((head, self._effective(head, now)))
        return min(heads, key=lambda he: (he[1], he[0].enqueued_at, he[0].priority, he[0].id), default=None)

    def _take_out_dead(self, now: float) -> list[tuple[Job, str]]:
        dropped: list[tuple[Job, str]] = []
        for queue in self._queues.values():
            if not any(j.is_cancelled or j.expired(now) for j in queue):
                continue
            keep: deque[Job] = deque()
            for job in queue:
                reason = "cancelled" if job.is_cancelled else "deadline" if job.expired(now) else None
                if reason is None:
                    keep.append(job)
                else:
                    dropped.append((job, reason))
                    self._queued_ids.discard(job.id)
            queue.clear()
            queue.extend(keep)
        return dropped

    def _report(self, dropped: list[tuple[Job, str]]) -> None:
        callback = self.on_drop
        for job, reason in dropped:
            if callback is None:
                continue
            try:
                callback(job, reason)
            except Exception:  # one failing callback must not lose the other jobs' notices nor the caller's job
                log.exception("scheduler on_drop failed for job %d (%s)", job.id, reason)
