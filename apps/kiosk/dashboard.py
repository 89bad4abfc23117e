"""The kiosk's dashboard: one page, live over server-sent events, served by the kiosk process itself.

Routes: ``/`` (the page), ``/app.js``, ``/style.css``, ``/events`` (SSE: a full snapshot on connect and after
every change, at most ``MAX_EVENTS_PER_S`` a second per browser), ``/api/state`` (the snapshot as JSON),
``/api/frame/latest[?seq=N]`` and ``/api/rejects/{n}`` (JPEG), and one action: ``POST /api/faults/clear`` with
``Content-Type: application/json`` and ``{"operator": NAME, "note": TEXT}`` releases the latched faults
(:mod:`apps.kiosk.faults`) and answers ``{"cleared": [...], "faults": {...}}``; 400 for a bad body, 403 from
another origin, 413 over MAX_CLEAR_BODY bytes, 415 without the JSON content type. From a shell on the kiosk::

    curl -X POST -H 'Content-Type: application/json' -d '{"operator": "ana"}' http://127.0.0.1:8080/api/faults/clear

Closed by default: it binds 127.0.0.1, and without a token it answers only requests addressed to a loopback
name (a page elsewhere cannot reach it through DNS rebinding). Beyond this machine it needs a token (from a file:
:func:`load_token`), compared in constant time; a browser opens ``/?token=TOKEN`` once and keeps it in a cookie,
other clients send ``Authorization: Bearer TOKEN``. The page loads nothing from anywhere else (its CSP forbids it),
and every response, errors included, carries the same security headers (:data:`HEADERS`; CORP same-origin: no
other site may embed a frame or the state). The clear action needs a JSON body, which a cross-site form cannot
send, and refuses a request whose ``Origin`` or ``Sec-Fetch-Site`` names another site.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from apps.kiosk.state import KioskState, Subscription
from runtime.errors import BadInput, one_line

log = logging.getLogger(__name__)

WEB = Path(__file__).with_name("web")
ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
MIN_TOKEN_CHARS = 16  # shorter is guessable over a LAN
TOKEN_CHARS = re.compile(r"[A-Za-z0-9_.~-]+")  # URL- and cookie-safe as they are: secrets.token_urlsafe's alphabet
COOKIE = "kiosk_token"
MAX_EVENTS_PER_S = 10  # snapshots per browser: more is invisible to a person and costs the box CPU
PING_S = 15.0  # an SSE comment this often on a quiet line, so a dead browser's stream ends
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Resource-Policy": "same-origin",  # no other site's page may load a frame, a reject or the state
}
MAX_CLEAR_BODY = 4096  # bytes of a fault-clear request: an operator's name and a note


def check_token(token: str, where: str = "the dashboard token") -> str:
    """``token`` when it is at least MIN_TOKEN_CHARS URL-safe characters (it travels in a URL and a cookie as
    it is), else BadInput."""
    if len(token) < MIN_TOKEN_CHARS or not TOKEN_CHARS.fullmatch(token):
        raise BadInput(f"{where} must be at least {MIN_TOKEN_CHARS} characters of A-Z a-z 0-9 _ - . ~ "
                       "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    return token


def load_token(path: Path | str) -> str:
    """The dashboard token: the first line of the file ``path``, checked by :func:`check_token`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read the dashboard token file ({getattr(exc, 'strerror', None) or exc})") \
            from None
    lines = text.strip().splitlines()
    return check_token(lines[0].strip() if lines else "", f"{path}: the dashboard token")


