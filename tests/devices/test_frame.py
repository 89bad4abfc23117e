"""The wire format: CRC parity with Modbus, encoding, and a decoder fed hostile bytes."""

from __future__ import annotations

import pytest
from pymodbus.framer.rtu import FramerRTU

from devices.link.frame import (
    CRC_SIZE,
    HEADER,
    MAX_PAYLOAD,
    START,
    Frame,
    FrameDecoder,
    FrameType,
    crc16,
    hello_payload,
    parse_hello,
)
from runtime.errors import BadInput


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"123456789", 0x4B37),  # the CRC catalogue's check value for CRC-16/MODBUS
        (b"", 0xFFFF),  # empty input leaves the init value: catches a wrong init
        (bytes([0x01, 0x03, 0x00, 0x00, 0x00, 0x0A]), 0xCDC5),  # a Modbus RTU read request, as PLC manuals print it (C5 CD on the wire)
        (b"\x00" * 64, crc16(b"\x00" * 32, crc16(b"\x00" * 32))),  # chaining: the decoder relies on crc(a+b) == crc(b, crc(a))
    ],
)
def test_crc16_known_values(data, expected):
    assert crc16(data) == expected


@pytest.mark.parametrize("data", [b"123456789", bytes(range(256)), b"\xa5\x01" * 100, b"\xff"])
def test_crc16_matches_pymodbus_reference(data):
    # pymodbus's RTU framer is the reference implementation PLC code is tested against;
    # it returns the CRC with its bytes swapped (wire order read big-endian).
    assert crc16(data).to_bytes(2, "little") == FramerRTU.compute_CRC(data).to_bytes(2, "big")


def test_encoding_is_the_documented_layout():
    wire = Frame(0x01020304, FrameType.RESULT, b"ok").encode()
    assert wire[:9] == bytes([START, 1, 1, 2, 3, 4, FrameType.RESULT, 0, 2])  # big-endian seq and length
    assert wire[9:11] == b"ok"
    assert wire[11:] == crc16(wire[:11]).to_bytes(2, "little")  # CRC low byte first, as Modbus
    assert len(wire) == HEADER.size + 2 + CRC_SIZE


GOOD = Frame(7, FrameType.RESULT, b"accept").encode()
ACK = Frame(7, FrameType.ACK).encode()


def _flip(data: bytes, index: int) -> bytes:
    buf = bytearray(data)
    buf[index] ^= 0x01
    return bytes(buf)


@pytest.mark.parametrize(
    "stream, frames, stat",
    [
        (GOOD, [7], None),  # the plain case
        (b"\x00\x13garbage" + GOOD, [7], "noise_bytes"),  # line noise before a frame is skipped and counted
        (GOOD + b"\xff\xfe" + ACK, [7, 7], "noise_bytes"),  # noise between frames does not cost the second frame
        (b"\xa5\xa5\xa5" + GOOD, [7], "bad_version"),  # noise made of start bytes: each is tried and rejected
        (_flip(GOOD, 10) + ACK, [7], "bad_crc"),  # a flipped payload bit fails the CRC; the next frame survives
        (_flip(GOOD, 1) + ACK, [7], "bad_version"),  # unknown protocol version is rejected before the length is trusted
        (GOOD[:6] + b"\x7f" + GOOD[7:] + ACK, [7], "bad_type"),  # unknown frame type
        (bytes([START, 1, 0, 0, 0, 1, 3, 0xFF, 0xFF]) + ACK, [7], "bad_length"),  # a length over MAX_PAYLOAD is not waited for
        (_flip(GOOD, len(GOOD) - 1), [], "bad_crc"),  # a bad CRC byte itself
    ],
)
def test_decoder_skips_hostile_bytes(stream, frames, stat):
    decoder = FrameDecoder()
    got = decoder.feed(stream)
    assert [f.seq for f in got] == frames
    if stat:
        assert getattr(decoder.stats, stat) > 0
    assert decoder.stats.frames == len(frames)


def test_decoder_byte_at_a_time_equals_all_at_once():
    # Serial reads return arbitrary slices; a frame split anywhere must still decode.
    stream = b"\x01" + GOOD + b"\xa5" + ACK + Frame(8, FrameType.FAILSAFE, b"\xa5" * 40).encode()
    decoder = FrameDecoder()
    got = [f for byte in stream for f in decoder.feed(bytes([byte]))]
    assert [(f.seq, f.type) for f in got] == [(7, FrameType.RESULT), (7, FrameType.ACK), (8, FrameType.FAILSAFE)]


def test_quiet_line_expires_a_bogus_header_and_recovers_the_frame_inside():
    # A noise header claiming 1000 payload bytes swallows a real frame; when the line
    # goes quiet the decoder must give up on the header and find the frame in what it held.
    bogus = bytes([START, 1, 0, 0, 0, 9, FrameType.RESULT, 0x03, 0xE8])
    decoder = FrameDecoder()
    assert decoder.feed(bogus + GOOD) == []
    assert [f.seq for f in decoder.expire_partial()] == [7]
    assert decoder.pending_bytes == 0
    assert decoder.stats.stale_partial >= 1


def test_receive_expires_a_partial_frame_only_after_the_line_is_quiet():
    # The reader loops' contract: silence shorter than quiet_s keeps a partial frame
    # (the rest may still be on the wire); longer silence drops it and rescans.
    bogus = bytes([START, 1, 0, 0, 0, 9, FrameType.RESULT, 0x03, 0xE8])
    decoder = FrameDecoder()
    assert decoder.receive(bogus + GOOD, now=10.0, quiet_s=0.1) == []
    assert decoder.receive(b"", now=10.05, quiet_s=0.1) == []  # still within the quiet window
    assert decoder.pending_bytes > 0
    assert [f.seq for f in decoder.receive(b"", now=10.2, quiet_s=0.1)] == [7]
    assert decoder.pending_bytes == 0


def test_max_payload_round_trips():
    payload = bytes(range(256)) * (MAX_PAYLOAD // 256)
    (frame,) = FrameDecoder().feed(Frame(1, FrameType.RESULT, payload).encode())
    assert frame.payload == payload


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"seq": -1, "type": FrameType.ACK}, "sequence -1"),  # negative sequence
        ({"seq": 2**32, "type": FrameType.ACK}, "sequence 4294967296"),  # does not fit u32
        ({"seq": 1, "type": 3}, "frame type 3"),  # plain int instead of FrameType: typed, not loose
        ({"seq": 1, "type": FrameType.RESULT, "payload": b"x" * (MAX_PAYLOAD + 1)}, "exceeds the maximum"),  # too long to encode
    ],
)
def test_frame_rejects_bad_fields(kwargs, message):
    with pytest.raises(BadInput, match=message):
        Frame(**kwargs)


def test_hello_payload_round_trip_and_size_check():
    stream = bytes(range(16))
    assert parse_hello(hello_payload(stream, 42)) == (stream, 42)
    with pytest.raises(BadInput, match="16 bytes"):
        hello_payload(b"short", 1)
    with pytest.raises(BadInput, match="HELLO payload"):
        parse_hello(b"\x00" * 5)
