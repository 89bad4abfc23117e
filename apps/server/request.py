"""What every API request carries besides its body: the model it routes to, its priority, its deadline,
and whether its client is still there."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.types import Receive

from apps.server.openai_api import UnknownModel, check_deadline_ms
from apps.server.security import ApiKey, check_model_name
from apps.server.state import ServerState
from runtime.errors import BadInput
from runtime.serving.scheduler import Priority


def route_model(state: ServerState, name: object) -> str:
    """The model entry that serves the public ``name``: checked as a name before any lookup (400), unknown (404),
    or split by its canary router."""
    try:
        name = check_model_name(name)
        if state.config.model(name) is None:
            served = ", ".join(m.name for m in state.config.models)
            raise UnknownModel(f"model {name!r} is not served here; served: {served}")
    except BadInput as exc:
        exc.param = "model"  # type: ignore[attr-defined]  # OpenAI's error names the field
        raise
    router = state.canaries.get(name)
    return router.pick() if router is not None else name


def priority_of(request: Request, body_value: str | None, key: ApiKey | None) -> Priority:
    """Header X-Priority, else the body's "priority", else interactive; never better than the key allows."""
    header = request.headers.get("x-priority")
    text, where = (header, "X-Priority") if header else (body_value, "priority")
    try:
        asked = Priority.parse(text) if text else Priority.INTERACTIVE
    except BadInput:  # the value shown shortened, so what is valid always fits the one-line error
        valid = ", ".join(p.name.lower() for p in Priority)
        raise BadInput(f"{where} {text[:40]!r} is not valid: use one of {valid}") from None
    best = key.max_priority if key is not None else Priority.URGENT
    return Priority(max(asked, best))  # a larger value is a lower class


def deadline_of(request: Request, body_ms: int | None, default_ms: int) -> float:
    """The monotonic time by which the answer must be done: header X-Deadline-Ms, else the body's deadline_ms,
    else the server's default."""
    header = request.headers.get("x-deadline-ms")
    ms = check_deadline_ms(header, "X-Deadline-Ms") if header is not None else body_ms or default_ms
    return time.monotonic() + ms / 1000


def client_of(request: Request, key: ApiKey | None) -> str | None:
    """Who asked, for the request log: the API key's label, else the peer's address."""
    if key is not None:
        return key.label
    return f"{request.client.host}:{request.client.port}" if request.client else None


async def disconnected(receive: Receive) -> None:
    """Returns when the client disconnects; ``receive``: the request's ASGI receive channel (``request.receive``),
    once its body has been read."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
