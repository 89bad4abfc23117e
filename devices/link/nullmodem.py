"""A null-modem cable in software: two real ttys (or a tty and a TCP port) wired together.

Like ``socat pty,link=/tmp/a,raw pty,link=/tmp/b,raw``, but it can also behave
like a bad factory cable: pace bytes at a baud rate (a pty otherwise moves data
as fast as memory), add line noise, flip bits, drop chunks, and be pulled out and
plugged back in. Each end is a pseudo-terminal reached through a stable symlink
(as udev's ``/dev/serial/by-id`` names are), so a client that reconnects by path
finds the new tty after a pull; or a TCP listener on loopback for ``socket://``.

Used by the tests and ``bench/serial.py``; it is real I/O on real ttys, the
only thing simulated is the cable.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import select
import socket
import threading
import time
import tty
from dataclasses import dataclass

from runtime.errors import BadInput

log = logging.getLogger(__name__)

_CHUNK = 4096


@dataclass(frozen=True)
class LineFaults:
    """Per chunk of bytes crossing the cable (a chunk is one read, typically one or a few frames)."""

    noise_rate: float = 0.0  # probability of 1..16 random bytes inserted before the chunk
    corrupt_rate: float = 0.0  # probability of one flipped bit in the chunk
    drop_rate: float = 0.0  # probability the chunk is lost
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("noise_rate", "corrupt_rate", "drop_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise BadInput(f"{name}={value!r} is invalid; give a probability between 0 and 1")


@dataclass
class CableStats:
    bytes_a_to_b: int = 0
    bytes_b_to_a: int = 0
    noise_bytes: int = 0
    corrupted_chunks: int = 0
    dropped_chunks: int = 0
    overrun_bytes: int = 0  # the receiving tty's buffer was full, as on a real UART
    pulls: int = 0


class PtyEnd:
    """One end as a pty; clients open ``path`` (a symlink to the current slave)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.master: int | None = None
        self._slave: int | None = None
        self.plug()

    def plug(self) -> None:
        master, slave = os.openpty()
        tty.setraw(slave)  # no echo, no line editing: bytes pass unchanged until pyserial configures it
        os.set_blocking(master, False)
        tmp = f"{self.path}.new"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(os.ttyname(slave), tmp)
        os.replace(tmp, self.path)
        # Keeping our slave fd open means a client closing its side does not make the
        # master read fail with EIO; the line just goes quiet, like an idle cable.
        self.master, self._slave = master, slave

    def unplug(self) -> None:
        for fd in (self.master, self._slave):
            if fd is not None:
                os.close(fd)
        self.master = self._slave = None
        if os.path.lexists(self.path):
            os.unlink(self.path)

    def fds(self) -> list[int]:
        return [self.master] if self.master is not None else []

    def read(self, fd: int) -> bytes:
        return os.read(fd, _CHUNK)

    def write(self, data: bytes) -> int:
        if self.master is None:
            return 0
        try:
            return os.write(self.master, data)
        except BlockingIOError:
            return 0

    @property
    def url(self) -> str:
        return self.path


class TcpEnd:
    """One end as a TCP listener on loopback; clients use ``socket://127.0.0.1:PORT``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self.listener: socket.socket | None = None
        self.conn: socket.socket | None = None
        self.port = 0
        self.plug()

    def plug(self) -> None:
        self.listener = socket.create_server((self._host, self.port))  # same port after a pull
        self.port = self.listener.getsockname()[1]

    def unplug(self) -> None:
        for sock in (self.conn, self.listener):
            if sock is not None:
                sock.close()
        self.conn = self.listener = None

    def fds(self) -> list[int]:
        return [s.fileno() for s in (self.listener, self.conn) if s is not None]

    def read(self, fd: int) -> bytes:
        if self.listener is not None and fd == self.listener.fileno():
            conn, _ = self.listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.conn is not None:
                self.conn.close()
            self.conn = conn
            return b""
        data = self.conn.recv(_CHUNK) if self.conn is not None else b""
        if not data and self.conn is not None:
            self.conn.close()
            self.conn = None
        return data

    def write(self, data: bytes) -> int:
        if self.conn is None:
            return 0
        try:
            self.conn.sendall(data)
            return len(data)
        except OSError:
            return 0

    @property
    def url(self) -> str:
        return f"socket://{self._host}:{self.port}"


class NullModem:
    """Wire end ``a`` to end ``b``. ``baud`` None: unpaced (as fast as the ttys go)."""

    def __init__(self, a, b, *, baud: int | None = None, bits_per_byte: int = 10, faults: LineFaults = LineFaults()) -> None:
        if baud is not None and baud <= 0:
            raise BadInput(f"baud {baud!r} is invalid; give a positive integer or None for unpaced")
        self.a, self.b = a, b
        self.baud, self.bits_per_byte, self.faults = baud, bits_per_byte, faults
        self.stats = CableStats()
        self._rng = random.Random(faults.seed)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._pump, args=(a, b, "bytes_a_to_b"), daemon=True, name="nullmodem a->b"),
            threading.Thread(target=self._pump, args=(b, a, "bytes_b_to_a"), daemon=True, name="nullmodem b->a"),
        ]

    def start(self) -> "NullModem":
        for thread in self._threads:
            thread.start()
        return self

    def pull(self, end, down_s: float) -> None:
        """Pull ``end``'s plug, wait ``down_s`` seconds, plug it back in (a new tty behind the same path)."""
        with self._lock:
            end.unplug()
            self.stats.pulls += 1
        time.sleep(down_s)
        with self._lock:
            end.plug()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2.0)
        with self._lock:
            self.a.unplug()
            self.b.unplug()

    def __enter__(self) -> "NullModem":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pump(self, src, dst, counter: str) -> None:
        line_free_at = 0.0
        while not self._stop.is_set():
            with self._lock:
                fds = src.fds()
            if not fds:
                time.sleep(0.005)
                continue
            try:
                ready, _, _ = select.select(fds, [], [], 0.02)
            except (OSError, ValueError):  # an fd closed by a pull between fds() and select()
                continue
            for fd in ready:
                with self._lock:
                    if fd not in src.fds():
                        continue
                    try:
                        data = src.read(fd)
                    except OSError as exc:
                        if exc.errno not in (errno.EIO, errno.EAGAIN, errno.EBADF, errno.ECONNRESET):
                            raise
                        continue
                if not data:
                    continue
                setattr(self.stats, counter, getattr(self.stats, counter) + len(data))
                data = self._damage(data)
                if self.baud:  # the line carries bits_per_byte bits per byte at baud bits/s
                    now = time.monotonic()
                    start = max(now, line_free_at)
                    line_free_at = start + len(data) * self.bits_per_byte / self.baud
                    if line_free_at > now:
                        time.sleep(line_free_at - now)
                with self._lock:
                    written = dst.write(data) if data else 0
                self.stats.overrun_bytes += len(data) - written

    def _damage(self, data: bytes) -> bytes:
        f, rng = self.faults, self._rng
        if f.drop_rate and rng.random() < f.drop_rate:
            self.stats.dropped_chunks += 1
            return b""
        if f.corrupt_rate and rng.random() < f.corrupt_rate:
            buf = bytearray(data)
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
            data = bytes(buf)
            self.stats.corrupted_chunks += 1
        if f.noise_rate and rng.random() < f.noise_rate:
            noise = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
            self.stats.noise_bytes += len(noise)
            data = noise + data
        return data
