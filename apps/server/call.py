"""One generation request (POST /v1/chat/completions or /v1/completions), checked once into a :class:`Call`.

:func:`read_call` is the only place that reads a generation request's body and headers: everything after it (the
canary retry, the lease, the result cache, the submit, the answer) works on the frozen :class:`Call`, and only the
disconnect watcher still reads the request, through its ASGI receive channel.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from apps.server import openai_api as api
from apps.server.outcome import log_refused
from apps.server.request import client_of, deadline_of, priority_of, route_model
from apps.server.security import ApiKey, read_body
from apps.server.state import ServerState
from runtime.errors import EdgerunError
from runtime.serving.scheduler import Priority


@dataclass(frozen=True)
class Call:
    """A generation request as checked: what it asks (``args``) and how it is served. ``args`` is the parsed body
    itself, not a copy: nothing after :func:`read_call` changes it."""

    id: str  # "chatcmpl-..." or "cmpl-...": the answer's id and its request log line's
    chat: bool  # /v1/chat/completions (``args.messages``), else /v1/completions (``args.prompt``)
    args: api.GenArgs
    served: str  # the model entry picked to answer ``args.model`` (a canary router's pick); a retry may change it
    priority: Priority  # as asked (header, else body), never better than the key allows
    deadline: float  # time.monotonic() by which the answer must be done
    client: str | None  # the key's label, else the peer's host:port, for the request log
    key: ApiKey | None  # None when the server has no API keys
    no_store: bool  # Cache-Control: no-store: the result cache is neither read nor written for it

    @property
    def model(self) -> str:
        """The public model name the client asked for (what its answer and the metrics name)."""
        return self.args.model


async def read_call(request: Request, state: ServerState, key: ApiKey | None, *, chat: bool) -> Call:
    """The request's body and headers checked into a :class:`Call`, in this order: the body's size (413), its JSON
    and fields (400), the model (400 for a bad name, 404 for one not served), X-Priority (400), X-Deadline-Ms (400).
    A refusal is logged (its request log line, no metrics) and raised as it is."""
    limits = state.config.limits
    rid = api.new_id("chatcmpl" if chat else "cmpl")
    client = client_of(request, key)
    try:
        data = api.parse_json(await read_body(request, limits.max_body_bytes))
        args = (api.parse_chat if chat else api.parse_completion)(data, limits.max_tokens)
        served = route_model(state, args.model)
        priority = priority_of(request, args.priority, key)
        deadline = deadline_of(request, args.deadline_ms, limits.deadline_ms)
    except EdgerunError as exc:
        log_refused(rid, exc, client)
        raise
    no_store = "no-store" in request.headers.get("cache-control", "").lower()
    return Call(id=rid, chat=chat, args=args, served=served, priority=priority, deadline=deadline, client=client,
                key=key, no_store=no_store)
