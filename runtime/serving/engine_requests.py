"""What goes into the continuous-batching engine and what comes out: :class:`GenRequest`, :class:`Event`,
:class:`EngineResult` and :class:`GenHandle`, the caller's side of one request (runtime/serving/engine.py).

A handle is thread-safe: the engine thread pushes events, any thread (or an asyncio loop) reads them.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime.errors import EdgerunError
from runtime.llm.decoding import Result, TokenLogprob, Truncation
from runtime.llm.sampling import SamplingParams
from runtime.serving.scheduler import Job, Priority


@dataclass
class GenRequest:
    """One generation: prompt tokens (``Engine.tokenize`` / ``Engine.chat_prompt``) and how to sample them.

    A prompt that does not fit a slot (with room for the answer) is refused with BadInput naming its token
    count and the slot's limit, unless ``truncate``: then its middle is dropped (the first ``n_keep`` tokens
    kept) and a :class:`Truncation` reported. ``deadline`` is a ``time.monotonic()`` time."""

    prompt: list[int]
    params: SamplingParams | None = None  # None: the model's defaults
    priority: Priority = Priority.INTERACTIVE
    deadline: float | None = None
    n_keep: int | None = None  # None: the BOS token, when there is one
    truncate: bool = False
    truncations: list[Truncation] = field(default_factory=list)  # already made (chat turns dropped), reported too
    preemptible: bool = True
    speculate: bool = True  # draft and verify (where the engine speculates); False: plain decoding for this request


@dataclass
class EngineResult(Result):
    """:class:`runtime.llm.generation.Result` plus what the engine adds. ``ttft_ms`` counts from submit (queue included)."""

    queue_ms: float = 0.0  # from submit to the first admission into a slot
    preemptions: int = 0  # times the request gave its slot to an urgent one and was resumed
    # speculative decoding for this request (runtime.llm.speculative.SpecStats.to_dict: drafter, enabled, on, steps,
    # drafted, accepted, acceptance, mean_draft); declared here too so the engine's result has it in any case
    speculation: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    kind: Literal["text", "done", "error"]
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the log probabilities of this text's tokens, if asked
    result: EngineResult | None = None
    error: EdgerunError | None = None


class GenHandle:
    """The caller's side of one request: its events, its result, and cancel()."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.truncations: list[Truncation] = []  # what was cut to fit the slot, known at submit (shifts: in the result)
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._async: tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event]] | None = None
        self._ended = False  # a done or error event was pushed
        self._final: Event | None = None

    @property
    def finished(self) -> bool:
        return self._ended

    def cancel(self) -> None:
        """Stop the request: taken out of the queue, or out of its slot within one decode step (error Cancelled)."""
        self.job.cancel()

    def _push(self, event: Event) -> bool:
        """Deliver ``event`` (engine side); False once the request has ended (a later event is dropped)."""
        with self._lock:
            if self._ended:
                return False
            if event.kind != "text":
                self._ended, self._final = True, event
            if self._async is not None:
                loop, aq = self._async
                try:
                    loop.call_soon_threadsafe(aq.put_nowait, event)
                except RuntimeError:  # the reader's loop is closed: nobody is listening any more
                    pass
            else:
                self._queue.put(event)
            return True

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Events as they come, ending after ``done`` or ``error``; TimeoutError when one takes longer than
        ``timeout`` seconds. Leaving the loop early (break, an exception) cancels the request."""
        try:
            while True:
                try:
                    event = self._queue.get(timeout=timeout)
                except queue.Empty:
                    raise TimeoutError(f"no event from the engine within {timeout} s") from None
                yield event
                if event.kind != "text":
                    return
        finally:
            if not self._ended:
                self.cancel()

    async def aevents(self) -> AsyncIterator[Event]:
        """:meth:`events` for asyncio: the engine thread hands each event to this loop. Leaving early (a client
        that disconnected, a cancelled task) cancels the request."""
        loop = asyncio.get_running_loop()
        aq: asyncio.Queue[Event] = asyncio.Queue()
        with self._lock:
            if self._async is not None:
                raise RuntimeError("this request's events are already being read")
            self._async = (loop, aq)
            while True:
                try:
                    aq.put_nowait(self._queue.get_nowait())
                except queue.Empty:
                    break
        try:
            while True:
                event = await aq.get()
                yield event
                if event.kind != "text":
                    return
        finally:
            if not self._ended:
                self.cancel()

    def result(self, timeout: float | None = None) -> EngineResult:
        """Wait for the whole answer; raises the request's error (QueueFull is raised by submit already)."""
        for event in self.events(timeout):
            if event.kind == "error":
                assert event.error is not None
                raise event.error
            if event.kind == "done":
                assert event.result is not None
                return event.result
        raise AssertionError("the event stream ended without done or error")  # pragma: no cover
