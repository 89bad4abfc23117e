"""One streamed request (SSE, OpenAI framing) and what came of it, timed with ``time.monotonic``.

TTFT is the time from sending the request to the first chunk that carries text. The token
count is the server's ``usage.completion_tokens`` when it sends it (``stream_options.
include_usage``), else the number of text-bearing chunks. Outcomes: ``ok``; ``rejected``
(429, with its Retry-After); ``timeout`` (504, or an error event whose code says deadline);
``disconnected`` (this client hung up on purpose, to test cancellation); ``error`` (any
other status, a broken stream, a connection failure or this client's own time limit).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from apps.loadtest.target import API_PATHS
from apps.loadtest.workload import Prompt

OUTCOMES = ("ok", "rejected", "timeout", "disconnected", "error")
MAX_EVENT_BYTES = 1 << 20  # one SSE line; a server streaming more is broken
TIMEOUT_CODES = ("timeout", "deadline", "deadline_exceeded", "request_timeout")


@dataclass
class Outcome:
    status: str  # one of OUTCOMES
    priority: str
    started: float  # monotonic seconds
    total_s: float = 0.0
    ttft_s: float | None = None
    tokens: int = 0
    http_status: int | None = None
    error: str = ""
    retry_after: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def decode_tps(self) -> float | None:
        """This stream's own decode rate: tokens after the first, over the time after the first."""
        if self.ttft_s is None or self.tokens < 2 or self.total_s <= self.ttft_s:
            return None
        return (self.tokens - 1) / (self.total_s - self.ttft_s)


def request_body(api: str, prompt: Prompt, model: str, max_tokens: int, temperature: float) -> dict:
    body: dict = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
                  "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = prompt.chat()
    else:
        body["prompt"] = prompt.completion()
    return body


def request_headers(priority: str, *, api_key: str | None = None, use_cache: bool = False,
                    deadline_ms: int | None = None) -> dict[str, str]:
    headers = {"X-Priority": priority, "Accept": "text/event-stream"}
    if deadline_ms is not None:  # edgerun's per-request deadline: 504 when it passes
        headers["X-Deadline-Ms"] = str(deadline_ms)
    if not use_cache:  # a load test measures serving, not the result cache
        headers["Cache-Control"] = "no-store"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_of(payload: object) -> tuple[str, str]:
    """(outcome, message) for an OpenAI error object ``{"error": {...}}`` met in a stream or a body."""
    err = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(err, dict):
        return "error", _line(str(err if err is not None else payload))
    code = str(err.get("code") or "") + " " + str(err.get("type") or "")
    outcome = "timeout" if any(c in code.lower() for c in TIMEOUT_CODES) else "error"
    return outcome, _line(str(err.get("message") or code.strip() or "error"))


def _text_of(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    first = choices[0]
    delta = first.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") or ""
    return first.get("text") or ""


async def stream_one(client: httpx.AsyncClient, base: str, api: str, body: dict, headers: dict[str, str],
                     *, priority: str, timeout_s: float, hang_up_after: int | None = None) -> Outcome:
    """Send one streamed request; never raises for what the server or the network does.

    ``hang_up_after``: close the connection after that many text chunks (a client that goes away).
    """
    out = Outcome(status="error", priority=priority, started=time.monotonic())
    chunks = 0
    try:
        async with client.stream("POST", base + API_PATHS[api], json=body, headers=headers,
                                 timeout=httpx.Timeout(timeout_s)) as resp:
            out.http_status = resp.status_code
            out.headers = {k: v for k, v in resp.headers.items() if k.lower().startswith("x-edgerun")}
            if resp.status_code != 200:
                raw = await resp.aread()
                out.retry_after = resp.headers.get("retry-after")
                try:
                    _, out.error = _error_of(json.loads(raw[:MAX_EVENT_BYTES]))
                except ValueError:
                    out.error = _line(raw[:200].decode("utf-8", "replace"))
                out.status = {429: "rejected", 504: "timeout"}.get(resp.status_code, "error")
                return out
            done = False
            async for line in resp.aiter_lines():
                if len(line) > MAX_EVENT_BYTES:
                    out.error = f"an SSE line of {len(line)} characters"
                    return out
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    out.error = f"an SSE event that is not JSON: {_line(data, 80)!r}"
                    return out
                if not isinstance(chunk, dict):
                    continue
                if "error" in chunk:
                    out.status, out.error = _error_of(chunk)
                    return out
                usage = chunk.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    out.tokens = usage["completion_tokens"]
                if _text_of(chunk):
                    chunks += 1
                    if out.ttft_s is None:
                        out.ttft_s = time.monotonic() - out.started
                    if hang_up_after is not None and chunks >= hang_up_after:
                        out.status = "disconnected"
                        out.tokens = max(out.tokens, chunks)
                        return out  # leaving the block closes the connection
            if not done:
                out.error = "the stream ended without data: [DONE]"
                return out
            out.tokens = out.tokens or chunks
            out.status = "ok"
            return out
    except httpx.TimeoutException:
        out.error = f"no answer within this client's {timeout_s:g} s limit"
        return out
    except httpx.HTTPError as exc:
        out.error = _line(f"{type(exc).__name__}: {exc}")
        return out
    finally:
        out.total_s = time.monotonic() - out.started
