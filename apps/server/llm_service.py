"""The LLM as the HTTP layer sees it: a request in, a handle out whose ``aevents()`` yields text, then done or error.

:class:`EngineService` puts requests on runtime.serving.engine.Engine (continuous batching, priorities, deadlines);
it knows nothing of HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.llm.decoding import Truncation
from runtime.llm.sampling import SamplingParams


class EngineService:
    """Requests onto runtime.serving.engine.Engine."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def params(self, **overrides: Any) -> SamplingParams:
        return self.engine.params(**overrides)

    def submit(self, *, messages: list[dict[str, Any]] | None, prompt: str | None, params: SamplingParams,
               priority: Any, deadline: float | None, truncate: bool, interrupt: Callable[[], None] | None = None,
               tools: list[dict[str, Any]] | None = None) -> tuple[Any, list[Truncation]]:
        """(a handle whose ``aevents()`` yields the answer, the truncations made to fit the prompt: turns dropped
        and the engine's cut).
        QueueFull when the priority class's queue is full; BadInput for a prompt that does not fit (unless
        ``truncate``). ``interrupt``: called between the renderings that fit a conversation; it raises to stop."""
        from runtime.serving.engine import GenRequest

        if messages is not None:
            # the fit is decided once: turns dropped only when asked, else refused before any is (runtime.llm.chat)
            req = self.engine.chat_request(messages, params, interrupt=interrupt, priority=priority, deadline=deadline,
                                           truncate=truncate, tools=tools)
        else:
            req = GenRequest(self.engine.tokenize(prompt), params, priority=priority, deadline=deadline, truncate=truncate)
        handle = self.engine.submit(req)  # refuses a prompt that does not fit unless truncate
        return handle, list(handle.truncations)  # the turns dropped and the engine's cut, known at submit

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()
