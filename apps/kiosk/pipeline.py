"""Parts in, exactly one :class:`~apps.kiosk.types.Decision` per part out, within a deadline.

``submit(part)`` never blocks and never raises for a part: the part is queued in a bounded
:class:`runtime.serving.batcher.DynamicBatcher` or decided at once by the fail-safe. The batcher's worker leases the model
from the :class:`runtime.residency.manager.ResidencyManager` for each batch, so a batch is decided by one whole, loaded
version: ``swap()`` loads the new version beside the deciding one and takes effect between batches, and a batch in flight keeps the version
it leased. A deadline timer gives every part still undecided ``deadline_ms`` after its capture the fail-safe
decision; a model result that comes later is dropped (counted as ``late``). Decisions go to ``on_decision`` from one
thread, in the order they were made.

Fail-safe decisions are REJECT with ``failsafe=True``, score 0, confidence 0 and a reason ``"<key>: <detail>"``,
``key`` one of :data:`FAILSAFE`. Latencies are milliseconds per stage: capture (capture -> submit), queue (submit ->
the batch has its model), preprocess, infer (the batch's), decide (policy -> decision made), total (capture ->
decision made).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.kiosk.adapters import adapter_for, check_image, identity
from apps.kiosk.canary import Canary
from apps.kiosk.deadlines import DeadlineTimer
from apps.kiosk.policy import Policy, Ruling
from apps.kiosk.types import STAGES, Decision, Part, Verdict
from runtime.errors import BadInput, Cancelled, DeadlineExceeded, DoesNotFit, QueueFull, one_line
from runtime.metrics import PercentileMethod, percentile
from runtime.residency.manager import ModelSpec, ResidencyManager
from runtime.serving.batcher import DynamicBatcher

log = logging.getLogger(__name__)

FAILSAFE = ("deadline", "saturated", "corrupt_frame", "backend_error", "shutdown")
SATURATION_HOLD_S = 5.0  # "saturated" stays on this long after the last part the box could not keep up with
LATENCY_WINDOW = 2048  # recent decisions the p50/p99 are computed over
LOAD_WAIT_S = 30.0  # how long swap() waits for room in the residency budget


def _running() -> Future:
    """A Future the caller cannot cancel: the part's decision goes to the PLC whatever the caller does with it."""
    future: Future = Future()
    future.set_running_or_notify_cancel()
    return future


@dataclass(eq=False)
class _Ticket:
    part: Part
    deadline: float
    submitted: float
    out: Future = field(default_factory=lambda: _running())  # the caller's Future[Decision]
    lock: threading.Lock = field(default_factory=threading.Lock)
    decided: bool = False
    job: Future | None = None  # the batcher's


@dataclass
class _Result:
    """One part's outcome from a batch: a ruling, or a corrupt frame found while preprocessing it."""

    model: str
    version: str
    times: tuple[float, float, float, float]  # model leased, preprocessed, inferred, ruled (clock)
    ruling: Ruling | None = None
    heatmap: np.ndarray | None = None
    error: str | None = None


def _positive(name: str, value: Any, whole: bool = False, top: float = 3.6e6) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= top
    if not ok or (whole and not isinstance(value, int)):
        raise BadInput(f"pipeline: {name} = {value!r} is not valid: use a {'whole ' if whole else ''}number in (0, {top:g}]")


