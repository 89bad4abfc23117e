"""The kiosk's fault latch: an output that failed stays a visible fault until an operator clears it.

A fault is latched by the kiosk when one of its outputs fails: ``plc`` (a decision could not be journaled for the
PLC: a full SD card, an I/O error) or ``audit`` (a row or a picture of the audit trail could not be written). A
latched fault stays latched when the cause goes away (a line that lost decisions needs a person to look), and a
repeated failure only counts up. While a ``plc`` fault is latched, every decision the kiosk sends is a fail-safe
reject (:data:`REJECTING`): the PLC never gets an accept the kiosk cannot vouch for. An ``audit`` fault is shown
and recorded, but parts are still decided: the PLC gets each decision, only its evidence is missing.

:meth:`FaultLatch.clear` (the dashboard's ``POST /api/faults/clear``, or :meth:`apps.kiosk.app.Kiosk.clear_faults`)
releases every latched fault and names the operator; each latch and each clear is a :class:`FaultEvent`, which the
kiosk writes to the audit trail's ``events`` table.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Any

from runtime.errors import BadInput

MAX_MESSAGE = 300  # characters of a fault's message kept (the first failure's, the latest's)
OPERATOR = re.compile(r"[\w .@-]{1,64}")  # who cleared: a name or badge id, printable, one line
MAX_NOTE = 200  # characters of the operator's note


class FaultKind(str, Enum):
    PLC = "plc"  # a decision did not reach the PLC journal
    AUDIT = "audit"  # a row or picture of the audit trail was not written


REJECTING = frozenset({FaultKind.PLC})  # latched faults that turn every decision into a fail-safe reject


@dataclass(frozen=True)
class Fault:
    """A latched fault. ``since``/``last``: Unix seconds of the first and the latest failure; ``part``: the part
    seq the first failure lost (None when none was)."""

    kind: FaultKind
    message: str
    since: float
    last: float
    count: int
    part: int | None = None
    last_message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind.value, "rejecting": self.kind in REJECTING}


@dataclass(frozen=True)
class FaultEvent:
    """One line of the fault history: ``action`` "latched" or "cleared"; ``operator`` names who cleared."""

    at: float
    kind: FaultKind
    action: str
    message: str
    operator: str | None = None


class FaultLatch:
    """Thread-safe. ``on_event`` is called (on the failing or the clearing thread, without the lock held) for every
    latch and clear; it must not block."""

    def __init__(self, on_event: Callable[[FaultEvent], None] | None = None, *,
                 wall: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._faults: dict[FaultKind, Fault] = {}
        self._listeners: list[Callable[[FaultEvent], None]] = [on_event] if on_event is not None else []
        self._wall = wall
        self.latched_total = 0  # faults latched since start
        self.cleared_total = 0

    def listen(self, on_event: Callable[[FaultEvent], None]) -> None:
        with self._lock:
            self._listeners.append(on_event)

    def latch(self, kind: FaultKind | str, message: str, *, part: int | None = None) -> bool:
        """Latch ``kind`` (or count one more failure of it); True when it was not latched before."""
        kind, message, now = FaultKind(kind), message[:MAX_MESSAGE], self._wall()
        with self._lock:
            old = self._faults.get(kind)
            if old is not None:
                self._faults[kind] = replace(old, last=now, count=old.count + 1, last_message=message)
                return False
            self._faults[kind] = Fault(kind, message, now, now, 1, part, message)
            self.latched_total += 1
            listeners = list(self._listeners)
        self._emit(listeners, FaultEvent(now, kind, "latched", message))
        return True

    def clear(self, operator: str, note: str = "") -> list[Fault]:
        """Release every latched fault; returns those released. BadInput for an operator that is not 1-64 letters,
        digits, spaces or ``._@-``, or a note over MAX_NOTE characters."""
        if not isinstance(operator, str) or not OPERATOR.fullmatch(operator):
            raise BadInput(f"operator {str(operator)[:40]!r} is invalid; give 1-64 letters, digits, spaces or ._@-")
        if not isinstance(note, str) or len(note) > MAX_NOTE or not note.isprintable():
            raise BadInput(f"note is invalid; give at most {MAX_NOTE} printable characters on one line")
        now = self._wall()
        with self._lock:
            cleared, self._faults = list(self._faults.values()), {}
            self.cleared_total += len(cleared)
            listeners = list(self._listeners)
        for fault in cleared:
            text = f"{fault.count} failure(s) since the first: {fault.message}" + (f"; note: {note}" if note else "")
            self._emit(listeners, FaultEvent(now, fault.kind, "cleared", text[:MAX_MESSAGE + MAX_NOTE], operator))
        return cleared

    def rejecting(self) -> Fault | None:
        """The latched fault that makes every decision a reject, None when none is."""
        with self._lock:
            return next((f for k, f in self._faults.items() if k in REJECTING), None)

    def active(self) -> list[Fault]:
        with self._lock:
            return list(self._faults.values())

    def snapshot(self) -> dict[str, Any]:
        """For the dashboard and the summary."""
        with self._lock:
            faults = [f.to_dict() for f in self._faults.values()]
            latched, cleared = self.latched_total, self.cleared_total
        return {"latched": bool(faults), "rejecting": any(f["rejecting"] for f in faults), "active": faults,
                "latched_total": latched, "cleared_total": cleared}

    @staticmethod
    def _emit(listeners: list[Callable[[FaultEvent], None]], event: FaultEvent) -> None:
        for listener in listeners:
            listener(event)
