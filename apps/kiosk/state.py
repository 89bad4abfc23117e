"""What the kiosk shows: a small thread-safe observable the kiosk app updates and the dashboard reads.

The app calls :meth:`KioskState.on_part` for every captured part and hands :meth:`KioskState.on_decision` to the
pipeline as its ``on_decision``; a :class:`Follower` copies the pipeline's stats, the PLC's state and the source's
health in every second (or the app calls the ``set_*`` methods itself). None of them blocks on a reader: the
dashboard subscribes (:meth:`KioskState.subscribe`) and gets a bounded queue of change notes per browser; a slow
browser loses the oldest notes (counted), never slows the line. Pictures are encoded only when someone asks for
them (:meth:`frame_picture`, :meth:`reject_picture`), on the asker's thread.

Times: ``clock`` is ``time.monotonic`` (rates, buckets), ``wall`` is ``time.time`` (what the page prints);
latencies are milliseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from apps.kiosk import overlay
from apps.kiosk.faults import FaultLatch
from apps.kiosk.types import STAGES, Decision, Part, Verdict
from runtime.errors import BadInput, one_line
from runtime.metrics import PercentileMethod, percentile

log = logging.getLogger(__name__)

MAX_REASONS = 16  # distinct fail-safe reasons counted by name; more are counted as "other"
REASON_CHARS = 48  # a reason's key: its text up to the first ":" (the detail after it varies per part)
TEMPERATURE_EVERY_S = 5.0  # a thermal zone read costs a few syscalls: at most once per this many seconds
SATURATED = "saturated"  # the pipeline's fail-safe reason key for a part the full box could not take
RECENT_FRAMES = 8  # frames kept so the page can fetch the frame of the decision it shows, not a newer one
MAX_PENDING = 1024  # frames remembered by on_part: far more parts than a pipeline ever holds undecided


def board_temperature_c() -> float | None:
    """The CPU's temperature from the board's thermal zones, None when there is no readable sensor (as the
    server's metrics read it)."""
    from devices.live import cpu_temperature_c, read_thermal_zones
    from devices.rootfs import RootFS

    return cpu_temperature_c(read_thermal_zones(RootFS.at("/")))


def _p50_p99(values: np.ndarray) -> dict[str, float | None]:
    """The median and p99 of ``values`` (ms, numpy's linear method, to the microsecond); None for both when empty."""
    return {f"p{q}": round(percentile(values, q, method=PercentileMethod.LINEAR), 3) if values.size else None
            for q in (50, 99)}


def _jsonable(value: Any) -> Any:
    """``value`` with only JSON types: enums by value, numpy scalars as numbers, NaN/inf as None, other objects
    as text. For the free-form dicts the app hands in (PLC state, source health, pipeline stats)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset, deque)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, str)) or value is None:
        return value.value if hasattr(value, "value") and isinstance(value, str) else value
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return str(getattr(value, "value", value))


def _latency_summary(window: list[dict[str, float]]) -> dict[str, Any]:
    """p50/p99 of the total and of each stage (in pipeline order) over a window of ``latency_ms`` dicts."""
    totals = np.asarray([lat["total"] for lat in window], dtype=np.float64)
    seen = {k for lat in window for k in lat if k != "total"}
    stages = {}
    for stage in [k for k in STAGES if k in seen] + sorted(seen - set(STAGES)):
        values = np.asarray([lat[stage] for lat in window if stage in lat], dtype=np.float64)
        stages[stage] = _p50_p99(values)
    return {"n": int(totals.size), **_p50_p99(totals), "stages": stages}


def reason_key(reason: str) -> str:
    """The name a fail-safe reason is counted under: its text before the first ':' ("deadline: 153 ms" ->
    "deadline"), so per-part details do not make every reason distinct."""
    return (reason.split(":", 1)[0].strip() or "unknown")[:REASON_CHARS]


def _for_display(image: np.ndarray | None) -> np.ndarray | None:
    """``image``, or a copy of every k-th pixel when it is larger than the page shows: a kept 1080p frame would
    cost 6 MB a reject; this costs a strided copy of a tenth of it."""
    if image is None or max(image.shape[:2]) <= overlay.MAX_SIDE:
        return image
    k = math.ceil(max(image.shape[:2]) / overlay.MAX_SIDE)
    return np.ascontiguousarray(image[::k, ::k])


class _Shown:
    """A decided part whose picture may be asked for: its arrays until the picture is first encoded, then only
    the JPEG."""

    def __init__(self, n: int, decision: Decision, image: np.ndarray | None, t_wall: float) -> None:
        self.seq = decision.seq
        self.image, self.heatmap = image, decision.heatmap  # image: display-sized already (_for_display)
        self.picture: bytes | None = None
        self.info = {"n": n, "seq": decision.seq, "frame_id": decision.frame_id,
                     "verdict": Verdict(decision.verdict).value, "reason": decision.reason,
                     "score": _jsonable(decision.score), "confidence": _jsonable(decision.confidence),
                     "failsafe": bool(decision.failsafe), "label": decision.label, "t": round(t_wall, 3),
                     "image": image is not None, "heatmap": decision.heatmap is not None}

    @property
    def n(self) -> int:
        return self.info["n"]

    def encode(self) -> bytes | None:
        """The JPEG (heat map blended in), made once; the arrays are dropped then."""
        image, heatmap, picture = self.image, self.heatmap, self.picture  # two readers may encode at once
        if picture is None and image is not None:
            picture = self.picture = overlay.encode(image, heatmap)
            self.image = self.heatmap = None
        return picture


@dataclass
class _Bucket:
    t0: float  # monotonic start
    t_wall: float
    counts: Counter
    latencies: list[float]

    def summary(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies, dtype=np.float64)
        return {"t": round(self.t_wall, 3), "parts": sum(self.counts[v.value] for v in Verdict),
                **{v.value: self.counts[v.value] for v in Verdict}, "failsafe": self.counts["failsafe"],
                **_p50_p99(lat)}


class Subscription:
    """A reader's bounded queue of change notes (``{"kind": ...}``). The writer never waits: when the queue is
    full the oldest note goes (``dropped`` counts them). Read with :meth:`get` (a thread) or :meth:`next`
    (an asyncio task of the loop given to :meth:`KioskState.subscribe`)."""

    def __init__(self, state: KioskState, maxsize: int, loop: asyncio.AbstractEventLoop | None) -> None:
        self._state = state
        self._notes: deque[dict[str, Any]] = deque()
        self._maxsize = maxsize
        self._cond = threading.Condition()
        self._loop = loop
        self._ready = asyncio.Event() if loop is not None else None
        self.dropped = 0
        self.closed = False

    def put(self, note: dict[str, Any]) -> None:
        with self._cond:
            if self.closed:
                return
            if len(self._notes) >= self._maxsize:
                self._notes.popleft()
                self.dropped += 1
            self._notes.append(note)
            self._cond.notify_all()
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:  # the reader's loop is closed: it is gone
                self.close()

    def _drain(self) -> list[dict[str, Any]]:
        notes = list(self._notes)
        self._notes.clear()
        return notes

    def get(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """The notes queued so far, waiting up to ``timeout`` s for one; [] on timeout or once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._notes or self.closed, timeout)
            return self._drain()

    async def next(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Like :meth:`get`, from the subscribing loop."""
        if self._ready is None:
            raise BadInput("this subscription has no event loop: subscribe(loop=...) to read it with next()")
        with self._cond:
            if self._notes or self.closed:
                return self._drain()
            self._ready.clear()
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            pass
        with self._cond:
            return self._drain()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:
                pass
        self._state._unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KioskState:
    """Counts, rates, a latency window, a bounded reject gallery and a bounded history, fed by the kiosk app.

    ``gallery``: rejects kept (newest first on the page); ``latency_window``: decisions the p50/p99 are over;
    ``rate_window_s``: the window parts/s is measured over; ``bucket_s`` and ``history``: the charts' bucket
    width and how many buckets are kept; ``saturation_hold_s``: how long "saturated" stays on after the last
    saturated part; ``temperature``: a no-argument callable giving °C or None (default: the board's sensor);
    ``faults``: the kiosk's fault latch (shown, and cleared through :attr:`faults` by the dashboard).
    """

    def __init__(self, *, model: str = "", version: str = "", gallery: int = 24, latency_window: int = 1000,
                 rate_window_s: float = 10.0, bucket_s: float = 60.0, history: int = 60,
                 saturation_hold_s: float = 5.0, temperature: Callable[[], float | None] | None = board_temperature_c,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 faults: FaultLatch | None = None) -> None:
        for name, value in (("gallery", gallery), ("latency_window", latency_window), ("history", history)):
            if not isinstance(value, int) or value < 1:
                raise BadInput(f"KioskState {name} must be a positive integer, got {value!r}")
        for name, value in (("rate_window_s", rate_window_s), ("bucket_s", bucket_s)):
            if not value > 0:
                raise BadInput(f"KioskState {name} must be > 0 seconds, got {value!r}")
        self._lock = threading.Lock()
        self._clock, self._wall = clock, wall
        self._temperature = temperature
        self._temp_value: float | None = None
        self._temp_at = -math.inf
        self.rate_window_s, self.bucket_s, self.saturation_hold_s = rate_window_s, bucket_s, saturation_hold_s
        self.model, self.version = model, version
        self.started = wall()
        self._t0 = clock()
        self.changes = 0  # bumped on every update: a snapshot's "version"
        self._counts: Counter = Counter()
        self._reasons: Counter = Counter()
        self._latency: deque[dict[str, float]] = deque(maxlen=latency_window)
        self._times: deque[float] = deque(maxlen=100_000)  # decision times within the rate window
        self._gallery: deque[_Shown] = deque(maxlen=gallery)
        self._rejects = 0
        self._recent: deque[_Shown] = deque(maxlen=RECENT_FRAMES)
        self._pending: dict[int, np.ndarray] = {}  # seq -> frame of a part not decided yet (on_part)
        self._history: deque[dict[str, Any]] = deque(maxlen=history)  # closed buckets' summaries
        self._bucket: _Bucket | None = None
        self._saturated_at = -math.inf
        self._pipeline: dict[str, Any] | None = None
        self._plc: dict[str, Any] | None = None
        self._source: dict[str, Any] | None = None
        self._audit: dict[str, Any] | None = None
        self._subscribers: list[Subscription] = []
        self.faults = faults if faults is not None else FaultLatch()
        self.faults.listen(self._on_fault)

    # --- writers (the kiosk app's threads) ---------------------------------------------------------------------

    def on_part(self, part: Part) -> None:
        """A captured part on its way to the pipeline: its frame is shown with its decision, so that
        :meth:`on_decision` can be the pipeline's ``on_decision`` as it is. Holds a reference only (the pipeline
        holds the part meanwhile anyway); at most MAX_PENDING parts, the oldest forgotten first."""
        if part.image is None:
            return
        with self._lock:
            self._pending[part.seq] = part.image
            while len(self._pending) > MAX_PENDING:
                self._pending.pop(next(iter(self._pending)))

    def on_decision(self, decision: Decision, image: np.ndarray | None = None, *,
                    saturated: bool | None = None) -> None:
        """Count one decision. ``image`` is the part's frame (HxWx3 uint8 RGB; default: the one :meth:`on_part`
        was given for this seq): it becomes the live frame and, for a reject, a gallery picture (with
        ``decision.heatmap`` blended in). ``saturated``: this part was decided by the fail-safe because the box
        was full (default: its reason says so, as the pipeline's ``"saturated: ..."`` does)."""
        verdict = Verdict(decision.verdict)
        if saturated is None:
            saturated = bool(decision.failsafe) and reason_key(decision.reason) == SATURATED
        with self._lock:
            pending = self._pending.pop(decision.seq, None)
        display = _for_display(pending if image is None else image)  # a copy, when one is made, outside the lock
        now, wall = self._clock(), self._wall()
        with self._lock:
            self._roll(now, wall)
            self._counts[verdict.value] += 1
            self._bucket.counts[verdict.value] += 1
            if decision.failsafe:
                self._counts["failsafe"] += 1
                self._bucket.counts["failsafe"] += 1
                key = reason_key(decision.reason)
                self._reasons[key if key in self._reasons or len(self._reasons) < MAX_REASONS else "other"] += 1
            if saturated:
                self._counts["saturated"] += 1
                self._saturated_at = now
            total = decision.latency_ms.get("total")
            if total is not None and math.isfinite(total):
                self._latency.append({k: float(v) for k, v in decision.latency_ms.items() if math.isfinite(v)})
                self._bucket.latencies.append(float(total))
            self._times.append(now)
            self.model, self.version = decision.model or self.model, decision.version or self.version
            if verdict is Verdict.REJECT:
                self._rejects += 1
            shown = _Shown(self._rejects if verdict is Verdict.REJECT else 0, decision, display, wall)
            self._recent.append(shown)
            if verdict is Verdict.REJECT:
                self._gallery.append(shown)
            self.changes += 1
        self._publish({"kind": "decision", "seq": decision.seq, "verdict": verdict.value})

    def set_pipeline(self, stats: Mapping[str, Any]) -> None:
        """The pipeline's ``stats()``. Its ``saturated`` flag, or a rise of its ``saturation`` count (parts the
        full box decided by the fail-safe), turns "saturated" on for ``saturation_hold_s``."""
        stats = _jsonable(stats)
        with self._lock:
            before = (self._pipeline or {}).get("saturation")
            after = stats.get("saturation")
            rose = isinstance(after, (int, float)) and after > (before if isinstance(before, (int, float)) else 0)
            if stats.get("saturated") is True or rose:
                self._saturated_at = self._clock()
            self._pipeline = stats
            self.changes += 1
        self._publish({"kind": "pipeline"})

    def set_plc(self, state: Any) -> None:
        """The PLC link's ``state()`` (apps.kiosk.plc.PlcState or a dict: connected, backlog, last_acked_part...),
        None when the kiosk has no PLC."""
        if state is not None and not isinstance(state, Mapping):
            state = state.to_dict() if hasattr(state, "to_dict") else dataclasses.asdict(state)
        self._set("_plc", None if state is None else _jsonable(state), "plc")

    def set_source(self, health: Mapping[str, Any] | None) -> None:
        """The source's ``health()`` (camera open, frames, restarts...)."""
        self._set("_source", None if health is None else _jsonable(health), "source")

    def set_audit(self, stats: Mapping[str, Any] | None) -> None:
        """The audit trail's ``stats()`` (rows kept, pruned counts, free space...)."""
        self._set("_audit", None if stats is None else _jsonable(stats), "audit")

    def _on_fault(self, event: Any) -> None:
        with self._lock:
            self.changes += 1
        self._publish({"kind": "fault", "fault": event.kind.value, "action": event.action})

    def set_model(self, name: str, version: str) -> None:
        with self._lock:
            self.model, self.version = name, version
            self.changes += 1
        self._publish({"kind": "model"})

    def _set(self, attr: str, value: Any, kind: str) -> None:
        with self._lock:
            if getattr(self, attr) == value:  # a poller re-reading an unchanged state wakes no browser
                return
            setattr(self, attr, value)
            self.changes += 1
        self._publish({"kind": kind})

    def _roll(self, now: float, wall: float) -> None:
        """Close the history buckets ``now`` is past (empty ones for a quiet line) and open the current one.
        Called with the lock held."""
        if self._bucket is None:
            self._bucket = _Bucket(now, wall, Counter(), [])
            return
        passed = int((now - self._bucket.t0) // self.bucket_s)
        if passed <= 0:
            return
        self._history.append(self._bucket.summary())
        t0 = self._bucket.t0
        first_wall = self._bucket.t_wall
        for k in range(max(1, passed - self._history.maxlen), passed):  # the empty ones, at most a history's worth
            self._history.append(_Bucket(t0, first_wall + k * self.bucket_s, Counter(), []).summary())
        self._bucket = _Bucket(t0 + passed * self.bucket_s, first_wall + passed * self.bucket_s, Counter(), [])

    def _publish(self, note: dict[str, Any]) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for sub in subscribers:
            sub.put(note)

    # --- readers (the dashboard) -------------------------------------------------------------------------------

    def subscribe(self, maxsize: int = 16, loop: asyncio.AbstractEventLoop | None = None) -> Subscription:
        """A new reader's queue of change notes, at most ``maxsize`` kept. Close it when the reader goes."""
        sub = Subscription(self, maxsize, loop)
        with self._lock:
            self._subscribers.append(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def temperature_c(self) -> float | None:
        """The device's temperature, read at most every TEMPERATURE_EVERY_S; None without a sensor."""
        if self._temperature is None:
            return None
        now = self._clock()
        if now - self._temp_at >= TEMPERATURE_EVERY_S:
            try:
                value = self._temperature()
            except OSError as exc:
                log.warning("cannot read the device temperature: %s", exc)
                value = None
            self._temp_value = None if value is None or not math.isfinite(value) else round(float(value), 1)
            self._temp_at = now
        return self._temp_value

    def snapshot(self) -> dict[str, Any]:
        """Everything the page shows, JSON-able (pictures by URL number, never inline)."""
        temperature = self.temperature_c()
        now, wall = self._clock(), self._wall()
        with self._lock:
            self._roll(now, wall)
            while self._times and now - self._times[0] > self.rate_window_s:
                self._times.popleft()
            counts = {v.value: self._counts[v.value] for v in Verdict}
            parts = sum(counts.values())
            window = min(self.rate_window_s, max(now - self._t0, 1.0))  # a young kiosk: over its true age
            latency = list(self._latency)  # the percentiles are worked out after the lock is let go
            last = dict(self._recent[-1].info) if self._recent else None
            snap = {
                "version": self.changes,
                "t": round(wall, 3),
                "started": round(self.started, 3),
                "model": {"name": self.model, "version": self.version},
                "counts": {"parts": parts, **counts, "failsafe": self._counts["failsafe"],
                           "saturated": self._counts["saturated"]},
                "failsafe_reasons": dict(self._reasons.most_common()),
                "rates": {"parts_per_s": round(len(self._times) / window, 3) if self._times else 0.0,
                          **{f"{v}_pct": round(100.0 * n / parts, 2) if parts else None for v, n in counts.items()},
                          "failsafe_pct": round(100.0 * self._counts["failsafe"] / parts, 2) if parts else None},

                "saturated": now - self._saturated_at <= self.saturation_hold_s,
                "pipeline": self._pipeline,
                "plc": self._plc,
                "source": self._source,
                "audit": self._audit,
                "faults": self.faults.snapshot(),
                "temperature_c": temperature,
                "last": last,
                "gallery": [dict(shown.info) for shown in reversed(self._gallery)],
                "history": {"bucket_s": self.bucket_s,
                            "buckets": [*self._history, self._bucket.summary()]},
                "subscribers": len(self._subscribers),
            }
        snap["latency_ms"] = _latency_summary(latency)
        return snap

    def frame_picture(self, seq: int | None = None) -> tuple[int, bytes] | None:
        """(seq, JPEG) of the part ``seq`` when it is among the last few decided, else of the latest one with a
        frame; None when no decided part had one."""
        with self._lock:
            recent = [s for s in self._recent if s.image is not None or s.picture is not None]
        if not recent:
            return None
        chosen = next((s for s in recent if s.seq == seq), recent[-1])
        picture = chosen.encode()
        return (chosen.seq, picture) if picture is not None else None

    def reject_picture(self, n: int) -> bytes | None:
        """The JPEG of gallery reject ``n`` (heat map blended in), None when it has left the gallery or had no
        frame."""
        with self._lock:
            shown = next((s for s in self._gallery if s.n == n), None)
        return shown.encode() if shown is not None else None


class Follower:
    """A daemon thread that copies the kiosk's pull-style states into a :class:`KioskState` every ``every_s``:
    ``stats`` (the pipeline's ``stats``), ``plc`` (the PLC output's ``state``), ``source`` (the source's
    ``health``), ``audit`` (the audit trail's ``stats``), each a no-argument callable or None. A reader that
    raises is logged and tried again next time; an unchanged PLC or source state wakes no browser."""

    def __init__(self, state: KioskState, *, stats: Callable[[], Mapping[str, Any]] | None = None,
                 plc: Callable[[], Any] | None = None, source: Callable[[], Mapping[str, Any]] | None = None,
                 audit: Callable[[], Mapping[str, Any]] | None = None, every_s: float = 1.0) -> None:
        if not every_s > 0:
            raise BadInput(f"the dashboard's refresh period must be > 0 seconds, got {every_s!r}")
        self._feeds = [(name, read, write) for name, read, write in
                       (("pipeline stats", stats, state.set_pipeline), ("PLC state", plc, state.set_plc),
                        ("source health", source, state.set_source), ("audit trail", audit, state.set_audit))
                       if read is not None]
        self.every_s = every_s
        self._stop = threading.Event()
        self._failing: set[str] = set()
        self.poll()  # the page opens on the current state, not a second later
        self._thread = threading.Thread(target=self._run, name="kiosk-dashboard-feed", daemon=True)
        self._thread.start()

    def poll(self) -> None:
        for name, read, write in self._feeds:
            try:
                write(read())
            except Exception as exc:  # a reader's failure must not end the feed: the next poll tries again
                if name not in self._failing:
                    log.warning("dashboard: cannot read the %s: %s", name, one_line(exc))
                self._failing.add(name)
            else:
                self._failing.discard(name)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.poll()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
