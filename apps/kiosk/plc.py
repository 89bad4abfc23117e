"""The kiosk's output to the PLC: every decision journaled on disk until the PLC acknowledged it.

``open_plc(url)`` (apps.kiosk.plc_links, the module that knows every link kind) picks the link from the URL:

* ``serial:///dev/ttyUSB0?baud=115200``, a tty path (``/dev/ttyUSB0``, a pty), ``socket://HOST:PORT``,
  ``rfc2217://HOST:PORT``, ``loop://``: the edgerun frame link (devices.link.sender), whose peer is
  ``edgerun serial-peer`` or the PLC's implementation of devices/link/frame.py. The peer applies each
  decision once, in order, and acknowledges it; the journal replays what it has not acknowledged after a
  dropped cable, a PLC reboot or a kiosk restart.
* ``modbus:///dev/ttyUSB0?unit=1&register=0&baud=19200``: Modbus RTU (devices.link.modbus). Each
  decision is one write of :data:`REGISTERS` holding registers from ``register`` (function 16, so the
  PLC sees the block at once); a write the PLC answered is acknowledged. Modbus has no sequence
  numbers of its own: a kiosk killed between the write and the journal's ack writes that decision
  again on restart (same part seq, so the PLC can tell).

The message (payload version 1; the frame link carries it as bytes, Modbus as registers)::

    offset size  field
    0      1     version       1
    1      1     verdict       1 pass, 2 reject, 3 review (0 is never sent: a PLC's cleared register)
    2      1     flags         bit 0: fail-safe decision (no model verdict; the reason is in the audit trail)
    3      1     label length  bytes of the UTF-8 class label that follow the fixed part; 0: no class
                               (anomaly mode, or a fail-safe), the score is then the anomaly score
    4      8     part seq      u64 big-endian, the source's part sequence number
    12     4     score         f32 big-endian: the decided class's probability, or the anomaly score
    16     4     confidence    f32 big-endian, 0..1
    20     n     label

Registers (Modbus), from ``register``: version, verdict, flags, part seq high and low words
(seq mod 2^32), class index (1 + position in ``classes``, 0 none), score f32 high and low words,
confidence x 10000.
"""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import parse_qsl, urlencode

from apps.kiosk.types import Decision, Verdict
from devices.link.journal import Journal
from devices.link.transport import SerialURL
from runtime.errors import BadInput
from runtime.units import shown

log = logging.getLogger(__name__)

PAYLOAD_VERSION = 1
FIXED = struct.Struct(">BBBBQff")  # version, verdict, flags, label length, part seq, score, confidence
MAX_LABEL = 255  # bytes of UTF-8
FLAG_FAILSAFE = 0x01
VERDICT_CODES = {Verdict.PASS: 1, Verdict.REJECT: 2, Verdict.REVIEW: 3}
_VERDICTS = {code: verdict for verdict, code in VERDICT_CODES.items()}
REGISTERS = 9  # the Modbus block
STALE_S = 1.0  # a decision unacknowledged this long on an open port: the PLC is not answering (4x the ACK timeout)
_F32_MAX = 3.4028234663852886e38
URL_FORMS = "serial:///dev/ttyX?baud=N, a tty path, socket://HOST:PORT, rfc2217://HOST:PORT, modbus:///dev/ttyX?unit=N"


@dataclass(frozen=True)
class PlcMessage:
    """What the PLC receives for one part (decoded by :func:`decode` or :func:`decode_registers`)."""

    seq: int
    verdict: Verdict
    failsafe: bool
    label: str | None
    score: float
    confidence: float
    version: int = PAYLOAD_VERSION


def _f32(value: float) -> float:
    value = float(value)
    if math.isfinite(value) and abs(value) > _F32_MAX:
        return math.copysign(math.inf, value)  # struct refuses to pack it; a score that large is "very anomalous"
    return value


