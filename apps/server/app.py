"""The Starlette app: routes, the API key check, OpenAI-shaped errors. Handlers stay thin: model work is runtime's.

    GET  /v1/models                 the served models;  GET /v1/models/{model}  one of them
    POST /v1/chat/completions       OpenAI chat, whole or streamed (SSE)
    POST /v1/completions            OpenAI completions, whole or streamed
    POST /v1/classify?model=NAME    an image or a WAV body -> labels and scores
    GET  /healthz                   the process answers (no key needed)
    GET  /readyz                    the models are loaded (503 until then; no key needed: without one, only the status)
    GET  /metrics                   Prometheus text
    GET  /admin/canary              canary states;  POST /admin/canary/{model}/{promote|rollback}

Request headers: ``Authorization: Bearer KEY`` (when keys are configured), ``X-Priority: urgent|interactive|batch``
(or the body's ``priority``; capped by the key), ``X-Deadline-Ms`` (or the body's ``deadline_ms``),
``Cache-Control: no-store`` (skip the result cache). Response headers: ``X-Edgerun-Priority`` (the class served),
``X-Edgerun-Truncated: tokens=N, messages=M`` (what was dropped to fit the context; a stream's header carries the
drops known before it starts, its final usage all of them), ``X-Edgerun-Cache: hit``, ``Retry-After`` on a 429.
Without API keys only requests addressed to localhost or a loopback address are answered (DNS rebinding); a request
from a web page (``Origin``) only when its origin is in ``cors_origins``; the admin endpoints only with an admin key.
Statuses: 400 bad request (and content filter), 401 key, 403 not an admin key, a foreign Host or Origin, 404 unknown
model or route,
413 body over the cap, 429 queue full, 503 not ready / does not fit, 504 deadline passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from apps.server import openai_api as api
from apps.server.classify import classify
from apps.server.generate import generate
from apps.server.security import ApiKey, Forbidden, check_host, check_model_name, check_origin
from apps.server.state import ServerState
from runtime.errors import BadInput, EdgerunError

log = logging.getLogger(__name__)
SWEEP_S = 5.0  # keep_alive is checked this often (seconds)
Handler = Callable[[Request, ServerState, "ApiKey | None"], Awaitable[Response]]


def endpoint(handler: Handler, *, auth: bool = True, ready: bool = True, admin: bool = False) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` behind the key check (before the body is read) and the readiness check, its errors as OpenAI JSON."""

    async def run(request: Request) -> Response:
        state: ServerState = request.app.state.edgerun
        try:
            if not state.keys.required:
                check_host(request, state.config.host)
            check_origin(request, state.config.cors_origins)
            key = state.keys.authenticate(request) if auth else None
            if admin and (key is None or not key.admin):  # never open: without keys, any local process or web page could
                raise Forbidden("the admin endpoints need an admin API key (a key marked 'admin' in --api-key-file)"
                                if key is None else "this API key may not use the admin endpoints (mark it 'admin' in the keys file)")
            if ready and not state.ready.is_set():
                raise api.NotReady(state.failed or "the server is loading its models; try again shortly")
            return await handler(request, state, key)
        except EdgerunError as exc:
            return api.error_response(exc)
        except Exception as exc:  # a bug: logged with its traceback, the client gets a 500 without details
            log.exception("%s %s failed", request.method, request.url.path)
            return api.error_response(exc)

    return run


def _model_card(state: ServerState, entry: Any) -> dict[str, Any]:
    return {"id": entry.name, "object": "model", "created": 0, "owned_by": "edgerun",
            "kind": state.models.kinds.get(entry.name, entry.kind or ""), **state.models.abilities.get(entry.name, {})}


async def list_models(request: Request, state: ServerState, key: ApiKey | None) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(state, m) for m in state.config.models]})


async def get_model(request: Request, state: ServerState, key: ApiKey | None) -> Response:
    """GET /v1/models/{model}: one served model (OpenAI's models.retrieve), checked as a name first."""
    name = check_model_name(request.path_params["model"])
    entry = state.config.model(name)
    if entry is None:
        raise api.UnknownModel(f"model {name!r} is not served here; served: {', '.join(m.name for m in state.config.models)}")
    return JSONResponse(_model_card(state, entry))


