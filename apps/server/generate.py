"""POST /v1/chat/completions and /v1/completions: a checked request onto the model's service, events back as JSON
or SSE. A client that goes away cancels its generation, and so does a streaming client that stops reading (see
apps/server/sse.py); the model's lease is held until the answer ends."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from apps.server import openai_api as api
from apps.server.call import Call, read_call
from apps.server.llm_service import EngineService
from apps.server.outcome import Outcome
from apps.server.request import disconnected
from apps.server.security import ApiKey
from apps.server.sse import DONE, EventStream, event
from apps.server.state import ServerState
from runtime.errors import BackendError, Cancelled, DeadlineExceeded, EdgerunError, one_line
from runtime.llm.sampling import SamplingParams

log = logging.getLogger(__name__)
STOP_WAIT_S = 60.0  # a cancelled generation stops within one decode step; this is the bound of waiting for that


def _model_version(model: Any) -> str:
    manifest = getattr(getattr(model, "model", None), "manifest", None)
    return str(getattr(manifest, "version", "")) if manifest is not None else ""


class _VersionFault(Exception):
    """The served version failed before answering (its load, or its first step): another version may answer."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


async def generate(request: Request, state: ServerState, key: ApiKey | None, chat: bool) -> Response:
    call = await read_call(request, state, key, chat=chat)  # the only read of the request's body and headers
    args = call.args
    outcome = Outcome(state, call.id, call.model, call.served, call.priority, stream=args.stream, client=call.client)
    try:
        text_in = args.prompt if args.prompt is not None else "\n".join(m["content"] for m in args.messages or [])
        state.filters.check_input(text_in)
    except EdgerunError as exc:
        outcome.finish(error=exc)
        raise
    router = state.canaries.get(call.model)
    while True:
        try:
            return await _attempt(state, call, outcome, request.receive)
        except _VersionFault as fault:
            if router is None or outcome.served != router.canary or router.serving == router.canary:
                outcome.finish(error=fault.error, version_fault=True)
                raise fault.error from None
            # The canary failed before answering: counted against it, and the stable version answers instead,
            # so no request fails because a canary is being tried.
            log.warning("canary %s failed (%s); answered by %s", outcome.served, one_line(fault.error), router.stable)
            outcome.failed_attempt(fault.error)
            outcome.served = outcome.version = router.stable


async def _attempt(state: ServerState, call: Call, outcome: Outcome, receive: Receive) -> Response:
    """One try of ``call`` on the version ``outcome.served``; _VersionFault when that version failed before
    answering. ``receive``: the request's ASGI receive channel, watched for the client's going."""
    served, args = outcome.served, call.args
    lease = contextlib.ExitStack()
    try:
        model = await run_in_threadpool(lease.enter_context, state.models.acquire(served))
    except EdgerunError as exc:
        raise _VersionFault(exc) from None
    try:
        outcome.version = f"{served}@{_model_version(model)}"
        svc = state.service(served, model)
        params = svc.params(**args.sampling)
        messages, specs = args.messages, None
        if args.tooled:  # the model's tool format (its own template's, or edgerun's) and the calls' grammar
            messages, specs, params = await run_in_threadpool(svc.engine.tool_chat, messages, args.tools, params)
        cache_key = _cache_key(state, call, outcome, params, _model_version(model))
        if state.stopping.is_set():
            raise api.ShuttingDown("the server is shutting down; try again")
        hit = state.cache.get(cache_key) if cache_key is not None else None
        if hit is not None:
            outcome.cache = "hit"
            lease.close()
            return _replay(api.Reply(call.chat, call.id, call.model, outcome.version, call.args.tools), call, hit, outcome,
                           {"X-Edgerun-Priority": call.priority.name.lower()})
        handle, truncations = await _submit(svc, call, params, receive, messages, specs)
    except BaseException as exc:
        lease.close()
        outcome.finish(error=exc)
        raise
    run = _Run(state, call, receive, handle, lease, outcome, cache_key)
    try:
        first = await run.next()  # an error before any text (queue deadline, refused prompt) keeps its HTTP status
    except BaseException as exc:
        fault = _is_fault(exc)
        run.close(error=exc, record=not fault)
        if fault:
            raise _VersionFault(exc) from None
        raise
    if first is None:  # the client went away
        return Response(status_code=499)
    headers = {"X-Edgerun-Priority": call.priority.name.lower(), **api.truncated_header(list(truncations))}
    reply = api.Reply(call.chat, call.id, call.model, outcome.version, args.tools)
    if args.stream:
        return EventStream(run.stream(reply, first), headers, on_stall=lambda stalled: run.close(error=stalled))
    return await run.whole(reply, first, headers)


