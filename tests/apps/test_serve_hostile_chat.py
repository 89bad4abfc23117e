"""One hostile request must not hold the server: a chat of too many messages, a conversation to fit by dropping
thousands of turns, a deadline that passes while it is fitted, a streaming client that never reads.

Against the real server on loopback with real clients: the official ``openai`` client, and a raw socket with a small
receive buffer that sends a streaming request and never reads a byte of the answer.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import openai
import pytest
from uvicorn.protocols.http.h11_impl import H11Protocol

from apps.server import sse
from apps.server.config import Limits, ModelEntry, ServeConfig
from runtime.llm.chat import MAX_MESSAGES
from tests.apps.serve_harness import LiveServer


def _client(server: LiveServer, timeout: float) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def test_20000_messages_are_refused_at_once(llm_server) -> None:
    # 20,000 empty messages fit in a 580 KB body; fitting them one dropped turn at a time took minutes of a
    # server thread (about 40 such requests filled the pool and hung every endpoint). Sent raw: the openai client
    # itself spends some 10 s preparing 20,000 messages.
    body = {"model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": ""}] * 20_000}
    started = time.monotonic()
    status, _, answer = llm_server.request("POST", "/v1/chat/completions", body, timeout=20)
    assert time.monotonic() - started < 10.0  # a loaded machine; the refusal itself takes milliseconds
    error = json.loads(answer)["error"]
    assert status == 400 and error["message"] == f"messages: 20000 messages; at most {MAX_MESSAGES} are accepted", error
    assert error["param"] == "messages" and error["type"] == "invalid_request_error"
    status, _, _ = llm_server.request("GET", "/v1/models", timeout=10)  # and the server still answers
    assert status == 200


def test_one_message_too_many_is_a_bad_request_for_the_openai_client(llm_server) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        _client(llm_server, 30).chat.completions.create(model="default", max_tokens=4,
                                                        messages=[{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1))
    assert refused.value.body["message"] == f"messages: {MAX_MESSAGES + 1} messages; at most {MAX_MESSAGES} are accepted"
    assert refused.value.body["param"] == "messages"


def test_the_most_messages_are_fitted_in_seconds(llm_server) -> None:
    # 2,048 messages into a 512-token slot: about 2,000 dropped, found with ~20 renderings, not one per drop.
    messages = [{"role": "user", "content": f"note {i}"} for i in range(MAX_MESSAGES)]
    started = time.monotonic()
    reply = _client(llm_server, 30).chat.completions.create(model="default", max_tokens=4, temperature=0,
                                                            messages=messages, extra_body={"truncate": True})
    assert time.monotonic() - started < 30.0  # the old fitting took minutes here (~6 s for 300 messages)
    dropped = reply.usage.model_extra["truncated"]["messages_dropped"]
    assert MAX_MESSAGES - 100 < dropped < MAX_MESSAGES, reply.usage


def test_a_deadline_passed_while_fitting_is_a_504(llm_server) -> None:
    # Rendering 2,048 messages takes far more than the 1 ms allowed: the fitting stops at its next rendering.
    messages = [{"role": "user", "content": f"note {i}"} for i in range(MAX_MESSAGES)]
    status, _, body = llm_server.request("POST", "/v1/chat/completions", {
        "model": "default", "max_tokens": 4, "messages": messages, "truncate": True}, {"X-Deadline-Ms": "1"}, timeout=30)
    error = json.loads(body)["error"]
    assert status == 504 and error["code"] == "deadline_exceeded", (status, error)
    assert "while its conversation was fitted" in error["message"], error


class _SmallBuffers(H11Protocol):
    """The server's side of each connection holds a few KiB (the kernel's send buffer, asyncio's write buffer)
    instead of the megabytes that loopback autotuning allows: a client that stops reading stalls its stream after
    some 20 events, so that a short answer shows what a long one does over a real network."""

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        transport.set_write_buffer_limits(high=4096)
        super().connection_made(transport)


@pytest.fixture
def tight_server(smollm, shared_home, monkeypatch) -> Iterator[LiveServer]:
    """One slot; a send may wait 1 s for the client (the default is 30 s)."""
    monkeypatch.setenv("EDGERUN_HOME", str(shared_home))
    monkeypatch.setattr(sse, "SEND_TIMEOUT_S", 1.0)
    cfg = ServeConfig(slots=1, models=[ModelEntry("default", "default", pinned=True, options={"ctx": 1024})],
                      limits=Limits(max_queued=2))
    server = LiveServer(cfg, http=_SmallBuffers)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _leases(server: LiveServer) -> int:
    return sum(row["leases"] for row in server.state.models.resident())


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_stream_that_is_never_read_releases_its_model(tight_server) -> None:
    cancelled = tight_server.metric("edgerun_requests_total", model="default", status="cancelled") or 0
    body = json.dumps({"model": "default", "stream": True, "max_tokens": 600, "temperature": 0, "messages": [
        {"role": "user", "content": "Write a long story about a lighthouse keeper and the ships she saw."}]}).encode()
    stuck = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window it offers
        stuck.settimeout(30)
        stuck.connect(("127.0.0.1", tight_server.port))
        stuck.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        _wait(lambda: _leases(tight_server) == 1, 30, "the streaming request never leased its model")
        # Never read: the buffers fill within some 20 tokens, a send waits 1 s, the stream ends, the lease goes.
        _wait(lambda: _leases(tight_server) == 0, 30, "a client that never reads still holds the model's lease")
        _wait(lambda: (tight_server.metric("edgerun_requests_total", model="default", status="cancelled") or 0)
              > cancelled, 10, "the stalled stream was not recorded as cancelled")
        reply = _client(tight_server, 60).chat.completions.create(  # the one slot serves the next request
            model="default", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].finish_reason in ("stop", "length")
        received = b""  # what was buffered reaches the client, then the connection closes without the end
        while chunk := stuck.recv(65536):
            received += chunk
        assert received.startswith(b"HTTP/1.1 200") and b"data: {" in received and b"[DONE]" not in received
    finally:
        stuck.close()