def check_bind(host: str, token: str | None) -> None:
    """Refuse, before anything binds, to serve the dashboard beyond this machine without a token."""
    from apps.server.security import is_loopback

    if not is_loopback(host) and not token:
        raise BadInput(f"refusing to serve the kiosk dashboard on {host!r} without a token: anyone on the network "
                       "could watch the line; give a token file, or bind 127.0.0.1")


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def _host_name(header: str) -> str:
    """The name in a Host header, without the port: ``[::1]:8080`` -> ``::1``."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def _loopback_name(name: str) -> bool:
    """``localhost`` or a loopback address literal; never a DNS name, however it starts ("127.evil.example")."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class _Guard:
    """Who may read the dashboard: with a token, whoever presents it; without one, only loopback requests."""

    def __init__(self, token: str | None) -> None:
        self.digest = _digest(token) if token else None

    def given(self, request: Request) -> str | None:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return request.query_params.get("token") or request.cookies.get(COOKIE)

    def refusal(self, request: Request) -> Response | None:
        """None when the request may go on, else the response that refuses it."""
        if self.digest is None:
            name = _host_name(request.headers.get("host", "")).lower()
            if _loopback_name(name):
                return None
            return PlainTextResponse(f"the dashboard answers only loopback names without a token, not {name!r}\n",
                                     status_code=403, headers=HEADERS)
        given = self.given(request)
        if given is not None and hmac.compare_digest(_digest(given), self.digest):
            return None
        what = "missing" if given is None else "wrong"
        return PlainTextResponse(f"{what} dashboard token: open /?token=TOKEN once, or send "
                                 "'Authorization: Bearer TOKEN'\n", status_code=401, headers=HEADERS)


class _SecurityHeaders:
    """ASGI middleware: every response gets the HEADERS it does not set itself (404 and 405 included)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in HEADERS.items()]

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                have = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in self.headers if k not in have]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A bug in a handler: one line, the security headers still on (this runs outside the middleware)."""
    log.error("dashboard: %s %s failed: %s", request.method, request.url.path, one_line(exc))
    return PlainTextResponse("internal error\n", status_code=500, headers=HEADERS)


def _other_origin(request: Request) -> str | None:
    """Why a state-changing request comes from another site, None when it does not (a browser names the page's
    origin in ``Origin`` and ``Sec-Fetch-Site``; curl sends neither)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site {site[:20]!r}"
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host', '')}":
        return f"Origin {origin[:80]!r}"
    return None


async def _clear_request(request: Request) -> tuple[str, str] | Response:
    """(operator, note) from a fault-clear request, or the response that refuses it."""
    def refuse(status: int, text: str) -> Response:
        return PlainTextResponse(text + "\n", status_code=status, headers=HEADERS)

    if (why := _other_origin(request)) is not None:
        return refuse(403, f"refusing to clear faults for a page of another site ({why})")
    if request.headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
        return refuse(415, 'send Content-Type: application/json and {"operator": NAME, "note": TEXT}')
    length = request.headers.get("content-length", "0")
    if not length.isdigit() or int(length) > MAX_CLEAR_BODY:
        return refuse(413, f"a fault-clear request is at most {MAX_CLEAR_BODY} bytes")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_CLEAR_BODY:
            return refuse(413, f"a fault-clear request is at most {MAX_CLEAR_BODY} bytes")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return refuse(400, 'the body is not JSON; send {"operator": NAME, "note": TEXT}')
    if not isinstance(data, dict) or not isinstance(data.get("operator"), str) or not isinstance(data.get("note", ""), str) \
            or set(data) - {"operator", "note"}:
        return refuse(400, 'send {"operator": NAME, "note": TEXT} (note optional), nothing else')
    return data["operator"], data.get("note", "")


@dataclass
class _Live:
    """The app's open event streams, closed when the dashboard stops so none holds the shutdown."""

    stopping: threading.Event = field(default_factory=threading.Event)
    streams: set[Subscription] = field(default_factory=set)

    def stop(self) -> None:
        self.stopping.set()
        for sub in list(self.streams):
            sub.close()


