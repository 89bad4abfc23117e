"""Shutdown with answers in flight: each ends as the API says (a whole answer a 503 JSON error, a stream an error
event and [DONE]) before uvicorn's grace runs out, never a bare 500 or a stream cut mid-way."""

from __future__ import annotations

import json
import logging
import socket
import threading
from pathlib import Path

import pytest

from apps.server.config import Limits, ModelEntry, ServeConfig
from tests.apps.serve_harness import LiveServer

pytestmark = pytest.mark.slow
ENDLESS = ", ".join(str(i) for i in range(1, 41)) + ","  # greedy, the model counts on for as long as it may


def test_answers_in_flight_end_cleanly_at_shutdown(smollm, shared_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("EDGERUN_HOME", str(shared_home))
    cfg = ServeConfig(slots=2, models=[ModelEntry("default", "default", options={"ctx": 512})],
                      limits=Limits(result_cache=0))
    server = LiveServer(cfg)
    server.wait_ready()
    req = {"model": "default", "prompt": ENDLESS, "max_tokens": 4000, "temperature": 0}
    whole: dict[str, tuple] = {}
    asker = threading.Thread(target=lambda: whole.update(answer=server.request("POST", "/v1/completions", req, timeout=60)))
    asker.start()
    body = json.dumps({**req, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while got.count(b"data: ") < 3:  # streaming, and (2 slots) the whole answer is being generated too
            piece = sock.recv(65536)
            assert piece, got
            got += piece
        server.stop()  # 4000 tokens would take minutes: both are still running
        while chunk := sock.recv(65536):
            got += chunk
    asker.join(30)
    events = [e.strip().split(b"\r\n")[-1] for e in got.split(b"\n\n") if b"data: " in e]
    assert events[-1] == b"data: [DONE]", got[-400:]
    assert json.loads(events[-2][6:])["error"]["code"] == "shutting_down"
    status, headers, answer = whole["answer"]
    assert status == 503 and json.loads(answer)["error"]["code"] == "shutting_down", answer[:300]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