class Pipeline:
    def __init__(self, model_name: str, residency: ResidencyManager, policy: Policy, *, deadline_ms: float = 150,
                 max_queue: int = 32, max_batch: int = 8, max_wait_ms: float = 5,
                 on_decision: Callable[[Decision], None] | None = None) -> None:
        """Loads ``model_name`` (added to ``residency`` by the caller) and checks ``policy`` against it first."""
        _positive("deadline_ms", deadline_ms)
        _positive("max_queue", max_queue, whole=True, top=1 << 20)
        if not isinstance(policy, Policy):
            raise BadInput(f"pipeline: policy must be a Policy, not {type(policy).__name__}")
        self.model_name, self.residency, self.policy = model_name, residency, policy
        self.deadline_s, self.max_queue = deadline_ms / 1000.0, max_queue
        self.on_decision = on_decision
        self.placement = ""  # the deciding model's placement, as its loader reported it
        self._active = model_name  # the residency name of the version deciding now (a swap loads the next beside it)
        self._swaps = itertools.count(1)
        self._version = self._check_loaded(model_name, deciding=True)  # the current model must load and fit the policy
        self._lock = threading.Lock()  # counters, pending, closed
        self._admin = threading.Lock()  # swap / promote / rollback / close, one at a time
        self._closed = False
        self._out_closed = False  # the output thread has been told to stop: decisions are handed over inline
        self._pending: set[_Ticket] = set()
        self._previous: list[ModelSpec] = []
        self._counts: Counter[str] = Counter()
        self._failsafe: Counter[str] = Counter()
        self._batch_sizes: Counter[int] = Counter()
        self._latency: dict[str, deque[float]] = {s: deque(maxlen=LATENCY_WINDOW) for s in STAGES}
        self._overloaded_at = -math.inf
        self._canary: Canary | None = None
        self._last_canary: dict[str, Any] | None = None
        self._selected = itertools.count()
        self._out: queue.SimpleQueue[Decision | None] = queue.SimpleQueue()
        self._delivered = threading.Condition()
        self._batcher = DynamicBatcher(self._run, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queued=max_queue,
                                       name=f"kiosk-{model_name}")
        self._timer = DeadlineTimer(self._due, lambda t: t.decided, name="kiosk-deadlines")
        self._emitter = threading.Thread(target=self._emit_loop, name="edgerun-kiosk-out", daemon=True)
        self._emitter.start()

    # -- parts --------------------------------------------------------------------------------------------------------
    def submit(self, part: Part) -> Future:
        """Queue ``part``; the returned Future gets its one Decision (also handed to ``on_decision``)."""
        if not isinstance(part, Part):
            raise BadInput(f"pipeline: submit() takes a Part, not {type(part).__name__}")
        now = time.monotonic()
        ticket = _Ticket(part, min(part.t_capture, now) + self.deadline_s, now)
        with self._lock:
            self._counts["submitted"] += 1
            if self._closed:
                closed = True
            else:
                closed = False
                self._pending.add(ticket)
        if closed:
            self._fail(ticket, "shutdown", "the pipeline is closed")
            return ticket.out
        try:
            if part.error is not None:
                raise BadInput(part.error)
            check_image(part.image)
        except BadInput as exc:
            self._fail(ticket, "corrupt_frame", one_line(exc))
            return ticket.out
        try:
            job = self._batcher.submit(ticket, deadline=ticket.deadline)
        except QueueFull:
            self._fail(ticket, "saturated", f"queue full ({self.max_queue} parts waiting)")
            return ticket.out
        except Cancelled:
            self._fail(ticket, "shutdown", "the pipeline is closing")
            return ticket.out
        ticket.job = job
        self._timer.add(ticket.deadline, ticket)
        job.add_done_callback(lambda f: self._settle(ticket, f))
        return ticket.out

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every part submitted so far has been decided and handed to ``on_decision``."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._delivered:
            while True:
                with self._lock:
                    done = not self._pending and self._counts["delivered"] == self._counts["decided"]
                if done:
                    return True
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._delivered.wait(0.05 if left is None else min(left, 0.05))

    # -- the batcher's worker -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lease(self) -> Iterator[Any]:
        """The loaded model deciding now, leased for the ``with`` block (a swap meanwhile takes the next batch)."""
        while True:
            name, stack = self._active, contextlib.ExitStack()
            try:
                model = stack.enter_context(self.residency.acquire(name))
            except BadInput:
                if name != self._active:  # swapped, and the old version retired, between the read and the lease
                    continue
                raise
            break
        with stack:
            yield model

    def _run(self, tickets: list[_Ticket]) -> list[_Result]:
        with self.lease() as model:
            leased = time.monotonic()
            adapter = adapter_for(model)
            name, version, _ = identity(model)
            prepared, where, errors = [], [], {}
            for i, ticket in enumerate(tickets):
                try:
                    prepared.append(adapter.prepare(model, ticket.part.image))
                    where.append(i)
                except BadInput as exc:
                    errors[i] = one_line(exc)
            t_prep = time.monotonic()
            outputs = adapter.infer(model, prepared) if prepared else []
            t_infer = time.monotonic()
            rulings = {i: adapter.rule(model, self.policy, out) for i, out in zip(where, outputs, strict=True)}
            times = (leased, t_prep, t_infer, time.monotonic())
        with self._lock:  # the version deciding now is swap()'s to set: a batch of the old one may end after it
            self._batch_sizes[len(tickets)] += 1
        canary = self._canary
        results = []
        for i, ticket in enumerate(tickets):
            if i in errors:
                results.append(_Result(name, version, times, error=errors[i]))
                continue
            ruling, heatmap = rulings[i]
            results.append(_Result(name, version, times, ruling=ruling, heatmap=heatmap))
            if canary is not None and canary.selects(next(self._selected)):
                canary.offer(ticket.part, ruling.verdict, version)
        return results

    def _settle(self, ticket: _Ticket, job: Future) -> None:
        if job.cancelled():  # taken out by the deadline timer, which decided it
            return
        exc = job.exception()
        if exc is None:
            result: _Result = job.result()
            if result.error is not None:
                self._fail(ticket, "corrupt_frame", result.error, model=result.model, version=result.version)
            else:
                self._decided(ticket, result)
        elif isinstance(exc, DeadlineExceeded):
            self._fail(ticket, "deadline", f"no decision within {self.deadline_s * 1000:g} ms (still queued)")
        elif isinstance(exc, Cancelled):
            self._fail(ticket, "shutdown", "the pipeline closed before the part was decided")
        else:
            self._fail(ticket, "backend_error", f"{type(exc).__name__}: {one_line(exc)}")

    def _decided(self, ticket: _Ticket, result: _Result) -> None:
        leased, t_prep, t_infer, _ = result.times
        ruling = result.ruling
        assert ruling is not None
        now = time.monotonic()
        part = ticket.part
        if now > ticket.deadline:  # the gate has passed the part: a verdict now would come too late for it
            with self._lock:
                self._counts["late"] += 1
            self._fail(ticket, "deadline", f"the model decided {(now - ticket.deadline) * 1000:.0f} ms after the "
                                           f"{self.deadline_s * 1000:g} ms deadline", model=result.model, version=result.version)
            return
        latency = {"capture": ticket.submitted - part.t_capture, "queue": leased - ticket.submitted,
                   "preprocess": t_prep - leased, "infer": t_infer - t_prep, "decide": now - t_infer,
                   "total": now - part.t_capture}
        decision = Decision(part.seq, part.frame_id, ruling.verdict, ruling.reason, ruling.label, ruling.score,
                            ruling.confidence, False, result.model, result.version,
                            {k: round(v * 1000.0, 3) for k, v in latency.items()}, result.heatmap)
        if not self._decide(ticket, decision):
            with self._lock:
                self._counts["late"] += 1
            log.debug("part %d: the model decided after its fail-safe decision; dropped", part.seq)

    def _fail(self, ticket: _Ticket, key: str, detail: str, *, model: str | None = None, version: str | None = None) -> None:
        now = time.monotonic()
        part = ticket.part
        latency = {"capture": ticket.submitted - part.t_capture, "total": now - part.t_capture}
        decision = Decision(part.seq, part.frame_id, Verdict.REJECT, f"{key}: {detail}", None, 0.0, 0.0, True,
                            model or self.model_name, version if version is not None else self._version,
                            {k: round(v * 1000.0, 3) for k, v in latency.items()})
        if self._decide(ticket, decision, failsafe=key):
            log.info("part %d (%s): fail-safe reject: %s", part.seq, part.frame_id, decision.reason)

    def _decide(self, ticket: _Ticket, decision: Decision, failsafe: str | None = None) -> bool:
        """The one place a decision is made: the first for a ticket wins, any later one is refused."""
        with ticket.lock:
            if ticket.decided:
                return False
            ticket.decided = True
        with self._lock:
            self._pending.discard(ticket)
            self._counts["decided"] += 1
            self._counts[decision.verdict.value] += 1
            if failsafe is not None:
                self._failsafe[failsafe] += 1
                if failsafe in ("saturated", "deadline"):
                    self._overloaded_at = time.monotonic()
            for stage, ms in decision.latency_ms.items():
                self._latency[stage].append(ms)
        ticket.out.set_result(decision)
        with self._lock:
            inline = self._out_closed
            if not inline:
                self._out.put(decision)
        if inline:  # after close(): the caller's thread hands it over
            self._deliver(decision)
        if ticket.job is not None and failsafe is not None:
            ticket.job.cancel()  # out of the queue if it is still there
        return True

    # -- the output thread ---------------------------------------------------------------------
    def _due(self, ticket: _Ticket) -> None:
        self._fail(ticket, "deadline", f"no decision within {self.deadline_s * 1000:g} ms")

    def _emit_loop(self) -> None:
        while (decision := self._out.get()) is not None:
            self._deliver(decision)

    def _deliver(self, decision: Decision) -> None:
        try:
            if self.on_decision is not None:
                self.on_decision(decision)
        except Exception as exc:  # the line keeps running; the consumer's failure is counted and logged
            log.warning("on_decision failed for part %d: %s", decision.seq, one_line(exc))
            with self._lock:
                self._counts["callback_errors"] += 1
        with self._lock:
            self._counts["delivered"] += 1
        with self._delivered:
            self._delivered.notify_all()

    # -- model updates ------------------------------------------------------------------------------------------------
    def _check_loaded(self, name: str, *, deciding: bool = False) -> str:
        with self.residency.acquire(name, wait_s=LOAD_WAIT_S) as model:
            adapter_for(model).check(model, self.policy)
            placement = getattr(model, "placement", None)
            if deciding:
                self.placement = placement.summary() if placement is not None else ""
            return identity(model)[1]

    def _spec(self, name: str) -> ModelSpec:
        for spec in self.residency.specs():
            if spec.name == name:
                return spec
        raise BadInput(f"model {name!r} is not in the residency manager")

    def _spec_for(self, ref: str, name: str) -> ModelSpec:
        from runtime.bundle.resolve import resolve

        kind = resolve(ref).manifest.kind.value  # an anomaly bundle may replace a classifier, and back
        spec = self._spec(self._active)
        options = spec.options if kind == spec.kind else {}  # another kind's loader takes other options
        return dataclasses.replace(spec, name=name, ref=ref, kind=kind, options=options)

    def _switch(self, spec: ModelSpec) -> str:
        """Load ``spec`` beside the deciding version (under a name of its own) while the old one keeps deciding, then
        switch between batches; the old version is retired once its last batch ends. The old one stays if the new
        one does not load or fit the policy. Only when the budget cannot hold both does the swap go in place (parts
        then wait for the load, up to their deadline)."""
        old_name = self._active
        old = self._spec(old_name)
        new = dataclasses.replace(spec, name=f"{self.model_name[:50]}-v{next(self._swaps)}")
        try:
            self.residency.add(new)
        except DoesNotFit as exc:
            log.warning("%s: no room for %s beside the deciding version (%s): swapping in place; parts wait for the "
                        "load", self.model_name, spec.ref, one_line(exc))
            return self._switch_in_place(old, dataclasses.replace(spec, name=old_name))
        try:
            version = self._check_loaded(new.name, deciding=True)
        except BaseException:
            self.residency.remove(new.name)
            raise
        with self._lock:
            self._active = new.name
            self._version = version
        self.residency.remove(old_name)  # closes when the batch deciding with it (if any) ends
        self._previous.append(old)
        log.info("%s: now deciding with %s (version %s)", self.model_name, spec.ref, version)
        return version

    def _switch_in_place(self, old: ModelSpec, spec: ModelSpec) -> str:
        self.residency.swap(old.name, spec)
        try:
            version = self._check_loaded(old.name, deciding=True)
        except BaseException:
            self.residency.swap(old.name, old)
            raise
        with self._lock:
            self._version = version
        self._previous.append(old)
        return version

    def swap(self, new_ref: str, *, canary: float = 0.0) -> str:
        """Switch to ``new_ref`` between batches (loaded beside the deciding version and checked before this
        returns; the old version decides the parts that come meanwhile); the old version is kept for
        :meth:`rollback`. With ``canary`` in (0, 1] nothing switches yet: that fraction of parts is also decided
        by the new version, disagreements are logged and counted (``stats()["canary"]``), and :meth:`promote`
        switches. Returns the new version."""
        if isinstance(canary, bool) or not isinstance(canary, (int, float)) or not 0 <= canary <= 1:
            raise BadInput(f"canary = {canary!r} is not valid: use a fraction of parts in [0, 1]")
        with self._admin:
            self._check_open()
            if self._canary is not None:
                raise BadInput(f"a canary of {self._canary.ref} is running: promote() or rollback() it first")
            if canary == 0:
                return self._switch(self._spec_for(new_ref, self.model_name))
            spec = self._spec_for(new_ref, f"{self.model_name[:57]}-canary")
            self.residency.add(spec)
            try:
                version = self._check_loaded(spec.name)
                self._canary = Canary(spec, version, float(canary), self.residency, self.policy)
            except BaseException:
                self.residency.remove(spec.name)
                raise
            return version

    def promote(self) -> str:
        """The running canary's version becomes the model (see :meth:`swap`)."""
        with self._admin:
            self._check_open()
            canary = self._end_canary("promoted")
            if canary is None:
                raise BadInput("no canary is running: swap(ref, canary=fraction) starts one")
            return self._switch(dataclasses.replace(canary.spec, name=self.model_name))

    def rollback(self) -> str:
        """Drop a running canary; with none, go back to the version before the last swap. Returns the version now
        deciding."""
        with self._admin:
            self._check_open()
            if self._end_canary("rolled back") is not None:
                return self._version
            if not self._previous:
                raise BadInput(f"{self.model_name}: no previous version to roll back to")
            spec = self._previous.pop()
            version = self._switch(spec)
            self._previous.pop()  # _switch remembered the version rolled back from; a rollback forgets it
            return version

    def _end_canary(self, outcome: str) -> Canary | None:
        canary, self._canary = self._canary, None
        if canary is None:
            return None
        canary.close()
        self.residency.remove(canary.spec.name)
        self._last_canary = {**canary.stats(), "outcome": outcome}
        log.info("canary %s %s: %s", canary.ref, outcome, self._last_canary)
        return canary

    def _check_open(self) -> None:
        if self._closed:
            raise BadInput("the pipeline is closed")

    # -- state --------------------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """For the dashboard: counts (submitted, decided, pass, reject, review, late), failsafe by reason, saturation,
        queue depth, batch sizes, latency p50/p99 per stage (ms), the model and version, the canary."""
        b = self._batcher.stats()
        with self._lock:
            c = self._counts
            lat = {s: (np.fromiter(v, float, len(v)) if v else None) for s, v in self._latency.items()}
            out: dict[str, Any] = {
                "model": self.model_name, "version": self._version, "submitted": c["submitted"], "decided": c["decided"],
                "pass": c["pass"], "reject": c["reject"], "review": c["review"], "late": c["late"],
                "pending": len(self._pending), "callback_errors": c["callback_errors"],
                "failsafe": {k: self._failsafe[k] for k in FAILSAFE}, "failsafe_total": sum(self._failsafe.values()),
                "saturation": self._failsafe["saturated"],
                "saturated": time.monotonic() - self._overloaded_at < SATURATION_HOLD_S,
                "queued": sum(b["queued"].values()), "max_queue": self.max_queue,
                "batches": sum(self._batch_sizes.values()), "batch_sizes": dict(sorted(self._batch_sizes.items())),
                "deadline_ms": self.deadline_s * 1000.0, "previous_versions": len(self._previous),
                "placement": self.placement,
            }
        out["saturated"] = out["saturated"] or out["queued"] >= self.max_queue
        out["latency_ms"] = {s: {f"p{q}": round(percentile(v, q, method=PercentileMethod.LINEAR), 3) if v is not None else None
                                 for q in (50, 99)} for s, v in lat.items()}
        canary = self._canary
        out["canary"] = canary.stats() if canary is not None else self._last_canary
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Stop: parts still queued get the fail-safe (shutdown); a running batch finishes first (up to ``timeout``);
        every decision is handed to ``on_decision`` before this returns."""
        with self._admin:
            with self._lock:
                if self._closed:
                    return
                self._closed = True
            self._batcher.close(timeout)
            with self._lock:
                left = list(self._pending)
            for ticket in left:  # a batch that outlived the timeout: its parts are not left without a decision
                self._fail(ticket, "shutdown", "the pipeline closed before the part was decided")
            self._end_canary("closed")
            self._timer.close(timeout)
            with self._lock:
                self._out_closed = True
                self._out.put(None)
        self._emitter.join(timeout)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