def create_app(state: KioskState, token: str | None = None, live: _Live | None = None) -> Starlette:
    guard = _Guard(token)
    live = live or _Live()

    def guarded(handler):
        async def endpoint(request: Request) -> Response:
            refused = guard.refusal(request)
            return refused if refused is not None else await handler(request)
        return endpoint

    async def index(request: Request) -> Response:
        if token and request.query_params.get("token"):  # the token leaves the address bar for a cookie
            response = RedirectResponse("/", status_code=303, headers=HEADERS)
            response.set_cookie(COOKIE, request.query_params["token"], httponly=True, samesite="strict")
            return response
        return FileResponse(WEB / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS)

    async def asset(request: Request) -> Response:
        name = request.url.path.lstrip("/")
        return FileResponse(WEB / name, media_type=ASSETS[name], headers=HEADERS)

    async def api_state(request: Request) -> Response:
        return JSONResponse(state.snapshot(), headers=HEADERS)

    async def frame(request: Request) -> Response:
        seq = request.query_params.get("seq")
        # ASCII digits only (int() would take " 1_2" or "٣"), and few enough that int() stays cheap
        if seq is None or (seq.isascii() and seq.isdigit() and len(seq) <= 19):
            wanted = None if seq is None else int(seq)
        else:
            return PlainTextResponse(f"seq must be a part number, got {seq[:40]!r}\n", status_code=400,
                                     headers=HEADERS)
        found = await run_in_threadpool(state.frame_picture, wanted)
        if found is None:
            return PlainTextResponse("no frame yet\n", status_code=404, headers=HEADERS)
        return Response(found[1], media_type="image/jpeg", headers={**HEADERS, "X-Seq": str(found[0])})

    async def reject(request: Request) -> Response:
        n = request.path_params["n"]
        picture = await run_in_threadpool(state.reject_picture, n)
        if picture is None:
            return PlainTextResponse(f"reject {n} is not in the gallery (or had no frame)\n", status_code=404,
                                     headers=HEADERS)
        return Response(picture, media_type="image/jpeg", headers=HEADERS)

    async def events(request: Request) -> Response:
        from apps.server.sse import EventStream, event

        sub = state.subscribe(loop=asyncio.get_running_loop())
        live.streams.add(sub)

        async def stream():
            try:
                yield event(state.snapshot())
                sent = time.monotonic()
                while not live.stopping.is_set():
                    notes = await sub.next(PING_S)
                    if live.stopping.is_set() or sub.closed:
                        break
                    if not notes:
                        yield b": ping\n\n"
                        continue
                    wait = sent + 1.0 / MAX_EVENTS_PER_S - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                        sub.get(timeout=0)  # what changed meanwhile is in the snapshot below
                    yield event(state.snapshot())
                    sent = time.monotonic()
            finally:
                live.streams.discard(sub)
                sub.close()

        return EventStream(stream(), headers={k: v for k, v in HEADERS.items() if k != "Cache-Control"})

    async def clear_faults(request: Request) -> Response:
        asked = await _clear_request(request)
        if isinstance(asked, Response):
            return asked
        try:
            cleared = state.faults.clear(*asked)
        except BadInput as exc:
            return PlainTextResponse(f"{exc}\n", status_code=400, headers=HEADERS)
        return JSONResponse({"cleared": [f.to_dict() for f in cleared], "faults": state.faults.snapshot()}, headers=HEADERS)

    routes = [Route("/", guarded(index)), Route("/api/state", guarded(api_state)),
              Route("/api/frame/latest", guarded(frame)), Route("/api/rejects/{n:int}", guarded(reject)),
              Route("/events", guarded(events)), Route("/api/faults/clear", guarded(clear_faults), methods=["POST"])]
    routes += [Route(f"/{name}", guarded(asset)) for name in ASSETS]
    return Starlette(routes=routes, middleware=[Middleware(_SecurityHeaders)],
                     exception_handlers={Exception: _internal_error})


@dataclass
class DashboardHandle:
    """A running dashboard: ``url`` to open, :meth:`stop` to end it (idempotent)."""

    url: str
    host: str
    port: int
    _server: Any
    _thread: threading.Thread
    _live: _Live

    def stop(self, timeout: float = 10.0) -> None:
        self._live.stop()
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> DashboardHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_dashboard(state: KioskState, host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
                    *, start_timeout: float = 30.0) -> DashboardHandle:
    """Serve the dashboard of ``state`` on ``host:port`` (0: any free port) in a daemon thread beside the
    pipeline. BadInput, before anything binds, for a LAN address without a token or a port that cannot be had."""
    if token is not None:
        check_token(token)
    check_bind(host, token)
    import uvicorn

    from apps.http_limits import uvicorn_config
    from apps.server.serving import listen

    sock = listen(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    live = _Live()
    # the serve API's connection cap and request deadlines (apps/http_limits.py)
    server = uvicorn.Server(uvicorn_config(create_app(state, token, live), log_level="warning", access_log=False,
                                           lifespan="off", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="kiosk-dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise BadInput(f"the kiosk dashboard did not start on {host}:{port}")
        time.sleep(0.02)
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    log.info("kiosk dashboard on http://%s:%d/ (%s)", shown, bound_port, "token required" if token else "loopback only")
    return DashboardHandle(f"http://{shown}:{bound_port}/", bound_host, bound_port, server, thread, live)
