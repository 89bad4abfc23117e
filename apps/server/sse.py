"""Server-sent events as OpenAI streams them: ``data: {json}\\n\\n`` per chunk, ``data: [DONE]\\n\\n`` at the end.

A stream whose client stops reading fills the socket's buffers, and then a send waits for room that may never come:
every send has a deadline (:data:`SEND_TIMEOUT_S`), past which the stream ends and what it holds is released.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Message, Send

from runtime.errors import Cancelled

log = logging.getLogger(__name__)
DONE = b"data: [DONE]\n\n"
SEND_TIMEOUT_S = 30.0  # seconds one event may wait for the client to make room; a reading client takes far less


class ClientStalled(Cancelled):
    """The client read nothing of its stream within the send deadline: the stream was ended (HTTP 499)."""


def event(data: Mapping[str, Any]) -> bytes:
    """One SSE event. JSON escapes every newline inside strings, so an event is always one ``data:`` line."""
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


class EventStream(StreamingResponse):
    """A text/event-stream response that proxies do not buffer and clients do not cache.

    A send that cannot complete within :data:`SEND_TIMEOUT_S` ends the stream: ``on_stall`` is told first (with
    a :class:`ClientStalled`), then ``body`` is closed, so that its ``finally`` releases what it holds; the
    connection is closed without the stream's end (no ``[DONE]``).
    """

    def __init__(self, body: AsyncGenerator[bytes, None], headers: Mapping[str, str] | None = None, *,
                 on_stall: Callable[[ClientStalled], None] | None = None) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self._body = body
        self.on_stall = on_stall
        self.send_timeout_s = SEND_TIMEOUT_S  # read when the response is made, so a test can shorten it

    async def stream_response(self, send: Send) -> None:
        timeout = self.send_timeout_s

        async def bounded(message: Message) -> None:
            try:
                async with asyncio.timeout(timeout):
                    await send(message)
            except TimeoutError:
                raise ClientStalled(f"the client read nothing of its stream for {timeout:g} s: the stream was ended") from None

        try:
            await super().stream_response(bounded)
        except ClientStalled as stalled:
            log.warning("%s", stalled)
            if self.on_stall is not None:
                self.on_stall(stalled)
            await self._body.aclose()