async def _submit(svc: EngineService, call: Call, params: SamplingParams, receive: Receive,
                  messages: list[dict[str, Any]] | None, tools: list[dict[str, Any]] | None) -> tuple[Any, list[Any]]:
    """``svc.submit`` in a worker thread; fitting a conversation to the context stops between its renderings once
    the client has gone (Cancelled) or the deadline has passed (DeadlineExceeded). A handle submitted before the
    client's going was noticed is returned: its first event sees the disconnect and cancels it."""
    gone, args, deadline = threading.Event(), call.args, call.deadline

    def interrupt() -> None:
        if gone.is_set():
            raise Cancelled("the client disconnected")
        if time.monotonic() > deadline:
            raise DeadlineExceeded("the request's deadline passed while its conversation was fitted to the context")

    work = asyncio.ensure_future(run_in_threadpool(
        svc.submit, messages=messages, prompt=args.prompt, params=params, priority=call.priority, deadline=deadline,
        truncate=args.truncate, interrupt=interrupt, tools=tools))
    watch = asyncio.ensure_future(disconnected(receive))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():  # the client went (or this task was cancelled): the fitting stops at its next rendering
            gone.set()
    return await work


def _is_fault(exc: BaseException) -> bool:
    """The model's failure, not the request's: a backend error or a bug (not a deadline, a cancel or a refusal)."""
    return isinstance(exc, Exception) and (not isinstance(exc, EdgerunError) or isinstance(exc, BackendError))


def _cache_key(state: ServerState, call: Call, outcome: Outcome, params: SamplingParams, version: str) -> str | None:
    """The result cache's key for ``call`` on ``outcome.served`` at ``version``, scoped to its API key (its digest),
    or None when not cached."""
    cache = state.cache
    if cache is None:
        return None
    if call.no_store:
        outcome.cache = "skip"
        return None
    settings = dataclasses.asdict(params)
    if not cache.cacheable(settings):
        outcome.cache = "skip"
        return None
    outcome.cache = "miss"
    scope = call.key.digest.hex() if call.key is not None else ""
    return cache.key(f"{outcome.served}@{version}", settings, {"chat": call.chat, **call.args.cache_payload()}, scope=scope)


def _replay(reply: api.Reply, call: Call, hit: tuple[str, Any], outcome: Outcome, headers: dict[str, str]) -> Response:
    text, result = hit
    args = call.args
    outcome.first_token()
    outcome.finish(result=result)
    headers = {**headers, "X-Edgerun-Cache": "hit", **api.truncated_header(list(result.truncations))}
    if not args.stream:
        return JSONResponse(reply.completion(text, result), headers=headers)

    async def body() -> AsyncIterator[bytes]:
        yield event(reply.chunk("", first=True))
        for piece in reply.pieces(text, end=True, logprobs=result.logprobs):
            yield event(piece)
        yield event(reply.last_chunk(result))
        if args.include_usage:
            yield event(reply.usage_chunk(result))
        yield DONE

    return EventStream(body(), headers)


def _release_when_done(handle: Any, lease: contextlib.ExitStack) -> None:
    deadline = time.monotonic() + STOP_WAIT_S
    while not handle.finished:
        if time.monotonic() > deadline:
            log.error("a cancelled generation did not stop within %.0f s; its model lease is released anyway", STOP_WAIT_S)
            break
        time.sleep(0.01)
    lease.close()


