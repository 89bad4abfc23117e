"""Hostile HTTP requests, sent byte for byte to a real server on loopback, and the table of what it did.

A case is the exact bytes a client puts on the wire (so malformed framing, lying lengths and bytes that no HTTP
library would send are all expressible) and the statuses that count as a clean answer. After every case the server's
``/healthz`` must answer: a case after which it does not is a crash (the process died) or a hang (it lives but is
stuck). The runner never follows redirects, never retries and bounds every read.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# statuses a hostile request may get: refusals with a reason, and success where the input was odd but valid
CLEAN = frozenset({200, 400, 401, 403, 404, 405, 408, 409, 413, 414, 415, 422, 429, 431, 503, 504})


@dataclass(frozen=True)
class Case:
    """One hostile request. ``wire`` is sent as it is; ``then_close`` hangs up right after sending (a truncated
    body); ``ok`` are the statuses that count as clean; ``closed_ok``: the server may also close without answering
    (malformed framing, where HTTP offers no status to send)."""

    klass: str
    name: str
    wire: bytes
    ok: frozenset[int] = CLEAN
    limit_s: float = 30.0  # past the targets' 20 s request deadline, after which a server owes a 504
    then_close: bool = False
    closed_ok: bool = False


@dataclass
class Outcome:
    case: Case
    status: int | None  # None: no status line came back
    seconds: float
    verdict: str  # clean, error (a 5xx other than 503/504, or an unexpected status), hang, crash, closed
    body: bytes = b""


def request(method: str, path: str, body: bytes | str | None = None, *, host: str = "127.0.0.1",
            content_type: str | None = "application/json", headers: Iterable[tuple[str, str]] = (),
            length: int | None = None) -> bytes:
    """The wire bytes of one HTTP/1.1 request; ``length`` overrides Content-Length (a lying length)."""
    data = body.encode() if isinstance(body, str) else (body or b"")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    if body is not None or length is not None:
        lines.append(f"Content-Length: {len(data) if length is None else length}")
    head = "\r\n".join(lines).encode()
    for k, v in headers:
        head += f"\r\n{k}: ".encode() + (v.encode("utf-8", "surrogateescape") if isinstance(v, str) else v)
    return head + b"\r\n\r\n" + data


def json_post(path: str, obj: object, **kw) -> bytes:
    return request("POST", path, json.dumps(obj), **kw)


def send(port: int, case: Case) -> tuple[int | None, bytes, float, bool]:
    """(status, body, seconds, timed_out) of one case on a fresh connection."""
    start = time.monotonic()
    deadline = start + case.limit_s
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=case.limit_s) as sock:
        try:
            sock.sendall(case.wire)
            if case.then_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server refused the rest of a big request early: what it said is still readable
            pass
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return _status(got), got, time.monotonic() - start, not got
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                # an answer that has begun but not ended counts as answered (streams are cut by the caller)
                return _status(got), got, time.monotonic() - start, not got
            except OSError:
                break
            if not chunk:
                break
            got += chunk
            if len(got) > 1 << 20:
                break
    return _status(got), got, time.monotonic() - start, False


def _status(raw: bytes) -> int | None:
    line = raw.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit() else None


def alive(port: int, path: str = "/healthz", timeout: float = 5.0) -> bool:
    try:
        status, _, _, _ = send(port, Case("probe", "healthz", request("GET", path, content_type=None), limit_s=timeout))
    except OSError:
        return False
    return status == 200


def run(port: int, cases: Iterable[Case], *, process_alive: Callable[[], bool] = lambda: True,
        health: str = "/healthz") -> list[Outcome]:
    """Send each case, then check the server still answers ``health``; stops early on a crash."""
    outcomes: list[Outcome] = []
    for case in cases:
        try:
            status, body, seconds, timed_out = send(port, case)
        except OSError:
            status, body, seconds, timed_out = None, b"", 0.0, False
        if not process_alive():
            outcomes.append(Outcome(case, status, seconds, "crash", body))
            break
        if timed_out:
            verdict = "hang"
        elif status is None:
            verdict = "clean" if case.closed_ok else "closed"
        else:
            verdict = "clean" if status in case.ok else "error"
        if not alive(port, health):
            verdict = "crash" if not process_alive() else "hang"
        outcomes.append(Outcome(case, status, seconds, verdict, body[:2000]))
        if verdict == "crash":
            break
    return outcomes


@dataclass
class Row:
    klass: str
    tried: int = 0
    clean: int = 0
    errors: int = 0
    hangs: int = 0
    crashes: int = 0
    slowest_s: float = 0.0
    bad: list[str] = field(default_factory=list)


def table(outcomes: Iterable[Outcome]) -> list[Row]:
    """One row per class of case, in first-seen order."""
    rows: dict[str, Row] = {}
    for o in outcomes:
        row = rows.setdefault(o.case.klass, Row(o.case.klass))
        row.tried += 1
        row.slowest_s = max(row.slowest_s, o.seconds)
        if o.verdict == "clean":
            row.clean += 1
        else:
            row.bad.append(f"{o.case.name}: {o.verdict} {o.status} {o.body[-200:]!r}")
            if o.verdict == "hang":
                row.hangs += 1
            elif o.verdict == "crash":
                row.crashes += 1
            else:
                row.errors += 1
    return list(rows.values())


def flood(port: int, n: int, *, health: str = "/healthz", half_header: bool = False, limit_s: float = 10.0) -> Outcome:
    """Hold ``n`` connections open (idle, or each with half a request line: slowloris) and ask ``health`` meanwhile:
    clean when it answers 200 within ``limit_s``."""
    held: list[socket.socket] = []
    name = f"{n} {'half-header' if half_header else 'idle'} connections, then {health}"
    case = Case("connection floods", name, b"", limit_s=limit_s)
    try:
        for _ in range(n):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:  # the server's backlog is full or it refuses: that is its right, health must still answer
                break
            if half_header:
                with contextlib.suppress(OSError):
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            held.append(s)
        start = time.monotonic()
        ok = alive(port, health, timeout=limit_s)
        return Outcome(case, 200 if ok else None, time.monotonic() - start, "clean" if ok else "hang")
    finally:
        for s in held:
            s.close()