def encode(decision: Decision) -> bytes:
    """The version-1 payload for ``decision``. A label longer than 255 bytes is cut at a character boundary (logged)."""
    if not isinstance(decision.seq, int) or not 0 <= decision.seq < 1 << 64:
        raise BadInput(f"part seq {decision.seq!r} does not fit the PLC message; valid: an integer 0..2^64-1")
    label = (decision.label or "").encode("utf-8")
    if len(label) > MAX_LABEL:
        cut = label[:MAX_LABEL].decode("utf-8", errors="ignore").encode("utf-8")
        log.warning("class label of %d bytes cut to %d for the PLC message (part %d)", len(label), len(cut), decision.seq)
        label = cut
    flags = FLAG_FAILSAFE if decision.failsafe else 0
    verdict = VERDICT_CODES[Verdict(decision.verdict)]
    return FIXED.pack(PAYLOAD_VERSION, verdict, flags, len(label), decision.seq, _f32(decision.score), _f32(decision.confidence)) + label


def decode(payload: bytes) -> PlcMessage:
    """The PLC side: a payload back to its fields; BadInput naming what is wrong."""
    if len(payload) < FIXED.size:
        raise BadInput(f"PLC message of {len(payload)} bytes is shorter than its {FIXED.size}-byte fixed part")
    version, code, flags, length, seq, score, confidence = FIXED.unpack_from(payload)
    if version != PAYLOAD_VERSION:
        raise BadInput(f"PLC message version {version} is unknown; this edgerun writes version {PAYLOAD_VERSION}")
    if code not in _VERDICTS:
        raise BadInput(f"PLC message verdict code {code} is invalid; valid: {sorted(_VERDICTS)}")
    if len(payload) != FIXED.size + length:
        raise BadInput(f"PLC message of {len(payload)} bytes does not match its label length {length}")
    try:
        label = payload[FIXED.size:].decode("utf-8") or None
    except UnicodeDecodeError as exc:
        raise BadInput(f"PLC message label is not UTF-8: {exc}") from None
    return PlcMessage(seq, _VERDICTS[code], bool(flags & FLAG_FAILSAFE), label, score, confidence, version)


def registers(message: PlcMessage, classes: Sequence[str] = ()) -> list[int]:
    """The Modbus register block for ``message``."""
    index = classes.index(message.label) + 1 if message.label in classes else 0
    hi, lo = struct.unpack(">HH", struct.pack(">f", message.score))
    confidence = message.confidence if math.isfinite(message.confidence) else 0.0
    return [
        message.version, VERDICT_CODES[message.verdict], FLAG_FAILSAFE if message.failsafe else 0,
        (message.seq >> 16) & 0xFFFF, message.seq & 0xFFFF, index, hi, lo, round(min(max(confidence, 0.0), 1.0) * 10000),
    ]  # fmt: skip


def decode_registers(values: Sequence[int], classes: Sequence[str] = ()) -> PlcMessage:
    """The PLC side of :func:`registers` (seq comes back mod 2^32, the confidence to 1e-4)."""
    if len(values) != REGISTERS:
        raise BadInput(f"PLC register block has {len(values)} registers; the message has {REGISTERS}")
    version, code, flags, seq_hi, seq_lo, index, hi, lo, confidence = values
    if version != PAYLOAD_VERSION or code not in _VERDICTS:
        raise BadInput(f"PLC register block version {version}, verdict {code} is invalid; valid: version 1, verdict 1..3")
    if not 0 <= index <= len(classes):
        raise BadInput(f"PLC register class index {index} is outside 0..{len(classes)}")
    (score,) = struct.unpack(">f", struct.pack(">HH", hi, lo))
    label = classes[index - 1] if index else None
    return PlcMessage((seq_hi << 16) | seq_lo, _VERDICTS[code], bool(flags & FLAG_FAILSAFE), label, score, confidence / 10000)


