"""apps/server/call.py: a generation request is read and checked once, into one frozen Call, before any model is
leased; each refusal keeps its status and message. Hardware-free: a real ServerState whose models are never loaded,
and starlette Requests built from an ASGI scope."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
import time
from typing import Any

import pytest
from starlette.requests import Request

from apps.server import openai_api as api
from apps.server.call import Call, read_call
from apps.server.config import CanaryRoute, Limits, ModelEntry, ServeConfig
from apps.server.reqlog import LOGGER
from apps.server.security import ApiKey
from apps.server.state import ServerState
from runtime.errors import BadInput
from runtime.serving.scheduler import Priority

CAP = 4096  # limits.max_body_bytes of these tests
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def _state(canary_fraction: float | None = None) -> ServerState:
    models = [ModelEntry("chat", "chat", kind="llm"), ModelEntry("chat-next", "chat-next", kind="llm")]
    routes = [] if canary_fraction is None else [CanaryRoute("chat", "chat-next", canary_fraction)]
    return ServerState(ServeConfig(models=models, canary=routes, limits=Limits(max_body_bytes=CAP, deadline_ms=30_000)))


def _request(body: Any, headers: dict[str, str] | None = None) -> Request:
    """A POST as uvicorn hands it to starlette: its body in one message, then the client's going."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    messages = [{"type": "http.request", "body": data, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": raw, "query_string": b"",
             "client": ("127.0.0.1", 50123)}
    return Request(scope, receive)


def _read(request: Request, state: ServerState, key: ApiKey | None = None, chat: bool = True) -> Call:
    return asyncio.run(read_call(request, state, key, chat=chat))


def test_a_chat_request_becomes_one_frozen_call() -> None:
    key = ApiKey(b"\x01" * 32, Priority.INTERACTIVE, "key 1")
    asked = time.monotonic()
    call = _read(_request({**CHAT, "stream": True, "temperature": 0.5, "deadline_ms": 9000},
                          {"X-Priority": "urgent", "X-Deadline-Ms": "5000", "Cache-Control": "private, No-Store"}),
                 _state(), key)
    assert call.id.startswith("chatcmpl-") and call.chat and call.model == "chat" and call.served == "chat"
    assert call.args.messages == [{"role": "user", "content": "hi"}] and call.args.prompt is None
    assert call.args.stream and call.args.sampling == {"temperature": 0.5}
    assert call.priority is Priority.INTERACTIVE  # asked urgent, capped by the key
    assert asked + 5 <= call.deadline <= time.monotonic() + 5  # the header wins over the body's deadline_ms
    assert call.client == "key 1" and call.key is key and call.no_store
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.served = "chat-next"  # type: ignore[misc]


def test_a_completion_without_key_or_headers_takes_the_defaults() -> None:
    asked = time.monotonic()
    call = _read(_request({"model": "chat", "prompt": ["once"], "priority": "batch"}), _state(), chat=False)
    assert call.id.startswith("cmpl-") and not call.chat and call.args.prompt == "once" and call.args.messages is None
    assert call.priority is Priority.BATCH  # the body's field, no key to cap it
    assert asked + 30 <= call.deadline <= time.monotonic() + 30  # limits.deadline_ms
    assert call.client == "127.0.0.1:50123" and call.key is None and not call.no_store


def test_the_canary_router_picks_the_served_entry_once() -> None:
    state = _state(canary_fraction=1.0)
    call = _read(_request(CHAT), state)
    assert (call.model, call.served) == ("chat", "chat-next")


REFUSALS = [  # (body, headers, status, message): each check's own error, in the order they are made
    (b"x" * (CAP + 1), {}, 413, f"the request body is over the limit of {CAP} bytes"),
    (b"{", {}, 400, "the request body is not valid JSON (Expecting property name enclosed in double quotes: "
                    "line 1 column 2 (char 1))"),
    ({"messages": CHAT["messages"]}, {}, 400, "model is missing: name one of GET /v1/models"),
    ({"model": "chat", "messages": []}, {}, 400, "messages must be a non-empty list of {\"role\", \"content\"} objects"),
    # the model is checked before the priority and the deadline: its 404 wins over their 400s
    ({**CHAT, "model": "nope"}, {"X-Priority": "soon", "X-Deadline-Ms": "0"}, 404,
     "model 'nope' is not served here; served: chat, chat-next"),
    ({**CHAT, "model": 7}, {}, 400, "model must be a string, got int"),
    (CHAT, {"X-Priority": "soon", "X-Deadline-Ms": "0"}, 400,
     "X-Priority 'soon' is not valid: use one of urgent, interactive, batch"),
    (CHAT, {"X-Deadline-Ms": "0"}, 400,
     "X-Deadline-Ms must be an integer number of milliseconds from 1 to 86400000, got 0"),
]


@pytest.mark.parametrize("body, headers, status, message", REFUSALS)
def test_each_refusal_keeps_its_status_and_message_and_is_logged_once(
        body: Any, headers: dict[str, str], status: int, message: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER), pytest.raises(BadInput) as err:
        _read(_request(body, headers), _state())
    response = api.error_response(err.value)
    assert response.status_code == status
    assert json.loads(response.body)["error"]["message"] == message
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and lines[0]["id"].startswith("chatcmpl-") and lines[0]["model"] == ""
    assert lines[0]["error"] == type(err.value).__name__ and lines[0]["client"] == "127.0.0.1:50123"


PARSE = ("read_call", "read_body", "parse_json", "route_model", "priority_of", "deadline_of", "client_of")


def test_a_served_request_is_parsed_once_across_the_canary_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """generate() reads the request once, then works on its Call: a canary that fails before answering is retried
    on the stable version without routing, prioritising or reading the request again."""
    from apps.server.generate import generate
    from apps.server.models import Unavailable

    counts: dict[str, int] = {}
    for name in PARSE:  # wrapped in every server module that holds it, so that a second parse anywhere is counted
        for module in [m for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("apps.server.")]:
            original = module.__dict__.get(name)
            if original is None:
                continue
            def counted(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                counts[_name] = counts.get(_name, 0) + 1
                return _original(*args, **kwargs)
            monkeypatch.setattr(module, name, counted)
    state = _state(canary_fraction=1.0)
    state.models.unavailable.update({"chat-next": "the canary's bundle is missing", "chat": "so is the stable one"})
    with pytest.raises(Unavailable, match="so is the stable one"):  # the canary's fault, retried on the stable one
        asyncio.run(generate(_request(CHAT), state, None, chat=True))
    assert counts == dict.fromkeys(PARSE, 1)
