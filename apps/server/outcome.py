"""How one request ended, recorded once: its metrics, its JSON log line, and its canary outcome."""

from __future__ import annotations

import time
from typing import Any

from apps.server.openai_api import status_of
from apps.server.reqlog import RequestRecord, log_request
from runtime.errors import Cancelled, DeadlineExceeded, QueueFull


def status_word(error: BaseException | None) -> str:
    if error is None:
        return "ok"
    if getattr(error, "stage", None) is not None and getattr(error, "reason", None) is not None:
        return "blocked"
    if isinstance(error, QueueFull):
        return "rejected"
    if isinstance(error, DeadlineExceeded):
        return "timeout"
    if isinstance(error, Cancelled):
        return "cancelled"
    return "error"


class Outcome:
    def __init__(self, state: Any, rid: str, model: str, served: str, priority: Any, *, stream: bool = False,
                 client: str | None = None) -> None:
        self.state, self.rid, self.model, self.served = state, rid, model, served
        self.priority, self.stream, self.client = priority, stream, client
        self.version = served
        self.start = time.monotonic()
        self.first_at: float | None = None
        self.cache: str | None = None
        self._done = False

    def first_token(self) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def failed_attempt(self, error: BaseException) -> None:
        """The version tried first failed before answering: counted (metrics, its canary window) before another
        version answers the same request."""
        total = self.elapsed()
        self.state.metrics.observe_request(model=self.model, version=self.version, priority=self.priority,
                                           status=status_word(error), total_s=total)
        router = self.state.canaries.get(self.model)
        if router is not None:
            router.record(self.served, False, total)

    def finish(self, *, result: Any = None, error: BaseException | None = None, version_fault: bool | None = None) -> None:
        """Record the end once. ``version_fault``: whether the error counts against the version that served it
        (None: a server-side error or a timeout does, a refusal of the request itself does not)."""
        if self._done:
            return
        self._done = True
        total = time.monotonic() - self.start
        status = status_word(error)
        ttft = None if self.first_at is None else self.first_at - self.start
        tokens_in = getattr(result, "tokens_in", 0) if result is not None else 0
        tokens_out = getattr(result, "tokens_out", 0) if result is not None else 0
        truncated = sum(t.tokens_dropped for t in getattr(result, "truncations", ()) or ())
        m = self.state.metrics
        m.observe_request(model=self.model, version=self.version, priority=self.priority, status=status, total_s=total,
                          ttft_s=ttft, prompt_tokens=tokens_in, completion_tokens=tokens_out)
        if status == "blocked":
            m.count_blocked(error.stage, str(error.reason))  # type: ignore[union-attr]
        log_request(RequestRecord(
            id=self.rid, model=self.model, version=self.version, priority=self.priority, status=status,
            prompt_tokens=tokens_in, completion_tokens=tokens_out, ttft_ms=None if ttft is None else ttft * 1000,
            total_ms=total * 1000, cache=self.cache, truncated=truncated, client=self.client,
            error=None if error is None else (str(getattr(error, "reason", "")) or type(error).__name__),
            stream=self.stream))
        router = self.state.canaries.get(self.model)
        if router is not None and status != "cancelled":
            if version_fault is None:  # a client's own mistake (a 4xx) says nothing about the version that served it
                version_fault = error is not None and status_of(error)[0] >= 500
            if error is None or version_fault:
                router.record(self.served, error is None, total)


def log_refused(rid: str, error: BaseException, client: str | None, *, stream: bool = False) -> None:
    """The log line of a request refused before it named a served model (a bad body, key or name): no metrics,
    whose labels only ever hold the names of served models."""
    log_request(RequestRecord(id=rid, model="", version="", priority="", status=status_word(error), client=client,
                              error=type(error).__name__, stream=stream))
