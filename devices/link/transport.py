"""Serial transports opened from a URL, owning their pyserial handle.

Accepted URLs:

* a device path with optional settings: ``/dev/ttyUSB0?baud=115200&parity=E&stopbits=1&bytesize=8``
  (also any path to a tty, such as a pty or a udev ``/dev/serial/by-id`` link);
* ``loop://`` (pyserial's in-process loopback), ``socket://HOST:PORT`` (raw TCP, a
  serial server or a test peer) and ``rfc2217://HOST:PORT`` (a Telnet COM-port
  server), handed to ``serial.serial_for_url``; ``?baud=`` and friends apply to
  these too where they mean something.

pyserial is imported when a transport opens, so ``import devices.link`` works
without the ``serial`` extra.
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass
from urllib.parse import parse_qsl

from runtime.errors import BadInput, missing

log = logging.getLogger(__name__)

URL_SCHEMES = ("loop", "socket", "rfc2217")
STANDARD_BAUDS = (1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200, 230400, 460800, 921600, 1000000, 2000000)


class Parity(str, enum.Enum):
    NONE = "N"
    EVEN = "E"
    ODD = "O"


class LinkDown(Exception):
    """The port failed or vanished (cable pulled, USB adapter unplugged, peer gone).

    Internal to the link: the link catches it and reconnects with backoff.
    """


@dataclass(frozen=True)
class SerialURL:
    """A parsed transport URL. ``target`` is what pyserial opens: the path or the scheme URL."""

    target: str
    baudrate: int = 115200
    parity: Parity = Parity.NONE
    stopbits: int = 1
    bytesize: int = 8

    @property
    def is_device(self) -> bool:
        return "://" not in self.target

    @property
    def bits_per_byte(self) -> int:
        """Bits on the wire per byte: start bit + data + parity + stop bits."""
        return 1 + self.bytesize + (0 if self.parity is Parity.NONE else 1) + self.stopbits

    @classmethod
    def parse(cls, url: str) -> "SerialURL":
        if not url or not isinstance(url, str):
            raise BadInput(f"serial URL {url!r} is empty; give a device path or one of {_schemes()}")
        base, _, query = url.partition("?")
        if "://" in base:
            scheme = base.split("://", 1)[0].lower()
            if scheme not in URL_SCHEMES:
                raise BadInput(f"serial URL scheme {scheme!r} in {url!r} is not supported; use a device path or {_schemes()}")
        elif not base.startswith("/"):
            raise BadInput(f"serial device {base!r} must be an absolute path (such as /dev/ttyUSB0) or a URL: {_schemes()}")
        kwargs: dict[str, object] = {}
        for key, value in parse_qsl(query, keep_blank_values=True):
            kwargs.update(_setting(url, key, value))
        return cls(target=base, **kwargs)  # type: ignore[arg-type]


def _schemes() -> str:
    return ", ".join(f"{s}://" for s in URL_SCHEMES)


def _setting(url: str, key: str, value: str) -> dict[str, object]:
    def bad(valid: str) -> BadInput:
        return BadInput(f"{key}={value!r} in serial URL {url!r} is invalid; valid: {valid}")

    if key == "baud":
        if not (value.isascii() and value.isdigit()) or len(value) > 9 or int(value) <= 0:  # int("²") fails
            raise bad(f"a positive integer such as {', '.join(map(str, STANDARD_BAUDS[3:8]))}")
        return {"baudrate": int(value)}
    if key == "parity":
        try:
            return {"parity": Parity(value.upper())}
        except ValueError:
            raise bad("N, E, O") from None
    if key == "stopbits":
        if value not in ("1", "2"):
            raise bad("1, 2")
        return {"stopbits": int(value)}
    if key == "bytesize":
        if value not in ("5", "6", "7", "8"):
            raise bad("5, 6, 7, 8")
        return {"bytesize": int(value)}
    raise BadInput(f"unknown setting {key!r} in serial URL {url!r}; valid settings: baud, parity, stopbits, bytesize")


class SerialTransport:
    """One open serial port. Reads return what arrived within the timeout (maybe b"")."""

    def __init__(self, url: SerialURL | str, *, read_timeout_s: float = 0.05) -> None:
        self.url = url if isinstance(url, SerialURL) else SerialURL.parse(url)
        self.read_timeout_s = read_timeout_s
        self._port = None

    @property
    def is_open(self) -> bool:
        return self._port is not None

    def open(self) -> "SerialTransport":
        """Open the port; LinkDown when it is absent or busy (the caller retries)."""
        try:
            import serial
        except ModuleNotFoundError:
            raise missing("serial", "serial") from None
        if self._port is not None:
            return self
        if self.url.is_device and not os.path.exists(self.url.target):
            raise LinkDown(f"serial device {self.url.target} does not exist (unplugged?)")
        try:
            self._port = serial.serial_for_url(
                self.url.target,
                baudrate=self.url.baudrate,
                parity=self.url.parity.value,
                stopbits=self.url.stopbits,
                bytesize=self.url.bytesize,
                timeout=self.read_timeout_s,
                write_timeout=2.0,
                exclusive=True if self.url.is_device else None,
            )
        except (serial.SerialException, OSError, ValueError) as exc:
            raise LinkDown(f"cannot open {self.url.target}: {exc}") from exc
        log.info("opened %s at %d baud", self.url.target, self.url.baudrate)
        return self

    def read(self, max_bytes: int = 4096) -> bytes:
        port = self._require()
        try:
            data = port.read(1)  # waits up to read_timeout_s for the first byte
            if data and port.in_waiting:
                data += port.read(min(max_bytes - 1, port.in_waiting))
            return data
        except Exception as exc:  # pyserial raises SerialException, OSError, TypeError on a dead fd
            self.close()
            raise LinkDown(f"read from {self.url.target} failed: {exc}") from exc

    def write(self, data: bytes) -> None:
        port = self._require()
        try:
            port.write(data)
        except Exception as exc:  # SerialTimeoutException when the other side stopped reading
            self.close()
            raise LinkDown(f"write to {self.url.target} failed: {exc}") from exc

    def _require(self):
        if self._port is None:
            raise LinkDown(f"{self.url.target} is not open")
        return self._port

    def close(self) -> None:
        port, self._port = self._port, None
        if port is not None:
            try:
                port.close()
            except Exception as exc:  # closing a vanished device may fail; it is gone either way
                log.debug("closing %s: %s", self.url.target, exc)

    def __enter__(self) -> "SerialTransport":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
