"""Structured request logs: one JSON object per line per finished request, on the logger ``edgerun.requests``.

A record holds what an operator needs to find a slow or failed request (who, which model and version, how it
ended, token counts, timings, cache use, truncation) and nothing of what the client said: there is no field for
prompt or output text, and ``error`` is a short code (an exception's class name, a filter's reason), never a
message, because messages may quote the input. Where the lines go is the application's choice
(:func:`handler` writes bare lines to a stream).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import IO, Any

LOGGER = "edgerun.requests"
log = logging.getLogger(LOGGER)


@dataclass(frozen=True)
class RequestRecord:
    id: str
    model: str
    version: str
    priority: str  # urgent | interactive | batch
    status: str  # ok | error | blocked | rejected | timeout | cancelled (or an HTTP status)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = None  # None: no token was produced
    total_ms: float = 0.0
    cache: str | None = None  # result cache: "hit", "miss", "skip" (no-store or not deterministic); None: not asked
    truncated: int = 0  # prompt tokens dropped to fit the context
    client: str | None = None  # "host:port" of the peer, or the API key's name
    error: str | None = None  # a code (exception class name, filter reason), never a message
    stream: bool = False
    ts: float = field(default_factory=time.time)  # when the request ended, Unix seconds

    def to_json(self) -> str:
        """One line of JSON: non-ASCII and control characters escaped, so a value can never break the line."""
        return json.dumps(_clean(asdict(self)), separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if key in ("priority", "status"):
            name = getattr(value, "name", None)
            value = name.lower() if isinstance(name, str) else str(value)
        elif isinstance(value, float) and key != "ts":
            value = None if not math.isfinite(value) else round(value, 3)
        out[key] = value
    return out


def log_request(record: RequestRecord | None = None, /, **fields: Any) -> str:
    """Log one request (a RequestRecord, or its fields as keywords) at INFO; returns the line. An unknown field
    (``prompt=...``) is a TypeError: nothing outside the record's fields can reach the log."""
    if record is None:
        record = RequestRecord(**fields)
    elif fields:
        raise TypeError("give a RequestRecord or keyword fields, not both")
    line = record.to_json()
    log.info("%s", line)
    return line


def handler(stream: IO[str]) -> logging.Handler:
    """A handler writing each request line as is (no level or time prefix: the record carries what it needs)."""
    h = logging.StreamHandler(stream)
    h.setFormatter(logging.Formatter("%(message)s"))
    return h
