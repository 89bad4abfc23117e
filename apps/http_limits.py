"""How many connections an HTTP server of edgerun holds and how long a client may take to send a request: the
uvicorn settings that ``edgerun serve`` and the kiosk dashboard share (:func:`uvicorn_config`).

uvicorn alone sets no deadline on a connection that has not sent a whole request (its keep-alive timer starts
only after a response), and accepts until the process is out of file descriptors; asyncio's accept then fails
with EMFILE and retries once a second. Measured: at a Pi's 1,024 descriptors, 1,100 idle sockets kept
/healthz from answering at all, and a model load's open() failed the same way. Here:

- **connections**: at most ``max_connections`` open, below RLIMIT_NOFILE by a reserve kept for model files,
  logs and the libraries' own, and by what one accept burst may take (:func:`connection_cap`; the listen
  backlog is ACCEPT_BACKLOG). A connection over the cap closes the oldest *idle* one
  (no request of it being answered: keep-alive, or headers not yet whole), so a new client is served at once;
  when none is idle, the newcomer gets a 503 with Retry-After and is closed.
- **deadlines**: a request's headers must be whole ``header_timeout_s`` after its first byte (after the
  connection opened, for its first request), its body ``body_timeout_s`` after its headers; past either the
  client gets a 408 (when it sent something) and the connection closes. Between requests, uvicorn's
  ``timeout_keep_alive`` (``keep_alive_s``) closes an idle connection.
- **requests in flight**: at most ``max_in_flight`` answered at once (a stream counts until it ends); more get
  a 503 with Retry-After. uvicorn's own ``limit_concurrency`` is not used: it counts idle connections too, so
  a crowd of idle sockets would turn every request, /healthz included, into a 503.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import json
import logging
import math
import resource
import time
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 1024  # per server, however many descriptors the process may open
MIN_CONNECTIONS = 8
FD_RESERVE_MIN = 128  # descriptors kept out of the cap: a model load opens files, llama.cpp threads, logs
FD_RESERVE_FRACTION = 0.25
# asyncio accepts up to the listen backlog per loop tick, and a connection gets to its protocol (which can close
# another for it) two ticks after its accept, its victim's descriptor is freed one tick after that: up to three
# backlogs' worth of descriptors beyond the cap. uvicorn's default backlog, 2,048, let one burst take every fd.
ACCEPT_BACKLOG = 64
ACCEPT_BURST_FDS = 3 * ACCEPT_BACKLOG
MAX_IN_FLIGHT = 256  # requests answered at once; each may hold its body (up to serve's max_body_bytes)
RETRY_AFTER_S = 1
EXEMPT = ("/healthz",)  # never refused for requests in flight: a liveness probe must see a live server


def connection_cap(nofile: int) -> int:
    """The connections a server may hold in a process that may open ``nofile`` descriptors (RLIMIT_NOFILE's soft
    limit; RLIM_INFINITY or <= 0: unbounded): that less a reserve of a quarter of it (at least FD_RESERVE_MIN)
    and less the descriptors an accept burst may hold beyond the cap (ACCEPT_BURST_FDS)."""
    if nofile <= 0 or nofile == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    reserve = max(FD_RESERVE_MIN, int(nofile * FD_RESERVE_FRACTION))
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, nofile - reserve - ACCEPT_BURST_FDS))


@dataclass(frozen=True)
class HttpLimits:
    """The bounds of one server (see the module docstring); times in seconds."""

    max_connections: int
    max_in_flight: int = MAX_IN_FLIGHT
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: int = 5  # uvicorn takes whole seconds

    @classmethod
    def for_this_process(cls) -> HttpLimits:
        """The limits for this process's RLIMIT_NOFILE (read now)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = connection_cap(soft)
        return cls(max_connections=cap, max_in_flight=min(MAX_IN_FLIGHT, cap))

    def __post_init__(self) -> None:
        from runtime.errors import BadInput

        for name in ("max_connections", "max_in_flight", "keep_alive_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInput(f"HTTP limit {name}={value!r} must be a whole number >= 1")
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise BadInput(f"HTTP limit {name}={value!r} must be seconds > 0")


def uvicorn_config(app: Any, limits: HttpLimits | None = None, **settings: Any) -> uvicorn.Config:
    """A uvicorn Config serving ``app`` within ``limits`` (default: :meth:`HttpLimits.for_this_process`), over
    h11 (the protocol that carries the deadlines); ``settings``: the rest of uvicorn's (log_level, lifespan...)."""
    limits = limits if limits is not None else HttpLimits.for_this_process()
    return uvicorn.Config(RequestGuard(app, limits.max_in_flight), http=functools.partial(LimitedH11Protocol, limits=limits),
                          timeout_keep_alive=limits.keep_alive_s, backlog=ACCEPT_BACKLOG, **settings)


def _raw_error(status: int, reason: str, code: str, message: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection; its body is the API's JSON error."""
    body = json.dumps({"error": {"message": message, "type": "server_error" if status >= 500 else "invalid_request_error",
                                 "code": code}}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close"] + ([f"retry-after: {retry_after}"] if retry_after is not None else [])
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Tally:
    """Counts of one kind of refusal, logged at most once a minute: a flood of them must not flood the log."""

    def __init__(self, what: str) -> None:
        self.what, self.count, self.logged = what, 0, 0.0

    def add(self) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.logged >= 60.0:
            log.warning("%d %s in the last minute", self.count, self.what)
            self.count, self.logged = 0, now


_EVICTED = _Tally("idle HTTP connections closed to stay under the connection cap")
_REFUSED = _Tally("HTTP connections refused (503): every connection busy")
_TIMED_OUT = _Tally("HTTP requests not sent in time (408)")
_OVERLOADED = _Tally("HTTP requests refused (503): too many in flight")


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the connection cap and the read deadlines of ``limits``."""

    def __init__(self, *args: Any, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._deadline: asyncio.TimerHandle | None = None
        self._reading: str | None = None  # "headers" | "body" while a deadline runs
        self._sent_any = False  # the client sent bytes of the request being read
        self.idle_since = 0.0  # loop time the connection last had no request: the oldest idle is closed first

    def idle(self) -> bool:
        """No request of this connection is being answered (between requests, or headers not yet whole)."""
        return ((self.cycle is None or self.cycle.response_complete) and self.conn.their_state is h11.IDLE
                and not self.transport.is_closing())

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.idle_since = self.loop.time()
        self._arm("headers")
        if len(self.connections) > self.limits.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._reading is None and self.idle():  # the first byte of a request on a kept-alive connection
            self._arm("headers")
        if self._reading == "headers":
            self._sent_any = True
        super().data_received(data)
        self._follow()

    def send_400_response(self, msg: str) -> None:
        """uvicorn answers a request it cannot parse (a malformed chunk size after whole headers) with a 400 and
        closes, while the app may already be answering the request those headers began: its response then met
        h11's closed state and was logged as a traceback. The app's cycle is told the client is gone first, so
        whatever it sends is dropped; a response already under way is not interrupted by a second one."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()  # a receive() waiting for the body returns http.disconnect
            if cycle.response_started:  # no 400 can follow a response begun: only close
                self.transport.close()
                return
        super().send_400_response(msg)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # uvicorn's keep-alive timer governs an idle connection from here
        self.idle_since = self.loop.time()
        self._follow()  # a pipelined request may have started

    def _follow(self) -> None:
        """Move the deadline along the request: headers whole -> the body's; body whole -> none (the app's own)."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return
        if cycle.more_body and not cycle.disconnected:
            if self._reading != "body":
                self._arm("body")
        elif self._reading is not None:
            self._disarm()

    def _arm(self, what: str) -> None:
        self._disarm()
        seconds = self.limits.header_timeout_s if what == "headers" else self.limits.body_timeout_s
        self._reading, self._sent_any = what, False
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._reading = None, None

    def _expired(self) -> None:
        what, sent = self._reading, self._sent_any or self._reading == "body"
        self._deadline, self._reading = None, None
        if self.transport.is_closing():
            return
        # a body can be late after the app has answered without reading it (a 413): no second response then
        answered = what == "body" and self.cycle is not None and self.cycle.response_started
        if sent and not answered:
            seconds = self.limits.header_timeout_s if what == "headers" else self.limits.body_timeout_s
            _TIMED_OUT.add()
            self.transport.write(_raw_error(408, "Request Timeout", "request_timeout",
                                            f"the request {what} did not arrive within {seconds:g} s"))
        self.transport.close()

    def _make_room(self) -> None:
        """Over the cap: close the oldest idle connections, or refuse this one when every other is busy."""
        open_ = [c for c in self.connections if not c.transport.is_closing()]
        excess = len(open_) - self.limits.max_connections
        if excess <= 0:
            return
        idle = (c for c in open_ if c is not self and isinstance(c, LimitedH11Protocol) and c.idle())
        for victim in heapq.nsmallest(excess, idle, key=lambda c: c.idle_since):
            _EVICTED.add()
            victim._disarm()
            victim.transport.close()
            excess -= 1
        if excess > 0:
            _REFUSED.add()
            self._disarm()
            self.transport.write(_raw_error(503, "Service Unavailable", "overloaded",
                                            "every connection of this server is busy; try again", RETRY_AFTER_S))
            self.transport.close()


class _BodyCut(BaseException):
    """The client is gone before its request body was whole: raised through the app (past its ``except
    Exception``, as a cancellation would be) so that it unwinds without answering; caught by RequestGuard."""


class RequestGuard:
    """ASGI middleware: at most ``limit`` HTTP requests of ``app`` answered at once; more get a 503 (the paths in
    ``exempt``, the liveness probe, which does no work, are always passed on). A request whose body never came
    whole (the client hung up, or its body deadline closed the connection) ends the app quietly: nobody is left
    to answer, and Starlette's ClientDisconnect would otherwise be logged as a failure with its traceback."""

    def __init__(self, app: Any, limit: int, exempt: tuple[str, ...] = EXEMPT) -> None:
        self.app, self.limit, self.exempt, self.in_flight = app, limit, exempt, 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit and scope["path"] not in self.exempt:
            _OVERLOADED.add()
            body = json.dumps({"error": {"message": f"the server is answering {self.limit} requests; try again",
                                         "type": "server_error", "code": "overloaded"}}).encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", str(RETRY_AFTER_S).encode()),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        body_whole = False

        async def guarded_receive() -> Any:
            nonlocal body_whole
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_whole = True
            elif message["type"] == "http.disconnect" and not body_whole:
                raise _BodyCut()
            return message

        self.in_flight += 1
        try:
            await self.app(scope, guarded_receive, send)
        except _BodyCut:
            log.debug("%s %s: the client left before its request body was whole", scope["method"], scope["path"])
        finally:
            self.in_flight -= 1
