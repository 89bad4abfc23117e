"""PLC trigger inputs for :class:`apps.kiosk.sources.TriggerSource`: ``wait(timeout_s) -> bool`` is True once per part.

* :class:`ModbusTrigger` polls a discrete input through ``devices.link.modbus.ModbusDecisionLink.read_trigger``
  and fires on each rising edge (the PLC raises the input when a part is at the station and drops it after).
* :class:`CommandTrigger` counts ``COMMAND`` frames carrying :data:`TRIGGER_COMMAND` that the PLC sends over the
  edgerun frame link: pass its :meth:`~CommandTrigger.on_command` as ``ResultLink(..., on_command=...)``; the
  link acknowledges each command and delivers it once, so each is one part.

Both share the PLC's port with the decision output, so they take the link object the output already owns
(and, for Modbus, the lock that serialises requests on it) rather than opening the port a second time.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from devices.link.transport import LinkDown
from runtime.errors import BadInput

log = logging.getLogger(__name__)

TRIGGER_COMMAND = b"TRIGGER"
MAX_PENDING = 4096  # triggers received but not yet taken; beyond this they are counted as overflow


class ModbusTrigger:
    """Rising edges of the PLC's trigger input, polled every ``poll_s``. A read that fails (LinkDown) is
    counted and retried at the next poll; ``health()`` reports it."""

    def __init__(self, link, *, poll_s: float = 0.01, lock: threading.Lock | None = None) -> None:
        if not callable(getattr(link, "read_trigger", None)):
            raise BadInput(f"{link!r} has no read_trigger(); valid: a devices.link.modbus.ModbusDecisionLink")
        if not 0.001 <= poll_s <= 5:
            raise BadInput(f"trigger poll_s {poll_s!r} is outside 0.001..5 seconds")
        self.link, self.poll_s = link, poll_s
        self._lock = lock or contextlib.nullcontext()
        self._level = False
        self.fired = 0
        self.read_errors = 0
        self.last_error: str | None = None

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with self._lock:
                    level = bool(self.link.read_trigger())
            except LinkDown as exc:
                self.read_errors += 1
                self.last_error = str(exc)
                log.warning("trigger read failed: %s", exc)
                level = self._level  # unknown: neither an edge nor a release
            edge = level and not self._level
            self._level = level
            if edge:
                self.fired += 1
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.poll_s, left))

    def health(self) -> dict[str, object]:
        return {"kind": "modbus", "fired": self.fired, "read_errors": self.read_errors, "last_error": self.last_error}


class CommandTrigger:
    """Triggers arriving as link commands (or :meth:`fire` for a software trigger); each is taken once."""

    def __init__(self, command: bytes = TRIGGER_COMMAND) -> None:
        self.command = bytes(command)
        self._cond = threading.Condition()
        self._pending = 0
        self.fired = 0
        self.overflow = 0
        self.ignored = 0

    def on_command(self, payload: bytes) -> None:
        """The link's on_command callback: a trigger when ``payload`` is this trigger's command."""
        if bytes(payload) != self.command:
            self.ignored += 1
            log.info("link command %r is not a trigger; ignored", bytes(payload)[:32])
            return
        self.fire()

    def fire(self) -> None:
        with self._cond:
            if self._pending >= MAX_PENDING:
                self.overflow += 1
                log.error("trigger backlog full (%d); trigger counted as overflow", MAX_PENDING)
                return
            self._pending += 1
            self.fired += 1
            self._cond.notify()

    def wait(self, timeout_s: float) -> bool:
        with self._cond:
            if self._cond.wait_for(lambda: self._pending > 0, timeout_s):
                self._pending -= 1
                return True
            return False

    def health(self) -> dict[str, object]:
        return {"kind": "command", "fired": self.fired, "pending": self._pending, "overflow": self.overflow,
                "ignored": self.ignored}
