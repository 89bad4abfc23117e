"""Conversation memory across voice turns, inside the LLM's bounded context.

Each turn is one :class:`~runtime.serving.engine.GenRequest` at ``Priority.URGENT`` (a voice turn jumps ahead of batch work
on a shared engine), built by :meth:`runtime.serving.engine.Engine.chat_request`: when the conversation no longer fits a
slot the oldest exchanges are dropped, never the system prompt (``n_keep``), and the drop is reported; a context
shift during generation is reported in the result. Dropped exchanges leave the memory here too, so it stays
bounded. An answer cut short by barge-in is remembered as far as it was heard (the sentences whose audio started playing).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.llm.decoding import Truncation
from runtime.serving.engine import Engine, GenHandle
from runtime.serving.scheduler import Priority

log = logging.getLogger(__name__)

SYSTEM_PROMPT = ("You are a helpful voice assistant. Answer in one or two short spoken sentences, "
                 "without lists, markdown or emoji.")
MAX_ANSWER_TOKENS = 96  # about 30 s of speech


@dataclass
class Reply:
    """One turn's answer as it streams: iterate :meth:`pieces` for text, then read ``text`` and ``truncations``."""

    handle: GenHandle
    truncations: list[Truncation] = field(default_factory=list)  # turns dropped to fit (known at once), then shifts
    text: str = ""
    stop_reason: str | None = None

    def pieces(self, timeout: float | None = None) -> Iterator[str]:
        """The answer's text as it is generated; raises the engine's error (Cancelled after :meth:`cancel`)."""
        for event in self.handle.events(timeout):
            if event.kind == "text":
                self.text += event.text
                yield event.text
            elif event.kind == "error":
                assert event.error is not None
                raise event.error
            else:
                assert event.result is not None
                self.stop_reason = event.result.stop_reason
                self.truncations += [t for t in event.result.truncations if t not in self.truncations]

    def cancel(self) -> None:
        self.handle.cancel()


class Conversation:
    """The messages of one voice session; :meth:`ask` starts a turn on ``engine``."""

    def __init__(self, system: str = SYSTEM_PROMPT, max_tokens: int = MAX_ANSWER_TOKENS, **sampling: Any) -> None:
        self.system = system
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.max_tokens, self.sampling = max_tokens, sampling
        self.dropped_messages = 0

    def ask(self, engine: Engine, text: str) -> Reply:
        """Submit ``text`` as the user's next message (URGENT); the reply streams. The exchange is remembered by
        :meth:`remember` once the answer is over (spoken, or cut short)."""
        params = engine.params(max_tokens=self.max_tokens, **self.sampling)
        messages = [*self.messages, {"role": "user", "content": text}]
        req = engine.chat_request(messages, params, priority=Priority.URGENT, truncate=True)
        dropped = sum(t.messages_dropped for t in req.truncations if t.kind == "turns")
        if dropped:  # the engine left the oldest exchanges out: so does the memory (system prompt kept)
            head = 1 if self.system else 0
            self.messages = self.messages[:head] + self.messages[head + dropped :]
            self.dropped_messages += dropped
            log.warning("conversation memory: dropped the %d oldest messages to fit the context", dropped)
        return Reply(engine.submit(req), list(req.truncations))

    def remember(self, user: str, answer: str) -> dict[str, str]:
        """Add the exchange; its assistant message is returned (barge-in revises it to what was heard)."""
        said = {"role": "assistant", "content": answer.strip() or "..."}
        self.messages += [{"role": "user", "content": user}, said]
        return said
