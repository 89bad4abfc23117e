"""The inspection kiosk: source -> pipeline -> (PLC, audit trail, dashboard), every captured part decided once.

``Kiosk(config).run()`` validates everything first (one-line BadInput before any thread starts or port binds),
then runs until the source ends, ``max_parts`` parts were captured, or :meth:`Kiosk.stop` (a signal) is
called, and returns the summary. Threads, budgeted for a small box: the model's intra-op threads (placement's
choice, by default one core fewer than the usable ones so capture never waits for a core), one capture thread
(paces a replayed file or folder at ``rate`` parts/s), the pipeline's batch worker, deadline timer and output
thread (each decision goes to the PLC first, then the audit trail, then the dashboard state), the PLC link's and
the audit pictures' writers, and the dashboard (uvicorn, one thread, and a 1 s state follower).

Shutdown (:meth:`Kiosk.close`, idempotent): capture stops; a part already taken from the source is still
submitted; the pipeline decides every part still queued or in flight (its fail-safe "shutdown" reject when the
model does not finish in time) and hands each decision to the PLC journal and the audit trail before the PLC
link closes (unacknowledged decisions stay journaled and are resent, in order, on the next start).

Faults (:mod:`apps.kiosk.faults`): a decision that cannot be journaled for the PLC (a full SD card) latches a
``plc`` fault: that part is recorded as a fail-safe reject it never was told, and every later decision is sent
as a fail-safe reject until an operator clears the fault (the dashboard's ``POST /api/faults/clear``, or
:meth:`Kiosk.clear_faults`). An audit trail that cannot write latches an ``audit`` fault (shown; parts are still
decided). Each latch and clear is written to the audit trail's ``events`` (kept in memory and written again
once the disk has room).

Model updates on a running kiosk: :meth:`Kiosk.update_model` (the new ref is resolved, loaded and checked
against the policy while the old version keeps deciding; the switch is atomic between batches; a version that
does not load or fit is refused and the old one keeps deciding), :meth:`Kiosk.rollback` and, with a canary
fraction, :meth:`Kiosk.promote`. ``edgerun kiosk`` maps SIGHUP to :meth:`Kiosk.reload`: it reads kiosk.toml
again and applies a changed ``[model] ref`` (with its ``canary``).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from apps.kiosk.config import KioskConfig, read_config
from apps.kiosk.faults import FaultEvent, FaultKind, FaultLatch
from apps.kiosk.types import Decision, Part, Verdict
from runtime.errors import BadInput, one_line

log = logging.getLogger(__name__)

MODEL_NAME = "kiosk"  # the residency manager's name for the deciding model when its bundle's name is not a store name
MAX_HELD_IMAGES = 4096  # frames kept for the audit trail until their part is decided (bounded by the queue anyway)
SEEN_WINDOW = 65536  # recent part seqs remembered to catch a part decided twice (seqs only grow)
MAX_TWICE = 100  # part seqs decided twice, named in the summary
RECORD_QUEUE = 4096  # decisions waiting for the audit trail and the dashboard (beyond: the line waits, logged)
RECORD_IMAGES = 32  # of them with their frame; past that a record goes without it (the row is what matters)
RECORDS_DRAIN_S = 60.0  # at shutdown, how long the audit trail may take for the decisions still queued
PLC_DRAIN_S = 5.0  # at shutdown, how long to wait for the PLC to acknowledge what is journaled
# The kiosk process outside its models' plans (their runtime terms count ONNX Runtime's or LiteRT's library, not the
# interpreter): the interpreter, numpy, PIL, SQLite, the dashboard's uvicorn and Starlette and edgerun's kiosk modules
# measured 55 MiB imported (x86_64, 2026-12-07); the dashboard at its connection cap (1,100 idle sockets offered)
# added 3.7 MiB; the threads' stacks and the decision queues' rows a few more. Frames in flight are the source's
# (max_queue of them, at the camera's size), not counted here.
PROCESS_BYTES = 64 << 20
MAX_UNWRITTEN_EVENTS = 1024  # fault events waiting for an audit trail that cannot write (one per latch or clear)
_EVENTS = "events"  # a record-queue item: write the fault events waiting


def residency_name(name: str) -> str:
    from runtime.bundle.store import check_ref

    try:
        check_ref(name)
    except BadInput:
        return MODEL_NAME
    return name


def usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def thread_budget(config: KioskConfig) -> dict[str, int]:
    """Threads the kiosk runs: the model's (config, or one core left to capture and the rest), and the light ones."""
    model = config.threads if config.threads is not None else max(1, usable_cpus() - 1)
    budget = {"model": model, "capture": 1, "pipeline": 3, "plc": 1, "audit": 1}
    if config.dashboard:
        budget["dashboard"] = 2
    return budget