async def chat_completions(request: Request, state: ServerState, key: ApiKey | None) -> Response:
    return await generate(request, state, key, chat=True)


async def completions(request: Request, state: ServerState, key: ApiKey | None) -> Response:
    return await generate(request, state, key, chat=False)


async def healthz(request: Request, state: ServerState, key: ApiKey | None) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request, state: ServerState, key: ApiKey | None) -> Response:
    """Ready (200) or not (503). With API keys configured, a caller without a valid key gets the status alone:
    the resident models and a start-up error (which may name files and folders) are for key holders."""
    if state.keys.required:
        try:
            state.keys.authenticate(request)
        except BadInput:  # no key or a wrong one: the status only
            if state.ready.is_set():
                return JSONResponse({"status": "ready"})
            return api.error_response(api.NotReady(
                "start-up failed: the reason is in the server log, and on /readyz with an API key" if state.failed
                else "loading models"))
    if state.ready.is_set():
        return JSONResponse({"status": "ready", "models": state.models.resident()})
    raise api.NotReady(state.failed or "loading models")


async def metrics(request: Request, state: ServerState, key: ApiKey | None) -> Response:
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


async def canary_states(request: Request, state: ServerState, key: ApiKey | None) -> Response:
    return JSONResponse({name: router.state() for name, router in state.canaries.items()})


async def canary_action(request: Request, state: ServerState, key: ApiKey | None) -> Response:
    name, action = request.path_params["model"], request.path_params["action"]
    router = state.canaries.get(name)
    if router is None:
        raise api.UnknownModel(f"no canary for {name!r}; canaries: {', '.join(state.canaries) or 'none'}")
    if action == "promote":
        return JSONResponse(router.promote())
    if action == "rollback":
        return JSONResponse(router.rollback(f"rolled back by {key.label if key else 'the admin endpoint'}"))
    raise BadInput(f"unknown canary action {action!r}; valid: promote, rollback")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    body = {"error": {"message": f"{request.method} {request.url.path}: {exc.detail}", "type": kind, "param": None,
                      "code": "not_found" if exc.status_code == 404 else None}}
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


def create_app(state: ServerState, *, load: bool = True) -> Starlette:
    """The ASGI app over ``state``. ``load``: load the models in the background at start-up (/readyz says when)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if load and not state.ready.is_set():
            threading.Thread(target=_start, args=(state,), daemon=True, name="edgerun-load").start()
        sweeper = asyncio.create_task(_sweep(state))
        try:
            yield
        finally:
            sweeper.cancel()
            state.close()

    routes = [
        Route("/v1/models", endpoint(list_models), methods=["GET"]),
        Route("/v1/models/{model}", endpoint(get_model), methods=["GET"]),
        Route("/v1/chat/completions", endpoint(chat_completions), methods=["POST"]),
        Route("/v1/completions", endpoint(completions), methods=["POST"]),
        Route("/v1/classify", endpoint(classify), methods=["POST"]),
        Route("/healthz", endpoint(healthz, auth=False, ready=False), methods=["GET"]),
        Route("/readyz", endpoint(readyz, auth=False, ready=False), methods=["GET"]),
        Route("/metrics", endpoint(metrics, ready=False), methods=["GET"]),
        Route("/admin/canary", endpoint(canary_states, admin=True), methods=["GET"]),
        Route("/admin/canary/{model}/{action}", endpoint(canary_action, admin=True), methods=["POST"]),
    ]
    middleware = []
    if state.config.cors_origins:  # off unless configured
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(state.config.cors_origins), allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "cache-control", "x-priority", "x-deadline-ms"],
            expose_headers=["x-edgerun-truncated", "x-edgerun-priority", "x-edgerun-cache", "retry-after"]))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error})
    app.state.edgerun = state
    return app


async def _sweep(state: ServerState) -> None:
    """Unload models idle past their keep_alive, now and then."""
    while True:
        await asyncio.sleep(SWEEP_S)
        try:
            await run_in_threadpool(state.models.sweep)
        except Exception:  # logged; the next sweep tries again
            log.exception("keep-alive sweep failed")


def _start(state: ServerState) -> None:
    t0 = time.monotonic()
    try:
        state.start()
    except Exception:  # logged by start(); /readyz reports it
        return
    log.warning("ready: %s in %.1f s", ", ".join(m.name for m in state.config.models), time.monotonic() - t0)