class _Run:
    """One submitted generation of ``call``: its events, its lease, its outcome; closed exactly once. ``receive``:
    the request's ASGI receive channel, watched for the client's going."""

    def __init__(self, state: ServerState, call: Call, receive: Receive, handle: Any, lease: contextlib.ExitStack,
                 outcome: Outcome, cache_key: str | None) -> None:
        self.state, self.call, self.receive, self.handle, self.lease = state, call, receive, handle, lease
        self.outcome, self.cache_key = outcome, cache_key
        self.events = handle.aevents().__aiter__()
        self.checker = state.filters.stream_checker()
        self.closed = False
        state.track(handle, True)

    def error(self, ev: Any) -> BaseException:
        """The exception of an error event (a cancel by shutdown says so)."""
        error = ev.error if ev.error is not None else BackendError("generation failed")
        if isinstance(error, Cancelled) and self.state.stopping.is_set():
            return api.ShuttingDown("the server is shutting down; this answer was cut short: try again")
        return error

    async def next(self) -> Any:
        """The next event, or None when the client disconnected first (the generation is cancelled then)."""
        step = asyncio.ensure_future(self.events.__anext__())
        gone = asyncio.ensure_future(disconnected(self.receive))
        try:
            done, _ = await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if step not in done:
            step.cancel()
            self.close(error=Cancelled("the client disconnected"))
            return None
        ev = step.result()
        if ev.kind == "error":
            raise self.error(ev)
        if ev.kind == "text":
            self.outcome.first_token()
        return ev

    def close(self, *, result: Any = None, error: BaseException | None = None, text: str = "", record: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        self.state.track(self.handle, False)
        if record:
            self.outcome.finish(result=result, error=error)
        if result is not None:
            if self.cache_key is not None and not result.truncations:
                self.state.cache.put(self.cache_key, (text, result), len(text.encode()) + 512)
            self.lease.close()
            return
        self.handle.cancel()  # frees its slot within one decode step
        # The model stays leased until the generation has really stopped: never unloaded under a running step.
        threading.Thread(target=_release_when_done, args=(self.handle, self.lease), daemon=True,
                         name="edgerun-release").start()

    async def whole(self, reply: api.Reply, ev: Any, headers: dict[str, str]) -> Response:
        parts: list[str] = []
        try:
            while ev.kind == "text":
                parts.append(self.checker.feed(ev.text))
                ev = await self.next()
                if ev is None:
                    return Response(status_code=499)
            parts.append(self.checker.finish())
        except BaseException as exc:
            self.close(error=exc)
            raise
        text, result = "".join(parts), ev.result
        self.close(result=result, text=text)
        headers = {**headers, **api.truncated_header(list(result.truncations))}
        return JSONResponse(reply.completion(text, result), headers=headers)

    async def stream(self, reply: api.Reply, ev: Any) -> AsyncIterator[bytes]:
        parts: list[str] = []
        try:
            if reply.chat:
                yield event(reply.chunk("", first=True))
            while ev.kind == "text":
                safe = self.checker.feed(ev.text)
                parts.append(safe)
                for piece in reply.pieces(safe, logprobs=ev.logprobs):
                    yield event(piece)
                ev = await self.events.__anext__()  # Starlette cancels this task when the client disconnects
                if ev.kind == "error":
                    raise self.error(ev)
            rest = self.checker.finish()
            parts.append(rest)
            for piece in reply.pieces(rest, end=True):
                yield event(piece)
            result = ev.result
            yield event(reply.last_chunk(result))
            if self.call.args.include_usage:
                yield event(reply.usage_chunk(result))
            self.close(result=result, text="".join(parts))
            yield DONE
        except EdgerunError as exc:  # headers are sent: the error travels as an event, as OpenAI's streams do
            self.close(error=exc)
            yield event(api.error_body(exc))
            yield DONE
        except BaseException as exc:  # cancelled (the client went away) or a bug: the generation stops
            self.close(error=Cancelled("the client disconnected") if isinstance(exc, asyncio.CancelledError) else exc)
            raise
        finally:
            if not self.closed:  # the response was closed before the end (aclose on disconnect)
                self.close(error=Cancelled("the client disconnected"))

