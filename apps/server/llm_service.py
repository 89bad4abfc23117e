"""The LLM as the HTTP layer sees it: a request in, a handle out whose ``aevents()`` yields text, then done or error.

:class:`EngineService` puts requests on runtime.engine.Engine (continuous batching, priorities, deadlines).
:class:`SingleStream` serves a plain runtime.llm.LLM one request at a time behind a lock, with the same surface,
for a build without the engine. Neither knows anything of HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from runtime.errors import BackendError, BadInput, Cancelled, DeadlineExceeded, EdgerunError, QueueFull, one_line
from runtime.generation import Result, Truncation
from runtime.sampling import SamplingParams

log = logging.getLogger(__name__)


def too_long(tokens: int, limit: int, what: str) -> BadInput:
    return BadInput(f"the {what} is {tokens} tokens; this model's context holds {limit} prompt tokens with room to "
                    "answer: shorten it, or send \"truncate\": true to drop its oldest part")


@dataclass
class Event:
    kind: str  # "text", "done" or "error"
    text: str = ""
    result: Result | None = None
    error: EdgerunError | None = None


class EngineService:
    """Requests onto runtime.engine.Engine."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def params(self, **overrides: Any) -> SamplingParams:
        return self.engine.params(**overrides)

    def submit(self, *, messages: list[dict[str, str]] | None, prompt: str | None, params: SamplingParams,
               priority: Any, deadline: float | None, truncate: bool) -> tuple[Any, list[Truncation]]:
        """(a handle whose ``aevents()`` yields the answer, the truncations already made to fit the prompt)."""
        from runtime.engine import GenRequest

        if messages is not None:
            req = self.engine.chat_request(messages, params, priority=priority, deadline=deadline, truncate=truncate)
            dropped = sum(t.tokens_dropped for t in req.truncations)
            if dropped and not truncate:  # turns were dropped to fit: only when asked
                room = max(1, min(params.max_tokens, self.engine.slot_ctx // 4))
                raise too_long(len(req.prompt) + dropped, self.engine.slot_ctx - room, "conversation")
        else:
            req = GenRequest(self.engine.tokenize(prompt), params, priority=priority, deadline=deadline, truncate=truncate)
        return self.engine.submit(req), list(req.truncations)

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()


class _Handle:
    """Events from a worker thread to whichever asyncio loop reads them (buffered until it starts reading)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Event] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Event] | None = None
        self.cancelled = threading.Event()
        self._final: Event | None = None
        self._finished = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def put(self, ev: Event) -> None:
        if ev.kind != "text":
            self._final = ev
            self._finished.set()
        with self._lock:
            if self._queue is None or self._loop is None:
                self._pending.append(ev)
                return
            loop, queue = self._loop, self._queue
        try:
            loop.call_soon_threadsafe(queue.put_nowait, ev)
        except RuntimeError:  # the loop closed: nobody reads any more
            self.cancel()

    async def aevents(self) -> AsyncIterator[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        with self._lock:
            self._loop, self._queue = asyncio.get_running_loop(), queue
            for ev in self._pending:
                queue.put_nowait(ev)
            self._pending.clear()
        while True:
            ev = await queue.get()
            yield ev
            if ev.kind != "text":
                return


class SingleStream:
    """A runtime.llm.LLM, one generation at a time; at most ``max_queued`` waiting (then QueueFull)."""

    def __init__(self, llm: Any, max_queued: int = 64) -> None:
        self.llm = llm
        self.max_queued = max_queued
        self._lock = threading.Lock()
        self._count = threading.Lock()
        self._waiting = 0
        self._busy = 0
        self._served_s = 1.0  # moving average of one request's service time, for Retry-After

    def params(self, **overrides: Any) -> SamplingParams:
        return self.llm.params(**overrides)

    def stats(self) -> dict[str, Any]:
        return {"slots_busy": self._busy, "n_slots": 1, "queued": self._waiting, "prefix_cache": self.llm.prefix_cache.stats()}

    def submit(self, *, messages: list[dict[str, str]] | None, prompt: str | None, params: SamplingParams,
               priority: Any, deadline: float | None, truncate: bool) -> tuple[_Handle, list[Truncation]]:
        room = max(1, min(params.max_tokens, self.llm.n_ctx // 4))  # what runtime.generation keeps free to answer
        if messages is not None:
            gen = self.llm.chat(messages, params)
            n = len(gen.prompt) + sum(t.tokens_dropped for t in gen.truncations)
            if (gen.truncations or len(gen.prompt) + room > self.llm.n_ctx) and not truncate:
                raise too_long(n, self.llm.n_ctx - room, "conversation")
        else:
            tokens = self.llm.tokenize(prompt)
            if len(tokens) + room > self.llm.n_ctx and not truncate:
                raise too_long(len(tokens), self.llm.n_ctx - room, "prompt")
            gen = self.llm.start(tokens, params)
        with self._count:
            if self._waiting >= self.max_queued:
                raise QueueFull(f"{self._waiting} requests are waiting (the limit); try again later",
                                self._served_s * (self._waiting + 1))
            self._waiting += 1
        handle = _Handle()
        threading.Thread(target=self._run, args=(gen, handle, deadline), daemon=True, name="edgerun-llm").start()
        return handle, list(gen.truncations)

    def _run(self, gen: Any, handle: _Handle, deadline: float | None) -> None:
        timeout = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        got = self._lock.acquire(timeout=timeout)
        with self._count:
            self._waiting -= 1
        if not got:
            handle.put(Event("error", error=DeadlineExceeded("the deadline passed while the request waited")))
            return
        start = time.monotonic()
        self._busy = 1
        try:
            for piece in gen:
                if handle.cancelled.is_set():
                    raise Cancelled("the client went away")
                if deadline is not None and time.monotonic() > deadline:
                    raise DeadlineExceeded("the deadline passed during generation")
                handle.put(Event("text", piece))
            handle.put(Event("done", result=gen.result))
        except EdgerunError as exc:
            handle.put(Event("error", error=exc))
        except Exception as exc:  # a native failure still ends the request, with one line
            log.exception("generation failed")
            handle.put(Event("error", error=BackendError(f"generation failed: {one_line(exc)}")))
        finally:
            self._busy = 0
            self._served_s = 0.8 * self._served_s + 0.2 * (time.monotonic() - start)
            self._lock.release()
