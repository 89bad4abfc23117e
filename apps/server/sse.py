"""Server-sent events as OpenAI streams them: ``data: {json}\\n\\n`` per chunk, ``data: [DONE]\\n\\n`` at the end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import StreamingResponse

DONE = b"data: [DONE]\n\n"


def event(data: Mapping[str, Any]) -> bytes:
    """One SSE event. JSON escapes every newline inside strings, so an event is always one ``data:`` line."""
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


class EventStream(StreamingResponse):
    """A text/event-stream response that proxies do not buffer and clients do not cache."""

    def __init__(self, body: AsyncIterator[bytes], headers: Mapping[str, str] | None = None) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