@dataclass(frozen=True)
class PlcState:
    """For the dashboard. ``last_acked_part`` is the part seq of the newest decision the PLC acknowledged
    (None until one was, in this process). ``connected`` is False both when the port is gone and when the port
    is there but the PLC stopped answering (rebooting), which the link itself only sees as missing ACKs."""

    protocol: str  # "frames" or "modbus"
    url: str
    connected: bool  # the link is up and the PLC acknowledges (nothing waited longer than STALE_S)
    backlog: int  # decisions journaled and not yet acknowledged
    waiting_s: float  # how long the oldest unacknowledged decision has waited (0: none)
    last_acked_seq: int  # journal sequence acknowledged up to
    last_acked_part: int | None
    sent: int  # decisions journaled by this process

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def parse_url(url: str) -> tuple[str, str, dict[str, int]]:
    """``(protocol, transport URL, modbus options)``; BadInput naming the URL and the valid forms."""
    if not isinstance(url, str) or not url:
        raise BadInput(f"PLC URL {url!r} is empty; valid: {URL_FORMS}")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("", "socket", "rfc2217", "loop"):
        SerialURL.parse(url)
        return "frames", url, {}
    if scheme == "serial":
        target = url[len("serial://"):]
        SerialURL.parse(target)
        return "frames", target, {}
    if scheme != "modbus":
        raise BadInput(f"PLC URL scheme {scheme!r} in {shown(url)} is not supported; valid: {URL_FORMS}")
    base, _, query = url[len("modbus://"):].partition("?")
    options: dict[str, int] = {}
    rest = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in ("unit", "register"):
            if not (value.isascii() and value.isdigit()) or len(value) > 5:  # "²".isdigit(), but int("²") fails
                raise BadInput(f"{key}={shown(value)} in PLC URL {shown(url)} is invalid; give a small non-negative integer")
            options[key] = int(value)
        else:
            rest.append((key, value))
    if options.get("register", 0) > 0x10000 - REGISTERS:
        raise BadInput(f"register={options['register']} in PLC URL {shown(url)} is invalid; the {REGISTERS}-register block "
                       f"must start at 0..{0x10000 - REGISTERS}")
    target = base + (f"?{urlencode(rest)}" if rest else "")
    SerialURL.parse(target)
    return "modbus", target, options


class PlcOut:
    """``with open_plc(url, journal=path) as plc: plc.send(decision)`` (apps.kiosk.plc_links); thread-safe.

    The base of the link kinds: the journal, the part numbers and the state; a kind writes the link's half."""

    protocol = ""

    def __init__(self, url: str, journal: Journal) -> None:
        self.url = url
        self.journal = journal
        self._lock = threading.Lock()
        # journal seq -> (part seq, time.monotonic() when journaled, or when this process found it)
        self._parts: dict[int, tuple[int, float]] = {}
        self._last_acked_part: int | None = None
        self._sent = 0
        now = time.monotonic()
        for entry in journal.pending(limit=1 << 30):  # a restart: what the last run left unacknowledged
            try:
                self._parts[entry.seq] = (decode(entry.payload).seq, now)
            except BadInput as exc:
                log.warning("journal entry %d is not a kiosk decision: %s", entry.seq, exc)
        if self._parts:
            log.info("%d decisions from the last run wait for the PLC; they go first, in order", len(self._parts))

    def send(self, decision: Decision) -> int:
        """Journal ``decision`` (durable when this returns) for the PLC; returns its journal sequence."""
        payload = encode(decision)
        with self._lock:
            seq = self._submit(payload, decision)
            self._parts[seq] = (decision.seq, time.monotonic())
            self._sent += 1
        return seq

    def state(self) -> PlcState:
        acked = self.journal.first_unacked() - 1
        now = time.monotonic()
        with self._lock:
            done = [s for s in self._parts if s <= acked]
            if done:
                self._last_acked_part = self._parts[max(done)][0]
                for s in done:
                    del self._parts[s]
            waiting = now - min(t for _, t in self._parts.values()) if self._parts else 0.0
            last_part, sent = self._last_acked_part, self._sent
        connected = self._link_up() and waiting < STALE_S
        return PlcState(self.protocol, self.url, connected, self.journal.backlog(), round(waiting, 3), acked, last_part, sent)

    def drain(self, timeout_s: float) -> bool:
        """Wait until the PLC acknowledged everything journaled; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.journal.backlog():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self) -> None:
        self._stop()
        left = self.journal.backlog()
        if left:
            log.info("%d decisions wait in %s for the PLC; they are sent on the next start", left, self.journal.path)
        self.journal.close()

    def __enter__(self) -> "PlcOut":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the link's half
    def _link_up(self) -> bool:
        raise NotImplementedError

    def _submit(self, payload: bytes, decision: Decision) -> int:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError


def default_journal_path() -> Path:
    from runtime.bundle.store import default_root

    return default_root() / "kiosk" / "plc-journal.db"

