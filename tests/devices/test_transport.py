"""Transport URLs and real tty I/O (a pty pair opened by path through pyserial)."""

from __future__ import annotations

import os
import tty

import pytest

from devices.link.transport import LinkDown, Parity, SerialTransport, SerialURL
from runtime.errors import BadInput


@pytest.mark.parametrize(
    "url, target, baud, parity, stopbits",
    [
        ("/dev/ttyUSB0", "/dev/ttyUSB0", 115200, Parity.NONE, 1),  # a bare path gets the default 115200 8N1
        ("/dev/ttyUSB0?baud=9600", "/dev/ttyUSB0", 9600, Parity.NONE, 1),  # the documented form
        ("/dev/ttyAMA0?baud=19200&parity=e&stopbits=2", "/dev/ttyAMA0", 19200, Parity.EVEN, 2),  # Modbus PLCs often use 8E1/8N2
        ("loop://", "loop://", 115200, Parity.NONE, 1),  # pyserial URL handlers pass through unchanged
        ("socket://127.0.0.1:5000?baud=57600", "socket://127.0.0.1:5000", 57600, Parity.NONE, 1),  # settings also on URLs
        ("rfc2217://10.0.0.5:4001", "rfc2217://10.0.0.5:4001", 115200, Parity.NONE, 1),  # serial-over-telnet servers
    ],
)
def test_url_parsing(url, target, baud, parity, stopbits):
    parsed = SerialURL.parse(url)
    assert (parsed.target, parsed.baudrate, parsed.parity, parsed.stopbits) == (target, baud, parity, stopbits)


@pytest.mark.parametrize(
    "url, message",
    [
        ("", "empty"),  # nothing given
        ("ttyUSB0", "absolute path"),  # relative device names are ambiguous
        ("http://example/", "scheme 'http'.*loop://, socket://, rfc2217://"),  # unknown scheme lists the valid ones
        ("/dev/ttyUSB0?baud=fast", "baud='fast'"),  # non-numeric baud names the bad value
        ("/dev/ttyUSB0?baud=0", "baud='0'"),  # zero baud
        ("/dev/ttyUSB0?parity=X", "valid: N, E, O"),  # bad parity lists choices
        ("/dev/ttyUSB0?speed=9600", "unknown setting 'speed'.*baud, parity"),  # a misspelt key is not silently ignored
    ],
)
def test_bad_urls_name_the_problem(url, message):
    with pytest.raises(BadInput, match=message):
        SerialURL.parse(url)


def test_bits_per_byte_counts_start_parity_and_stop_bits():
    assert SerialURL.parse("/dev/x").bits_per_byte == 10  # 8N1
    assert SerialURL.parse("/dev/x?parity=E&stopbits=2").bits_per_byte == 12  # 8E2


def test_loop_url_round_trip():
    with SerialTransport("loop://") as port:
        port.write(b"\xa5hello")
        assert port.read() == b"\xa5hello"


def test_pty_opened_by_path_carries_bytes_both_ways():
    master, slave = os.openpty()
    tty.setraw(slave)
    try:
        with SerialTransport(os.ttyname(slave) + "?baud=115200") as port:
            os.write(master, b"from plc")
            assert port.read() == b"from plc"
            port.write(b"to plc")
            assert os.read(master, 100) == b"to plc"
    finally:
        os.close(master)
        os.close(slave)


def test_missing_device_is_link_down_not_a_crash(tmp_path):
    with pytest.raises(LinkDown, match="does not exist"):
        SerialTransport(str(tmp_path / "ttyUSB9")).open()


def test_closed_pty_turns_into_link_down():
    master, slave = os.openpty()
    tty.setraw(slave)
    port = SerialTransport(os.ttyname(slave)).open()
    os.close(master)  # the cable is gone
    os.close(slave)
    with pytest.raises(LinkDown):
        for _ in range(10):  # the first read may return b"" before the hang-up is seen
            port.read()
    assert not port.is_open
