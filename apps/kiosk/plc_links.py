"""The two link halves behind :class:`apps.kiosk.plc.PlcOut`: the edgerun frame link and Modbus RTU, and
:func:`open_plc`, which picks one from the PLC URL (this module knows every kind; apps.kiosk.plc, the base,
knows none).

Both take decisions from the same journal in order and drop them from it only once the PLC
acknowledged them (a frame link ACK; a Modbus write the PLC answered).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from apps.kiosk.plc import REGISTERS, PlcOut, decode, default_journal_path, parse_url, registers
from apps.kiosk.types import Decision
from devices.link.frame import FrameType
from devices.link.journal import Durability, Journal
from devices.link.transport import LinkDown
from runtime.errors import BadInput
from runtime.units import shown

log = logging.getLogger(__name__)

BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 2.0
BATCH = 16  # journal entries read per turn of the Modbus writer


class FramedPlc(PlcOut):
    """The edgerun frame link (devices.link.sender.ResultLink) over a tty, a pty or a socket."""

    protocol = "frames"

    def __init__(self, url: str, journal: Journal, target: str, on_command: Callable[[bytes], None] | None = None) -> None:
        from devices.link.sender import LinkConfig, ResultLink

        super().__init__(url, journal)
        # on_command: COMMAND frames from the PLC (apps.kiosk.triggers.CommandTrigger.on_command), each delivered once
        self.link = ResultLink(LinkConfig(target), journal, on_command=on_command).start()

    def _link_up(self) -> bool:
        return self.link.connected

    def _submit(self, payload: bytes, decision: Decision) -> int:
        if decision.failsafe:  # its own frame type, and the journal's fail-safe log keeps the reason
            return self.link.submit(payload, FrameType.FAILSAFE, failsafe_reason=decision.reason or "fail-safe")
        return self.link.submit(payload)

    def _stop(self) -> None:
        self.link.close()


class ModbusPlc(PlcOut):
    """Modbus RTU: one writer thread writes each journaled decision as a register block, oldest first."""

    protocol = "modbus"

    def __init__(self, url: str, journal: Journal, target: str, options: dict[str, int], classes: Sequence[str], timeout_s: float) -> None:
        from devices.link.modbus import ModbusDecisionLink, ModbusMap

        register = options.get("register", 0)
        # size: the simulator's table; a real PLC has its own (the block must fit its holding registers)
        mapping = ModbusMap(device_id=options.get("unit", 1), decision_register=register, size=max(16, register + REGISTERS))
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 60):
            raise BadInput(f"Modbus timeout {timeout_s!r} s is invalid; give seconds in (0, 60]")
        super().__init__(url, journal)
        self.classes = tuple(classes)
        self.undeliverable = 0
        # A trigger input on the same port (apps.kiosk.triggers.ModbusTrigger) reads through ``link`` under ``lock``.
        self.link = ModbusDecisionLink(target, mapping, timeout_s=timeout_s, retries=0)
        self.lock = threading.Lock()
        self._connected = False
        self._outage = False
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"plc modbus {target}", daemon=True)
        self._thread.start()

    def _link_up(self) -> bool:
        return self._connected

    def _submit(self, payload: bytes, decision: Decision) -> int:
        reason = (decision.reason or "fail-safe") if decision.failsafe else None
        seq = self.journal.append(payload, FrameType.FAILSAFE if decision.failsafe else FrameType.RESULT, failsafe_reason=reason)
        self._wake.set()
        return seq

    def _run(self) -> None:
        backoff = BACKOFF_INITIAL_S
        while not self._halt.is_set():
            try:
                if not self._connected:  # "connected": the port is open and no write since failed
                    with self.lock:
                        self.link.open()
                    self._connected = True
                entries = self.journal.pending(limit=BATCH)
                if not entries:
                    self._wake.wait(0.1)
                    self._wake.clear()
                    continue
                for entry in entries:
                    if self._halt.is_set():
                        return
                    self._write(entry.seq, entry.payload)
                backoff = BACKOFF_INITIAL_S
            except LinkDown as exc:
                if not self._outage:  # once per outage, not once per retry
                    log.warning("Modbus PLC link down: %s; decisions wait in the journal", exc)
                self._outage = True
                self._connected = False
                self._close_port()  # reopened on the next turn: a replugged adapter is a new tty
                self._halt.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            except Exception:  # a bug must not end the thread: decisions keep waiting in the journal
                log.exception("Modbus PLC writer error; retrying")
                self._connected = False
                self._close_port()
                self._halt.wait(BACKOFF_MAX_S)

    def _write(self, seq: int, payload: bytes) -> None:
        try:
            block = registers(decode(payload), self.classes)
        except BadInput as exc:  # not a decision this version can write: it would block every later one
            self.undeliverable += 1
            log.error("journal entry %d cannot be written to the PLC (%s); dropped", seq, exc)
        else:
            with self.lock:
                self.link.write_registers(block)  # returns once the PLC answered: applied
            if self._outage:
                log.warning("Modbus PLC answers again; sending the %d decisions that waited", self.journal.backlog())
                self._outage = False
        self.journal.ack(seq)

    def _stop(self) -> None:
        self._halt.set()
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._close_port()

    def _close_port(self) -> None:
        with self.lock:
            self.link.close()


def open_plc(
    url: str,
    *,
    journal: str | Path | None = None,
    durability: Durability | str = Durability.FULL,
    classes: Sequence[str] = (),
    timeout_s: float = 0.3,
    on_command: Callable[[bytes], None] | None = None,
) -> PlcOut:
    """Open the PLC output named by ``url`` (:func:`apps.kiosk.plc.parse_url`); the link (re)connects in the
    background, so a PLC that is off is not an error.

    ``journal``: the SQLite outbox (default ``$EDGERUN_HOME/kiosk/plc-journal.db``); reopening it after a
    restart resends what the PLC has not acknowledged, in order. ``classes``: the model's class names, for
    the Modbus class index. ``timeout_s``: how long a Modbus PLC may take to answer a write. ``on_command``:
    called once per COMMAND frame the PLC sends over the frame link (a trigger). With Modbus, a trigger input
    is read through the output's own ``link`` under its ``lock`` (one port, one owner).
    """
    protocol, target, options = parse_url(url)
    if on_command is not None and protocol != "frames":
        raise BadInput(f"PLC URL {shown(url)} is Modbus, which carries no commands; read its trigger input through "
                       "the output's link and lock (apps.kiosk.triggers.ModbusTrigger)")
    path = Path(journal) if journal is not None else default_journal_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create the PLC journal's folder {str(path.parent)!r}: {exc.strerror or exc}") from exc
    jr = Journal(path, durability)
    try:
        if protocol == "frames":
            return FramedPlc(url, jr, target, on_command)
        return ModbusPlc(url, jr, target, options, tuple(classes), timeout_s)
    except BaseException:
        jr.close()
        raise
