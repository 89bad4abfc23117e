"""Fail-safe output: a decision that does not arrive in time becomes the configured safe value.

A kiosk that asks "accept or reject?" must not hang the line when inference is
slow or crashed. Each trigger opens a :class:`PendingDecision` with a deadline;
``decide()`` before the deadline journals the real result, and when the deadline
passes first ``poll()`` journals the safe value as a ``FAILSAFE`` frame and
records why in the journal's ``failsafe_log``. A decision that arrives after its
fail-safe went out is refused (returns None) and logged: the PLC has already
acted on the safe value, and sending a second answer for the same trigger would
be the duplicate the link exists to prevent.

The PLC should still run its own watchdog: if the link itself is down, the
journaled fail-safe reaches it only on reconnect.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from dataclasses import dataclass, field

from devices.link.frame import MAX_PAYLOAD, FrameType
from devices.link.journal import Journal
from runtime.errors import BadInput

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FailSafePolicy:
    safe_value: bytes  # sent when no decision arrives in time; for a kiosk: the "reject" result
    deadline_s: float  # seconds from trigger to decision

    def __post_init__(self) -> None:
        if not (isinstance(self.deadline_s, (int, float)) and math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise BadInput(f"fail-safe deadline {self.deadline_s!r} s is invalid; give a positive number of seconds")
        if len(self.safe_value) > MAX_PAYLOAD:
            raise BadInput(f"safe value of {len(self.safe_value)} bytes exceeds the frame maximum of {MAX_PAYLOAD}")


@dataclass
class PendingDecision:
    trigger: str
    deadline_ns: int  # time.monotonic_ns() at which the safe value goes out
    seq: int | None = None  # the journal seq of whatever was sent for this trigger
    failsafe: bool = False
    _id: int = field(default=0, repr=False)

    @property
    def done(self) -> bool:
        return self.seq is not None


class FailSafe:
    """Tracks open decisions; thread-safe. The link calls ``poll()`` on every loop turn."""

    def __init__(self, journal: Journal, policy: FailSafePolicy, *, on_journal=None) -> None:
        self.journal = journal
        self.policy = policy
        self._on_journal = on_journal  # called after anything is journaled (wakes the link)
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, PendingDecision]] = []
        self._ids = itertools.count(1)
        self.sent_failsafes = 0
        self.late_decisions = 0

    def begin(self, trigger: str, deadline_s: float | None = None) -> PendingDecision:
        """Start the clock for one trigger (a part at the camera, a PLC request)."""
        seconds = self.policy.deadline_s if deadline_s is None else deadline_s
        if not (math.isfinite(seconds) and seconds > 0):
            raise BadInput(f"deadline {seconds!r} s for trigger {trigger!r} is invalid; give a positive number")
        pending = PendingDecision(trigger=trigger, deadline_ns=time.monotonic_ns() + int(seconds * 1e9), _id=next(self._ids))
        with self._lock:
            heapq.heappush(self._heap, (pending.deadline_ns, pending._id, pending))
        return pending

    def decide(self, pending: PendingDecision, payload: bytes) -> int | None:
        """Journal the real decision; None when the safe value already went out for this trigger."""
        with self._lock:
            if pending.done:
                self.late_decisions += 1
                log.warning("decision for %s arrived after its fail-safe (seq %s); not sent", pending.trigger, pending.seq)
                return None
            pending.seq = self.journal.append(payload, FrameType.RESULT)
        self._notify()
        return pending.seq

    def poll(self, now_ns: int | None = None) -> list[PendingDecision]:
        """Send the safe value for every decision past its deadline; returns those."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        fired = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now_ns:
                _, _, pending = heapq.heappop(self._heap)
                if pending.done:
                    continue
                late_ms = (now_ns - pending.deadline_ns) / 1e6
                reason = f"no decision for trigger {pending.trigger!r} within {self.policy.deadline_s:g} s"
                pending.seq = self.journal.append(self.policy.safe_value, FrameType.FAILSAFE, failsafe_reason=reason)
                pending.failsafe = True
                self.sent_failsafes += 1
                log.warning("%s: sent the safe value as seq %d (%.1f ms after the deadline)", reason, pending.seq, late_ms)
                fired.append(pending)
        if fired:
            self._notify()
        return fired

    def next_deadline_ns(self) -> int | None:
        with self._lock:
            while self._heap and self._heap[0][2].done:
                heapq.heappop(self._heap)
            return self._heap[0][0] if self._heap else None

    def _notify(self) -> None:
        if self._on_journal is not None:
            self._on_journal()
