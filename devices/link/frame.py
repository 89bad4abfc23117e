"""The edgerun link frame: every constant of the wire format, the encoder and a streaming decoder.

Wire format, version 1 (multi-byte integers big-endian except the CRC)::

    offset  size  field
    0       1     START    0xA5
    1       1     VERSION  0x01
    2       4     SEQ      u32 big-endian; per-direction sequence number
    6       1     TYPE     FrameType below
    7       2     LENGTH   u16 big-endian; payload bytes, 0..MAX_PAYLOAD (1024)
    9       LEN   PAYLOAD
    9+LEN   2     CRC      CRC-16/MODBUS (poly 0x8005 reflected, init 0xFFFF) over bytes
                           0 .. 8+LEN, sent low byte first exactly as in Modbus RTU, so any
                           PLC with a Modbus library already has the checksum routine.

Frame types and their payloads:

* ``HELLO`` (sender -> peer, SEQ 0): 16-byte stream id, then u32 ``base``: the lowest
  sequence number the sender still holds unacknowledged (everything below it was
  acknowledged). The peer adopts ``base - 1`` as applied if it knows less (a PLC that
  lost its memory on reboot), then answers.
* ``HELLO`` (peer -> sender, SEQ 0, empty payload): "who are you?" from a peer that lost
  its session (restarted without state) and got a RESULT it cannot place, or that just
  started and wants to send commands; the sender answers with its own HELLO and starts a
  new command session (the peer's command counter may be back at 1).
* ``HELLO_ACK`` (peer -> sender, SEQ = the peer's last applied sequence of that stream):
  the 16-byte stream id echoed. The sender drops journal entries up to SEQ.
* ``RESULT`` (sender -> peer): an application result, opaque bytes (the kiosk decision).
* ``FAILSAFE`` (sender -> peer): the configured safe value, sent because no decision came
  within the deadline. Sequenced, journaled and acknowledged exactly like ``RESULT``.
* ``ACK`` (peer -> sender, SEQ = n, empty payload): cumulative, every sequence up to
  and including n has been applied once. Also the answer to a duplicate. An ACK or NACK
  above the highest sequence the sender sent is a protocol error: ignored, then a new
  handshake.
* ``NACK`` (peer -> sender, SEQ = n): the peer saw a gap; it applied up to n and wants
  n + 1 next. The sender goes back to n + 1 without waiting for its timeout.
* ``COMMAND`` (peer -> sender): a command for edgerun (for example a trigger), opaque
  bytes, in the peer's own sequence space; answered by ``COMMAND_ACK`` with the same SEQ.
  Each new command takes a higher SEQ than the last; a resend repeats its SEQ and is
  acknowledged without running again. A peer whose counter restarts says HELLO first
  and sends commands only after the sender's HELLO.

Sequences start at 1. A receiver applies SEQ n only when it has applied n - 1
(go-back-N), so "applied up to n" is one number and duplicates are detected by
comparison alone. The decoder never raises on bad input: line noise, bad CRCs,
unknown versions or types and oversized lengths are counted in
:class:`DecoderStats` and skipped, and decoding resumes at the next start byte.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

from runtime.errors import BadInput

START = 0xA5
VERSION = 1
MAX_PAYLOAD = 1024
MAX_SEQ = 0xFFFFFFFF
HEADER = struct.Struct(">BBIBH")  # start, version, seq, type, length
HEADER_SIZE = HEADER.size  # 9
CRC_SIZE = 2
OVERHEAD = HEADER_SIZE + CRC_SIZE  # 11 bytes around every payload
STREAM_ID_SIZE = 16
HELLO = struct.Struct(">16sI")  # stream id, base


class FrameType(enum.IntEnum):
    HELLO = 0x01
    HELLO_ACK = 0x02
    RESULT = 0x03
    FAILSAFE = 0x04
    ACK = 0x05
    NACK = 0x06
    COMMAND = 0x07
    COMMAND_ACK = 0x08


_VALID_TYPES = frozenset(int(t) for t in FrameType)


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC_TABLE = _crc_table()


def crc16(data: bytes | bytearray | memoryview, crc: int = 0xFFFF) -> int:
    """CRC-16/MODBUS; ``crc16(b"123456789") == 0x4B37`` (the catalogue check value)."""
    table = _CRC_TABLE
    for byte in data:
        crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
    return crc


@dataclass(frozen=True)
class Frame:
    seq: int
    type: FrameType
    payload: bytes = b""

    def __post_init__(self) -> None:
        if not 0 <= self.seq <= MAX_SEQ:
            raise BadInput(f"frame sequence {self.seq} is outside 0..{MAX_SEQ}")
        if not isinstance(self.type, FrameType):
            raise BadInput(f"frame type {self.type!r} is not one of {[t.name for t in FrameType]}")
        if len(self.payload) > MAX_PAYLOAD:
            raise BadInput(f"payload of {len(self.payload)} bytes exceeds the maximum of {MAX_PAYLOAD}")

    def encode(self) -> bytes:
        head = HEADER.pack(START, VERSION, self.seq, int(self.type), len(self.payload))
        body = head + bytes(self.payload)
        return body + crc16(body).to_bytes(2, "little")


def hello_payload(stream_id: bytes, base: int) -> bytes:
    if len(stream_id) != STREAM_ID_SIZE:
        raise BadInput(f"stream id must be {STREAM_ID_SIZE} bytes, got {len(stream_id)}")
    return HELLO.pack(stream_id, base)


def parse_hello(payload: bytes) -> tuple[bytes, int]:
    """(stream id, base) from a HELLO payload; BadInput when the size is wrong."""
    if len(payload) != HELLO.size:
        raise BadInput(f"HELLO payload must be {HELLO.size} bytes, got {len(payload)}")
    stream_id, base = HELLO.unpack(payload)
    return stream_id, base


@dataclass
class DecoderStats:
    """What the decoder skipped, by reason. Bytes, not frames, for noise."""

    frames: int = 0
    noise_bytes: int = 0  # bytes before a start byte, and start bytes that led nowhere
    bad_version: int = 0
    bad_type: int = 0
    bad_length: int = 0
    bad_crc: int = 0
    stale_partial: int = 0  # a partial frame dropped because the line went quiet

    @property
    def rejected(self) -> int:
        return self.bad_version + self.bad_type + self.bad_length + self.bad_crc + self.stale_partial

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"rejected": self.rejected}


@dataclass
class FrameDecoder:
    """Feed it bytes as they arrive; it returns whole, checked frames."""

    stats: DecoderStats = field(default_factory=DecoderStats)
    _buf: bytearray = field(default_factory=bytearray)
    _last_rx: float | None = None  # monotonic seconds of the last non-empty receive()

    def receive(self, data: bytes, now: float, quiet_s: float) -> list[Frame]:
        """:meth:`feed` for a reader loop: also expires a partial frame once the line
        has been quiet for ``quiet_s`` seconds (``now`` is ``time.monotonic()``)."""
        if self._last_rx is None:
            self._last_rx = now
        if data:
            self._last_rx = now
            return self.feed(data)
        if self._buf and now - self._last_rx > quiet_s:
            return self.expire_partial()
        return []

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        out: list[Frame] = []
        while True:
            start = self._buf.find(START)
            if start < 0:
                self.stats.noise_bytes += len(self._buf)
                self._buf.clear()
                return out
            if start:
                self.stats.noise_bytes += start
                del self._buf[:start]
            if len(self._buf) < HEADER_SIZE:
                return out
            _, version, seq, ftype, length = HEADER.unpack_from(self._buf)
            reject = None
            if version != VERSION:
                reject = "bad_version"
            elif ftype not in _VALID_TYPES:
                reject = "bad_type"
            elif length > MAX_PAYLOAD:
                reject = "bad_length"
            if reject is None:
                total = HEADER_SIZE + length + CRC_SIZE
                if len(self._buf) < total:
                    return out
                got = int.from_bytes(self._buf[total - CRC_SIZE : total], "little")
                if crc16(memoryview(self._buf)[: total - CRC_SIZE]) == got:
                    payload = bytes(self._buf[HEADER_SIZE : HEADER_SIZE + length])
                    del self._buf[:total]
                    self.stats.frames += 1
                    out.append(Frame(seq=seq, type=FrameType(ftype), payload=payload))
                    continue
                reject = "bad_crc"
            # Not a frame: skip this start byte only. A real frame may begin inside
            # what we took for a header or payload (noise that contained 0xA5).
            setattr(self.stats, reject, getattr(self.stats, reject) + 1)
            del self._buf[:1]

    def expire_partial(self) -> list[Frame]:
        """The line went quiet with a partial frame buffered: it was noise or a cut frame.

        Drop its start byte and rescan the rest, returning any whole frame found
        inside it, so a bogus length field cannot hold the decoder waiting for
        bytes that will never come. Whatever partial remains is dropped the same way.
        """
        out: list[Frame] = []
        while self._buf:
            self.stats.stale_partial += 1
            del self._buf[:1]
            out += self.feed(b"")
        return out