class Kiosk:
    """``Kiosk(config).run()`` or ``with Kiosk(config).start() as k: ... k.stop(); k.wait()``.

    ``capture_factory``: the camera's / video's capture (tests inject one); ``loaders``: residency loaders by kind
    over the defaults; ``temperature``: the dashboard's sensor callable."""

    def __init__(self, config: KioskConfig, *, capture_factory: Callable | None = None,
                 loaders: Mapping[str, Any] | None = None, temperature: Callable[[], float | None] | None = None,
                 plc_drain_s: float = PLC_DRAIN_S) -> None:
        self.config = config.checked()
        self.capture_factory, self.loaders, self.temperature = capture_factory, loaders, temperature
        self.plc_drain_s = plc_drain_s
        self.threads = thread_budget(config)
        self.source = self.pipeline = self.residency = self.plc = self.audit = self.state = None
        self.dashboard = self.follower = None
        self._capture: threading.Thread | None = None
        self._stopping = threading.Event()
        self._captured_all = threading.Event()
        self._reload = threading.Event()
        self._lock = threading.Lock()
        self._images: dict[int, np.ndarray] = {}
        self._counts: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._decided = 0  # decisions handed out (one per part, checked in the summary)
        self._seen: set[int] = set()  # the last SEEN_WINDOW part seqs decided (a kiosk runs for months: bounded)
        self._seen_order: deque[int] = deque()
        self._twice: list[int] = []  # seqs decided twice (at most MAX_TWICE named)
        # decision -> audit trail + dashboard, off the line's thread: a slow disk never delays the next PLC write
        self._records: queue.Queue[tuple[Decision, np.ndarray | None] | None] = queue.Queue(RECORD_QUEUE)
        self._recorder: threading.Thread | None = None
        self._records_with_image = 0
        self.captured = 0
        self.capture_error: str | None = None
        self._started_at = 0.0
        self._ended_at: float | None = None
        self._closed = False
        self.ref = config.model
        self.model_name = MODEL_NAME  # the residency manager's name for it
        self.deciding_name = ""  # the deciding bundle's own name (its manifest's)
        self._plc_final: dict[str, Any] | None = None
        self._audit_final: dict[str, Any] | None = None
        self.faults = FaultLatch(self._on_fault_event)
        self._events: deque[FaultEvent] = deque()  # latched/cleared, not yet in the audit trail (under self._lock)
        self._events_lost = 0

    # -- start ---------------------------------------------------------------------------------------------------
    def start(self) -> Kiosk:
        from apps.kiosk.dashboard import check_bind, load_token
        from apps.kiosk.plc import parse_url
        from apps.kiosk.policy import Policy
        from runtime.bundle.resolve import resolve

        cfg = self.config
        policy = Policy.from_config(cfg.policy)  # everything that can be checked without starting anything first
        parse_url(cfg.plc)
        token = load_token(cfg.token_file) if cfg.dashboard and cfg.token_file is not None else None
        if cfg.dashboard:
            check_bind(cfg.host, token)
        manifest = resolve(cfg.model).manifest
        kind = manifest.kind.value
        if kind not in ("vision", "anomaly"):
            raise BadInput(f"--model {cfg.model}: a {kind} bundle cannot decide parts; give a vision or anomaly bundle")
        try:
            self._open(policy, kind, token, residency_name(manifest.name))
        except BaseException:
            self.close()
            raise
        return self

    def _open(self, policy: Any, kind: str, token: str | None, name: str) -> None:
        from apps.kiosk.adapters import identity
        from apps.kiosk.audit import AuditTrail, default_db_path
        from apps.kiosk.pipeline import Pipeline
        from apps.kiosk.plc_links import open_plc
        from apps.kiosk.retention import Retention
        from apps.kiosk.sources import open_source
        from apps.kiosk.state import Follower, KioskState, board_temperature_c
        from runtime.llm.plan import default_budget
        from runtime.residency.loaders import default_loaders
        from runtime.residency.manager import ModelSpec, ResidencyManager

        cfg = self.config
        options = {}
        if self.capture_factory is not None and not os.path.isdir(cfg.source):  # a camera's or a video's capture
            options["capture_factory"] = self.capture_factory
        self.source = open_source(cfg.source, watch=cfg.watch, **options)
        self.residency = ResidencyManager(cfg.memory or default_budget(), loaders={**default_loaders(), **(self.loaders or {})})
        self.model_name = name  # fail-safe decisions name it too, so the audit trail shows one model
        self.residency.add(ModelSpec(name, cfg.model, kind, pinned=True, keep_alive_s=None,
                                     options={"threads": self.threads["model"], "batch": cfg.batch, "target": cfg.target}))
        self.pipeline = Pipeline(name, self.residency, policy, deadline_ms=cfg.deadline_ms, max_queue=cfg.max_queue,
                                 max_batch=cfg.batch, max_wait_ms=cfg.max_wait_ms, on_decision=self._on_decision)
        with self.residency.acquire(name) as model:
            classes = tuple(getattr(model, "labels", ()) or ())
            self.deciding_name, version, _ = identity(model)
        self.plc = open_plc(cfg.plc, journal=cfg.plc_journal, classes=classes)
        keep = Retention(cfg.audit_max_age_days * 86400.0, cfg.audit_db_quota, cfg.audit_min_free)
        self.audit = AuditTrail(cfg.audit_db or default_db_path(), quota_bytes=cfg.audit_quota, pass_sample=cfg.pass_sample,
                                retention=keep, on_fault=lambda message: self.faults.latch(FaultKind.AUDIT, message))
        self.state = KioskState(model=self.deciding_name, version=version, temperature=self.temperature or board_temperature_c,
                                faults=self.faults)
        if cfg.dashboard:
            from apps.kiosk.dashboard import serve_dashboard

            self.dashboard = serve_dashboard(self.state, cfg.host, cfg.port, token)
        self.follower = Follower(self.state, stats=self.pipeline.stats, plc=self.plc.state, source=self.source.health,
                                 audit=self.audit.stats)
        log.info("kiosk: %s -> %s (%s, %s) -> PLC %s; threads %s%s", cfg.source, cfg.model, version,
                 self.pipeline.placement or "placed", cfg.plc, self.threads,
                 f"; dashboard {self.dashboard.url}" if self.dashboard else "")
        self._started_at = time.monotonic()
        self._start_recorder()
        self._capture = threading.Thread(target=self._capture_loop, name="kiosk-capture", daemon=True)
        self._capture.start()

    # -- capture -> pipeline -> outputs ----------------------------------------------------------------------------
    def _capture_loop(self) -> None:
        cfg = self.config
        paced = cfg.rate > 0 and self.source.kind in ("video", "folder")
        period = 1.0 / cfg.rate if paced else 0.0
        next_at = time.monotonic()
        try:
            while not self._stopping.is_set():
                if paced:
                    delay = next_at - time.monotonic()
                    if delay > 0 and self._stopping.wait(delay):
                        break
                    next_at = max(next_at + period, time.monotonic() - period)  # a stall is not caught up in a burst
                try:
                    part = next(self.source)
                except StopIteration:
                    break
                self.submit(part)  # a part taken from the line is always decided, even while stopping
                if cfg.max_parts and self.captured >= cfg.max_parts:
                    break
        except Exception as exc:  # a source that breaks ends capture; what was captured is still decided
            self.capture_error = one_line(exc)
            log.error("kiosk: capture stopped: %s", self.capture_error)
        finally:
            self._captured_all.set()

    def submit(self, part: Part) -> None:
        with self._lock:
            self.captured += 1
            if part.image is not None:
                self._images[part.seq] = part.image
                while len(self._images) > MAX_HELD_IMAGES:
                    self._images.pop(next(iter(self._images)))
        self.pipeline.submit(part)

    def _on_decision(self, decision: Decision) -> None:
        """The pipeline's output thread: the PLC now (the gate waits for it); the audit trail and the page get it
        from the recorder thread, so a slow disk or page never delays the next part's PLC write. While a fault
        that rejects is latched, what goes out is a fail-safe reject; a decision the PLC journal refuses latches
        that fault, and the part is recorded as the fail-safe reject the PLC must have made of it."""
        fault = self.faults.rejecting()
        if fault is not None and decision.verdict is not Verdict.REJECT:
            decision = _fault_reject(decision, f"fault_latched: the {fault.kind.value} fault since "
                                               f"{time.strftime('%H:%M:%S', time.localtime(fault.since))}: {fault.message}")
        failed = self._output("plc", lambda: self.plc.send(decision), decision)
        if failed is not None:
            self.faults.latch(FaultKind.PLC, f"part {decision.seq} ({Verdict(decision.verdict).value}) did not reach the "
                                             f"PLC journal: {failed}", part=decision.seq)
            decision = _fault_reject(decision, f"plc_fault: {Verdict(decision.verdict).value} not delivered to the PLC: "
                                               f"{failed}")
        with self._lock:
            image = self._images.pop(decision.seq, None)
            self._count_decided(decision.seq)
            self._counts[Verdict(decision.verdict).value] += 1
            self._counts["failsafe"] += bool(decision.failsafe)
            if image is not None:
                if self._records_with_image >= RECORD_IMAGES:  # the recorder is behind: memory stays bounded
                    image = None
                    self._counts["record_images_dropped"] += 1
                else:
                    self._records_with_image += 1
        item = (decision, image)
        try:
            self._records.put_nowait(item)
        except queue.Full:
            log.warning("kiosk: %d decisions wait for the audit trail; the line waits for it", RECORD_QUEUE)
            self._records.put(item)  # never a lost row: back-pressure, after a long buffer

    def _output(self, name: str, write: Callable[[], object], decision: Decision) -> str | None:
        """None when ``write`` worked, else its error in one line (counted, logged)."""
        try:
            write()
        except Exception as exc:  # one output failing must not cost the others this decision
            with self._lock:
                self._errors[name] += 1
            error = one_line(exc)
            log.error("kiosk: part %d: %s output failed: %s", decision.seq, name, error)
            return error
        return None

    # -- faults --------------------------------------------------------------------------------------------------
    def clear_faults(self, operator: str, note: str = "") -> list[dict[str, Any]]:
        """Release every latched fault (an operator looked): decisions go out as decided again. Returns the faults
        released; the audit trail's ``events`` records who cleared them. BadInput for a bad operator or note."""
        return [f.to_dict() for f in self.faults.clear(operator, note)]

    def _on_fault_event(self, event: FaultEvent) -> None:
        """From the latching or clearing thread (the dashboard's too): queued for the audit trail, never waited for."""
        if event.action == "latched":
            log.error("kiosk: %s fault latched: %s", event.kind.value, event.message)
        else:
            log.warning("kiosk: %s fault cleared by %s: %s", event.kind.value, event.operator, event.message)
        with self._lock:
            if len(self._events) >= MAX_UNWRITTEN_EVENTS:
                self._events_lost += 1
                return
            self._events.append(event)
        try:
            self._records.put_nowait(_EVENTS)
        except queue.Full:  # the recorder has work queued: it writes the events before the next item anyway
            pass

    def _write_events(self) -> None:
        """The recorder thread: the fault events waiting, oldest first; those the trail refuses wait for the next try."""
        while True:
            with self._lock:
                if not self._events:
                    return
                event = self._events[0]
            try:
                self.audit.event(event.kind.value, event.action, event.message, operator=event.operator, at=event.at)
            except Exception as exc:  # the disk is still full: kept, and the trail's own fault is latched
                self.faults.latch(FaultKind.AUDIT, f"the {event.kind.value} {event.action} event was not written: {one_line(exc)}")
                return
            with self._lock:
                self._events.popleft()

    def _start_recorder(self) -> None:
        self._recorder = threading.Thread(target=self._record_loop, name="kiosk-records", daemon=True)
        self._recorder.start()

    def _record_loop(self) -> None:
        while (item := self._records.get()) is not None:
            self._write_events()  # a fault's latch is written before the row of the part it first cost
            if item is not _EVENTS:
                decision, image = item
                if image is not None:
                    with self._lock:
                        self._records_with_image -= 1
                failed = self._output("audit", lambda d=decision, i=image: self.audit.record(d, i), decision)
                if failed is not None:
                    self.faults.latch(FaultKind.AUDIT, f"the row of part {decision.seq} was not written: {failed}")
                self._output("dashboard", lambda d=decision, i=image: self.state.on_decision(d, i), decision)
            self._records.task_done()
        self._write_events()
        with self._lock:
            left, lost = list(self._events), self._events_lost
        for event in left:  # the log is the last place they can go
            log.error("kiosk: not in the audit trail: %s %s %s", event.kind.value, event.action, event.message)
        if lost:
            log.error("kiosk: %d fault events were dropped while the audit trail could not write", lost)
        self._records.task_done()

    def _records_idle(self, timeout: float | None) -> bool:
        """Until every decision handed out so far is in the audit trail and on the page."""
        end = None if timeout is None else time.monotonic() + timeout
        while self._records.unfinished_tasks and self._recorder is not None and self._recorder.is_alive():
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.005)
        return True

    def _count_decided(self, seq: int) -> None:  # under self._lock
        self._decided += 1
        if seq in self._seen:
            if len(self._twice) < MAX_TWICE:
                self._twice.append(seq)
            return
        self._seen.add(seq)
        self._seen_order.append(seq)
        if len(self._seen_order) > SEEN_WINDOW:
            self._seen.discard(self._seen_order.popleft())

    # -- model updates -------------------------------------------------------------------------------------------
    def update_model(self, ref: str, *, canary: float = 0.0) -> str:
        """Switch to ``ref`` between parts (or start a canary of it); the old version is kept for rollback.
        BadInput (the old version keeps deciding) when it does not resolve, load or fit the policy."""
        version = self.pipeline.swap(ref, canary=canary)
        if not canary:
            self.ref = ref
            self.state.set_model(self._model_name(), version)
        log.info("kiosk: model %s version %s %s", ref, version, f"on a {canary:.0%} canary" if canary else "deciding")
        return version

    def _model_name(self) -> str:
        from apps.kiosk.adapters import identity

        with self.pipeline.lease() as model:  # a swap loads the new version under a name of its own
            self.deciding_name = identity(model)[0]
        return self.deciding_name

    def promote(self) -> str:
        version = self.pipeline.promote()
        self.state.set_model(self._model_name(), version)
        return version

    def rollback(self) -> str:
        version = self.pipeline.rollback()
        self.state.set_model(self._model_name(), version)
        return version

    def request_reload(self) -> None:
        """Signal-safe: the run loop reloads kiosk.toml at its next tick."""
        self._reload.set()

    def reload(self) -> str | None:
        """Read kiosk.toml again and apply a changed ``[model] ref`` (with ``canary``); other settings need a
        restart. Returns the new version, or None when nothing changed or the update was refused (logged)."""
        if self.config.path is None:
            log.warning("kiosk: reload asked for, but the kiosk was started without --config")
            return None
        try:
            new = read_config(self.config.path)
            if not new.model or new.model == self.ref:
                log.info("kiosk: %s reloaded: [model] ref unchanged", self.config.path)
                return None
            return self.update_model(new.model, canary=new.canary)
        except BadInput as exc:
            log.error("kiosk: reload refused, still deciding with %s: %s", self.ref, one_line(exc))
            return None

    # -- run, stop, close ----------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Signal-safe: stop capturing; :meth:`wait` / :meth:`run` then shut down."""
        self._stopping.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Until capture ended (source done, max_parts, stop()) and every captured part was decided; serves reloads."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self._captured_all.wait(0.1):
            if self._reload.is_set():
                self._reload.clear()
                self.reload()
            if self._stopping.is_set():
                break
            if end is not None and time.monotonic() >= end:
                return False
        left = None if end is None else max(0.0, end - time.monotonic())
        if not self.pipeline.wait_idle(left):
            return False
        return self._records_idle(None if end is None else max(0.0, end - time.monotonic()))

    def run(self) -> dict[str, Any]:
        """start(), wait(), close(); returns the summary."""
        self.start()
        try:
            self.wait()
        finally:
            self.close()
        return self.summary()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        if self.source is not None:
            self.source.close()
        if self._capture is not None:
            self._capture.join(10.0)
            if self._capture.is_alive():
                log.warning("kiosk: the capture thread did not stop within 10 s")
        if self.pipeline is not None:
            self.pipeline.close()  # every part still queued or in flight is decided and handed out here
        if self._recorder is not None:  # every decision handed out reaches the audit trail before it closes
            self._records.put(None)
            self._recorder.join(RECORDS_DRAIN_S)
            if self._recorder.is_alive():
                log.error("kiosk: the audit trail did not take the last decisions within %.0f s", RECORDS_DRAIN_S)
        self._ended_at = time.monotonic()
        if self.plc is not None and self.plc_drain_s > 0 and not self.plc.drain(self.plc_drain_s):
            log.warning("kiosk: %d decisions not acknowledged by the PLC yet; journaled for the next start",
                        self.plc.state().backlog)
        for name, closer in (("dashboard feed", self.follower and self.follower.stop),
                             ("dashboard", self.dashboard and self.dashboard.stop),
                             ("audit pictures", self.audit and (lambda: self.audit.flush(10.0))),
                             ("audit state", self.audit and self._final_audit_state),
                             ("PLC state", self.plc and self._final_plc_state),
                             ("PLC", self.plc and self.plc.close), ("audit", self.audit and self.audit.close),
                             ("models", self.residency and self.residency.close)):
            if not closer:
                continue
            try:
                closer()
            except Exception as exc:  # the rest still closes
                log.error("kiosk: closing the %s failed: %s", name, one_line(exc))

    def _final_plc_state(self) -> None:
        self._plc_final = self.plc.state().to_dict()

    def _final_audit_state(self) -> None:
        self._audit_final = self.audit.stats()

    def __enter__(self) -> Kiosk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the result ----------------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        stats = self.pipeline.stats() if self.pipeline is not None else {}
        with self._lock:
            counts, decided, twice = dict(self._counts), self._decided, sorted(set(self._twice))
            errors = dict(self._errors)
        end = self._ended_at if self._ended_at is not None else time.monotonic()
        seconds = max(1e-9, end - self._started_at) if self._started_at else 0.0
        total = stats.get("latency_ms", {}).get("total", {})
        plc = self._plc_final or (self.plc.state().to_dict() if self.plc is not None and not self._closed
                                                    else None)
        return {
            "source": self.config.source, "model": self.deciding_name,
            "version": stats.get("version", ""),
            "placement": stats.get("placement", ""), "threads": self.threads,
            "parts": self.captured, "decided": decided, "undecided": self.captured - decided,
            "twice": twice,
            "pass": counts.get("pass", 0), "reject": counts.get("reject", 0), "review": counts.get("review", 0),
            "failsafe": counts.get("failsafe", 0), "failsafe_by_reason": stats.get("failsafe", {}),
            "latency_ms": {"p50": total.get("p50"), "p99": total.get("p99")},
            "seconds": round(seconds, 3), "parts_per_s": round(decided / seconds, 2) if seconds else 0.0,
            "plc": plc, "output_errors": errors, "capture_error": self.capture_error,
            "source_health": self.source.health() if self.source is not None else None,
            "audit_pictures_dropped": getattr(self.audit, "pictures_dropped", 0),
            "audit": self._audit_final or (self.audit.stats() if hasattr(self.audit, "stats") and not self._closed
                                           else None),
            "faults": self.faults.snapshot(),
        }


def _fault_reject(decision: Decision, reason: str) -> Decision:
    """``decision`` as a fail-safe reject for ``reason`` (the model's score and latencies kept)."""
    return replace(decision, verdict=Verdict.REJECT, reason=reason[:500], failsafe=True)


def summary_line(s: Mapping[str, Any]) -> str:
    """One line for the end of ``edgerun kiosk``."""
    lat = s["latency_ms"]
    p = "n/a" if lat["p50"] is None else f"{lat['p50']:.1f}/{lat['p99']:.1f} ms"
    plc = s.get("plc") or {}
    acked = f", PLC backlog {plc.get('backlog')}" if plc else ""
    faults = (s.get("faults") or {}).get("active") or []
    latched = f"; FAULT latched: {', '.join(f['kind'] for f in faults)}" if faults else ""
    return (f"kiosk: {s['parts']} parts in {s['seconds']:.1f} s ({s['parts_per_s']:.1f}/s): {s['pass']} pass, "
            f"{s['reject']} reject, {s['review']} review; {s['failsafe']} fail-safe; total latency p50/p99 {p}"
            f"{acked}; model {s['model']} {s['version']}{latched}")
