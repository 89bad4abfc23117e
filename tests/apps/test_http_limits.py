"""The HTTP limits edgerun's servers share (apps/http_limits.py), on a real uvicorn on loopback with a small app and
small limits: the connection cap closes the oldest idle connection for a newcomer, headers and bodies have
deadlines that a byte now and then does not extend, requests in flight are bounded, and /healthz always answers."""

from __future__ import annotations

import asyncio
import http.client
import logging
import resource
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from apps.http_limits import ACCEPT_BURST_FDS, FD_RESERVE_MIN, MAX_CONNECTIONS, MIN_CONNECTIONS, HttpLimits, connection_cap, uvicorn_config
from apps.server.serving import listen
from runtime.errors import BadInput

HEADER_S, BODY_S, KEEP_ALIVE_S = 1.0, 1.5, 1  # short, so the deadlines pass within the test


class Tiny:
    """A real uvicorn serving a small app within ``limits`` on a free loopback port, in a thread."""

    def __init__(self, limits: HttpLimits) -> None:
        self.release = threading.Event()  # /hold answers once it is set (or after 10 s)
        self.bodies: list[int] = []

        async def healthz(request: Request) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        async def hold(request: Request) -> JSONResponse:
            deadline = time.monotonic() + 10
            while not self.release.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            return JSONResponse({"held": True})

        async def echo(request: Request) -> JSONResponse:
            body = await request.body()
            self.bodies.append(len(body))
            return JSONResponse({"bytes": len(body)})

        async def refuse(request: Request) -> JSONResponse:  # answers without reading the body (as a bad Host is)
            return JSONResponse({"refused": True}, status_code=403)

        app = Starlette(routes=[Route("/healthz", healthz), Route("/hold", hold), Route("/echo", echo, methods=["POST"]),
                                Route("/refuse", refuse, methods=["POST"])])
        sock = listen("127.0.0.1", 0)
        self.addr = sock.getsockname()[:2]
        self.server = uvicorn.Server(uvicorn_config(app, limits, log_level="warning", lifespan="off",
                                                    timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)

    def get(self, path: str, timeout: float = 5.0) -> int:
        conn = http.client.HTTPConnection(*self.addr, timeout=timeout)
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        finally:
            conn.close()

    def open(self) -> socket.socket:
        return socket.create_connection(self.addr, timeout=5)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        assert not self.thread.is_alive()


@pytest.fixture
def tiny(request: pytest.FixtureRequest) -> Iterator[Tiny]:
    limits = getattr(request, "param", None) or HttpLimits(max_connections=8, max_in_flight=4, header_timeout_s=HEADER_S,
                                                           body_timeout_s=BODY_S, keep_alive_s=KEEP_ALIVE_S)
    server = Tiny(limits)
    yield server
    server.release.set()
    server.stop()


def closed_by_server(sock: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing ``sock`` within ``within`` seconds; None if it is still open."""
    sock.settimeout(0.05)
    got, deadline = b"", time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            piece = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return got
        if not piece:
            return got
        got += piece
    return None


def still_open(socks: list[socket.socket], settle: float = 0.3) -> list[socket.socket]:
    """The sockets of ``socks`` the server has not closed, ``settle`` seconds from now (all read at once: a
    deadline must not pass while they are looked at one by one)."""
    time.sleep(settle)
    out = []
    for sock in socks:
        sock.setblocking(False)
        try:
            if sock.recv(65536):
                out.append(sock)  # it answered something, and may close next
        except BlockingIOError:
            out.append(sock)
        except ConnectionResetError:
            pass
        finally:
            sock.setblocking(True)
    return out


@pytest.mark.parametrize("nofile, cap", [
    (1024, 1024 - 256 - ACCEPT_BURST_FDS),  # a Pi's default: a quarter kept for model files, logs and libraries
    (1024 + 512, 1536 - 384 - ACCEPT_BURST_FDS),
    (512, 512 - FD_RESERVE_MIN - ACCEPT_BURST_FDS),  # the reserve is at least FD_RESERVE_MIN
    (256, MIN_CONNECTIONS),  # never below MIN_CONNECTIONS, however few descriptors
    (1 << 20, MAX_CONNECTIONS),  # a big limit: the per-server ceiling
    (resource.RLIM_INFINITY, MAX_CONNECTIONS),  # unlimited
])
def test_the_connection_cap_follows_the_descriptor_limit(nofile: int, cap: int) -> None:
    assert connection_cap(nofile) == cap


@pytest.mark.parametrize("field, value", [("max_connections", 0), ("max_in_flight", True), ("header_timeout_s", 0),
                                          ("body_timeout_s", float("nan")), ("keep_alive_s", 1.5)])
def test_bad_limits_are_one_line(field: str, value: object) -> None:
    with pytest.raises(BadInput, match=f"{field}="):
        HttpLimits(**{"max_connections": 8, field: value})


def test_a_newcomer_closes_the_oldest_idle_connection(tiny: Tiny) -> None:
    idle = [tiny.open() for _ in range(20)]  # 20 on a cap of 8
    try:
        t0 = time.monotonic()
        assert tiny.get("/healthz") == 200
        assert time.monotonic() - t0 < 2.0  # at once, not after a deadline
        left = still_open(idle)
        assert len(left) <= 8
        assert idle[-1] in left and idle[0] not in left  # the oldest went first
    finally:
        for s in idle:
            s.close()


def test_headers_have_a_deadline_that_dribbling_does_not_extend(tiny: Tiny) -> None:
    silent, partial, dribbler = tiny.open(), tiny.open(), tiny.open()
    try:
        partial.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never ends its headers
        t0 = time.monotonic()
        line = b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 100
        sent = 0
        while time.monotonic() - t0 < HEADER_S + 2 and closed_by_server(dribbler, 0.1) is None:
            dribbler.sendall(line[sent:sent + 1])  # a byte every 0.1 s: always something new, never a whole header
            sent += 1
        assert time.monotonic() - t0 < HEADER_S + 1.5
        assert closed_by_server(silent, 1.0) == b""  # sent nothing: closed without an answer
        answer = closed_by_server(partial, 1.0)
        assert answer is not None and answer.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in answer
        assert tiny.get("/healthz") == 200
    finally:
        for s in (silent, partial, dribbler):
            s.close()


def test_a_body_that_stops_coming_is_408_without_an_error_logged(tiny: Tiny, caplog: pytest.LogCaptureFixture) -> None:
    sock = tiny.open()
    try:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        t0 = time.monotonic()
        answer = closed_by_server(sock, BODY_S + 2)
        assert answer is not None and answer.startswith(b"HTTP/1.1 408 "), answer
        assert BODY_S - 0.2 < time.monotonic() - t0 < BODY_S + 1.5
    finally:
        sock.close()
    time.sleep(0.2)  # the app has unwound
    assert tiny.bodies == []  # the handler never got a body it could mistake for the whole one
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    conn = http.client.HTTPConnection(*tiny.addr, timeout=5)
    conn.request("POST", "/echo", body=b"y" * 5000)  # a whole body still goes through
    assert conn.getresponse().read() == b'{"bytes":5000}'
    conn.close()


def test_a_kept_alive_connection_closes_when_idle(tiny: Tiny) -> None:
    conn = http.client.HTTPConnection(*tiny.addr, timeout=5)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read()
    assert conn.sock is not None
    assert closed_by_server(conn.sock, KEEP_ALIVE_S + 1.5) == b""
    conn.close()


def test_requests_in_flight_are_bounded_and_healthz_still_answers(tiny: Tiny) -> None:
    holders = []
    try:
        for _ in range(4):  # max_in_flight
            conn = http.client.HTTPConnection(*tiny.addr, timeout=10)
            conn.request("GET", "/hold")
            holders.append(conn)
        deadline = time.monotonic() + 5
        while len(tiny.server.server_state.tasks) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        conn = http.client.HTTPConnection(*tiny.addr, timeout=5)
        conn.request("GET", "/hold")
        refused = conn.getresponse()
        assert refused.status == 503 and refused.getheader("Retry-After") == "1" and b"overloaded" in refused.read()
        conn.close()
        assert tiny.get("/healthz") == 200  # exempt: a liveness probe
        tiny.release.set()
        assert [c.getresponse().status for c in holders] == [200] * 4
    finally:
        for c in holders:
            c.close()


@pytest.mark.parametrize("tiny", [HttpLimits(max_connections=2, max_in_flight=4, header_timeout_s=HEADER_S,
                                             body_timeout_s=BODY_S, keep_alive_s=KEEP_ALIVE_S)], indirect=True)
def test_a_newcomer_is_503_when_every_connection_is_busy(tiny: Tiny) -> None:
    holders = []
    try:
        for _ in range(2):
            conn = http.client.HTTPConnection(*tiny.addr, timeout=10)
            conn.request("GET", "/hold")
            holders.append(conn)
        deadline = time.monotonic() + 5
        while len(tiny.server.server_state.tasks) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        late = tiny.open()
        answer = closed_by_server(late, 2.0)
        late.close()
        assert answer is not None and answer.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in answer
        tiny.release.set()
        assert [c.getresponse().status for c in holders] == [200] * 2
    finally:
        for c in holders:
            c.close()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("path", ["/refuse", "/echo"])
def test_a_malformed_chunk_after_whole_headers_is_one_answer_and_no_traceback(tiny: Tiny, path: str) -> None:
    # uvicorn answers the bad chunk size with its own 400 while the app answers the request the headers began:
    # the app's response met h11's closed state ("can't handle event type Response when role=SERVER and
    # state=MUST_CLOSE"), logged by uvicorn as an exception in the ASGI application.
    errors = _Records()
    logging.getLogger("uvicorn.error").addHandler(errors)
    try:
        for _ in range(3):
            sock = tiny.open()
            try:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"
                             .encode())
                answer = closed_by_server(sock, 5)
            finally:
                sock.close()
            assert answer is not None and answer.count(b"HTTP/1.1 ") == 1, answer
        time.sleep(0.3)  # the app's tasks have ended
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert [r.getMessage() for r in errors.records] == []
    assert tiny.get("/healthz") == 200
