"""Per-turn timing of every stage, as structured events, and the session's p50/p95 over turns.

Each :class:`~apps.voice.types.TurnEvent` is logged on the ``edgerun.voice.turn`` logger as one JSON object
(``{"event": "voice.turn", "turn": 3, "mark": "first_audio", "t": ..., "ms_after_speech_end": 612.4}``) and handed to
the caller's sink; a turn's latencies are milliseconds from its end of speech.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from apps.voice.types import SUMMARY_MARKS, Mark, TurnEvent
from runtime.metrics import PercentileMethod, percentile

log = logging.getLogger("edgerun.voice.turn")
NEAREST = PercentileMethod.NEAREST_RANK  # a session's p50/p95 is a latency some turn had, not an interpolation


class Timeline:
    """The marks of one turn. ``mark`` records a moment once (the first time it happens) and emits its event."""

    def __init__(self, turn: int, emit: Callable[[TurnEvent], None]) -> None:
        self.turn = turn
        self.marks: dict[Mark, float] = {}
        self._emit = emit
        self._lock = threading.Lock()  # marks come from several stages' threads

    def mark(self, mark: Mark, t: float, **detail: Any) -> bool:
        """False (nothing emitted) when ``mark`` was already recorded for this turn."""
        with self._lock:
            if mark in self.marks:
                return False
            self.marks[mark] = t
            end = self.marks.get(Mark.SPEECH_END)
        if end is not None and mark is not Mark.SPEECH_END and t >= end:
            detail = {"ms_after_speech_end": round((t - end) * 1000, 1), **detail}
        self._emit(TurnEvent(self.turn, mark, t, detail))
        return True

    def latencies_ms(self) -> dict[str, float]:
        """Milliseconds from the end of speech to each summarized mark this turn reached."""
        end = self.marks.get(Mark.SPEECH_END)
        if end is None:
            return {}
        return {m.value: (self.marks[m] - end) * 1000 for m in SUMMARY_MARKS if m in self.marks}


class SessionTiming:
    """Collects every turn's events and latencies; :meth:`summary` gives p50/p95 per mark. Thread-safe."""

    def __init__(self, sink: Callable[[TurnEvent], None] | None = None) -> None:
        self._sink = sink
        self._lock = threading.Lock()
        self._latencies: dict[str, list[float]] = {m.value: [] for m in SUMMARY_MARKS}
        self.events: list[TurnEvent] = []
        self.turns = 0

    def emit(self, event: TurnEvent) -> None:
        with self._lock:
            self.events.append(event)
        log.info("%s", json.dumps(event.to_dict(), default=str))
        if self._sink is not None:
            self._sink(event)

    def timeline(self, turn: int) -> Timeline:
        return Timeline(turn, self.emit)

    def finish(self, timeline: Timeline) -> dict[str, float]:
        """Count ``timeline``'s latencies in the session; they are returned."""
        lat = timeline.latencies_ms()
        with self._lock:
            self.turns += 1
            for name, ms in lat.items():
                self._latencies[name].append(ms)
        return lat

    def summary(self) -> dict[str, dict[str, float]]:
        """``{mark: {"n", "p50_ms", "p95_ms"}}`` for each summarized mark some turn reached."""
        with self._lock:
            return {name: {"n": len(v), "p50_ms": round(percentile(v, 50, method=NEAREST), 1),
                           "p95_ms": round(percentile(v, 95, method=NEAREST), 1)}
                    for name, v in self._latencies.items() if v}

    def summary_lines(self) -> list[str]:
        rows = self.summary()
        if not rows:
            return ["no turn reached the end of speech"]
        return [f"{name:<15} n={r['n']:<3} p50 {r['p50_ms']:8.1f} ms  p95 {r['p95_ms']:8.1f} ms  (from end of speech)"
                for name, r in rows.items()]
