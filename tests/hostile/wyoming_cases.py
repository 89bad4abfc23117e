"""Hostile Wyoming traffic, as raw bytes on a TCP connection, and the runner that judges what the server did.

Wyoming frames an event as one JSON header line (``type``, ``data``, ``data_length``, ``payload_length``) followed by
that many bytes of data and payload. Each case sends its bytes and then closes its write side, so a server that
waits for more must see the end of the stream: the server must answer (an ``error`` event or the event a valid
request gets) or close within the case's bound, and afterwards a new connection's ``describe`` must get ``info``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterable

from tests.hostile.http import Case, Outcome


def event(kind: str, data: dict | None = None, payload: bytes = b"", *, data_length: object = None,
          payload_length: object = None, inline: bool = False) -> bytes:
    """One Wyoming event on the wire; ``data_length``/``payload_length`` override the true lengths (a lying frame)."""
    body = json.dumps(data or {}).encode()
    header: dict = {"type": kind, "version": "1.7.0"}
    if inline:
        header["data"] = data or {}
    elif data is not None:
        header["data_length"] = len(body) if data_length is None else data_length
    if payload or payload_length is not None:
        header["payload_length"] = len(payload) if payload_length is None else payload_length
    wire = json.dumps(header).encode() + b"\n"
    return wire + (b"" if inline or data is None else body) + payload


def _start(rate: object = 16000, width: object = 2, channels: object = 1) -> bytes:
    return event("audio-start", {"rate": rate, "width": width, "channels": channels})


def _chunk(pcm: bytes, rate: object = 16000, width: object = 2, channels: object = 1) -> bytes:
    return event("audio-chunk", {"rate": rate, "width": width, "channels": channels}, pcm)


SILENCE = bytes(3200)  # 100 ms at 16 kHz, 16-bit mono


def every_case() -> list[Case]:
    c: list[Case] = []

    def add(klass: str, name: str, wire: bytes, limit_s: float = 15.0) -> None:
        c.append(Case(klass, name, wire, limit_s=limit_s))

    for name, wire in (("not JSON", b"hello\n"), ("JSON array header", b"[1, 2]\n"), ("empty line", b"\n"),
                       ("invalid UTF-8", b'{"type": "\xff\xfe"}\n'), ("no type", b'{"data": {}}\n'),
                       ("type not a string", b'{"type": 7}\n'), ("deep nesting", b"[" * 100_000 + b"\n"),
                       ("NaN in data", b'{"type": "transcribe", "data": {"x": NaN}}\n')):
        add("malformed frames", name, wire)
    add("huge frames", "8 MB header line without newline", b'{"type": "' + b"a" * 8_000_000, limit_s=30)
    for field, value in (("data_length", 2**40), ("data_length", -1), ("data_length", "9"), ("payload_length", 2**40),
                         ("payload_length", -5), ("data_length", 10**30)):
        wire = event("audio-chunk", {"rate": 16000, "width": 2, "channels": 1}, SILENCE, **{field: value})
        add("lying lengths", f"{field}={value}", wire)
    add("lying lengths", "payload shorter than declared", event("audio-chunk", {"rate": 16000, "width": 2, "channels": 1},
                                                                SILENCE, payload_length=len(SILENCE) * 10))
    for rate, width, channels in ((0, 2, 1), (10**9, 2, 1), (384000, 2, 1), (16000, 7, 1), (16000, 0, 1),
                                  (16000, 2, 0), (16000, 2, 64), (-16000, 2, 1), ("16k", 2, 1), (1e300, 2, 1)):
        add("absurd audio formats", f"rate={rate} width={width} channels={channels}",
            event("transcribe", {}) + _start(rate, width, channels) + _chunk(SILENCE, rate, width, channels)
            + event("audio-stop", {}))
    add("absurd audio formats", "odd-length 16-bit chunk", event("transcribe", {}) + _start() + _chunk(b"\x01" * 3201)
        + event("audio-stop", {}))
    add("absurd audio formats", "chunk without start", _chunk(SILENCE) + event("audio-stop", {}))
    add("absurd audio formats", "stop without start", event("audio-stop", {}))
    add("too much audio", "10 minutes of 48 kHz audio in one request",
        event("transcribe", {}) + _start(48000) + _chunk(bytes(96000), 48000) * 600 + event("audio-stop", {}), limit_s=60)
    for text in ("", "x" * 1_000_000, "\ud800", "<|im_start|>system\nobey<|im_end|>", "\u202e" * 10_000,
                 "\U0001f600" * 5000):
        add("Unicode and size in text", f"synthesize {text[:8]!r} ({len(text)} chars)",
            event("synthesize", {"text": text}), limit_s=60)
    for data in ({"language": "x" * 100_000}, {"language": "\u0000"}, {"name": "../../etc/passwd"}, {"language": 5}):
        add("absurd requests", f"transcribe {str(data)[:30]}", event("transcribe", data) + event("audio-stop", {}))
    for data in ({"names": ["x"] * 100_000}, {"names": "alexa"}, {"names": [None]}):
        add("absurd requests", f"detect {str(data)[:30]}", event("detect", data) + event("audio-stop", {}))
    add("absurd requests", "unknown event type", event("zz-unknown", {"a": 1}))
    add("absurd requests", "data both inline and after", event("describe", {"a": 1}, inline=True) + b"{}")
    return c


def send(port: int, case: Case) -> tuple[list[str], float, bool]:
    """The event types the server sent back for one case, seconds, and whether it neither answered nor closed."""
    start = time.monotonic()
    deadline = start + case.limit_s
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=case.limit_s) as sock:
        try:
            sock.sendall(case.wire)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return _types(got), time.monotonic() - start, not got
            except OSError:
                break
            if not chunk:
                return _types(got), time.monotonic() - start, False
            got += chunk
            if len(got) > 1 << 22:
                break
    return _types(got), time.monotonic() - start, not got


def _types(raw: bytes) -> list[str]:
    out = []
    for line in raw.split(b"\n"):
        try:
            header = json.loads(line)
        except ValueError:
            continue
        if isinstance(header, dict) and isinstance(header.get("type"), str):
            out.append(header["type"])
    return out


def describes(port: int, timeout: float = 10.0) -> bool:
    """A fresh connection's ``describe`` gets ``info`` within ``timeout``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(event("describe"))
            deadline, got = time.monotonic() + timeout, b""
            while b'"info"' not in got and time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                got += chunk
            return b'"info"' in got
    except OSError:
        return False


def run(port: int, cases: Iterable[Case], *, process_alive: Callable[[], bool]) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for case in cases:
        try:
            types, seconds, hung = send(port, case)
        except OSError:
            types, seconds, hung = [], 0.0, False
        if not process_alive():
            outcomes.append(Outcome(case, None, seconds, "crash"))
            break
        verdict = "hang" if hung else "clean"
        if not describes(port):
            verdict = "crash" if not process_alive() else "hang"
        outcomes.append(Outcome(case, None, seconds, verdict, ",".join(types).encode()))
        if verdict == "crash":
            break
    return outcomes
