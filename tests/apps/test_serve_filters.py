"""The content filters through the server: a blocked input is a 400 naming the word; blocked output never reaches
the client (a 400 whole, an error event in a stream), and blocks are counted in /metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.server.config import Filters, Limits, ModelEntry, ServeConfig
from tests.apps.serve_harness import LiveServer

pytestmark = pytest.mark.slow
ENDLESS = ", ".join(str(i) for i in range(1, 41)) + ","  # greedy, the model counts on: "41, 42, ..."
NO_STORE = {"Cache-Control": "no-store"}


@pytest.fixture(scope="module")
def server(smollm, shared_home: Path) -> Iterator[LiveServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGERUN_HOME", str(shared_home))
        cfg = ServeConfig(models=[ModelEntry("default", "default", options={"ctx": 256, "slots": 1})],
                          limits=Limits(result_cache=0), filters=Filters(blocklist=("57",)))
        live = LiveServer(cfg)
        live.wait_ready()
        yield live
        live.stop()


def test_blocked_input_is_400_naming_the_word(server: LiveServer) -> None:
    status, _, body = server.request("POST", "/v1/completions", {"model": "default", "prompt": "say 57 please"})
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "content_filter" and "'57'" in error["message"]
    assert server.metric("edgerun_blocked_total", stage="input", reason="blocklist") == 1


def test_blocked_output_never_reaches_the_client(server: LiveServer) -> None:
    req = {"model": "default", "prompt": ENDLESS, "max_tokens": 90, "temperature": 0}
    status, _, body = server.request("POST", "/v1/completions", req, NO_STORE)
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "content_filter" and "57" not in error["message"]
    status, _, body = server.request("POST", "/v1/completions", {**req, "stream": True}, NO_STORE)
    events = body.decode().split("\n\n")
    assert status == 200 and events[-2:] == ["data: [DONE]", ""]
    assert json.loads(events[-3][6:])["error"]["code"] == "content_filter"
    assert "57" not in "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-3])
    assert server.metric("edgerun_blocked_total", stage="output", reason="blocklist") == 2
    # Without the blocked word the same request streams its text.
    ok = server.request("POST", "/v1/completions", {**req, "max_tokens": 8, "stream": True}, NO_STORE)[2].decode()
    assert " 41" in "".join(json.loads(e[6:])["choices"][0]["text"] for e in ok.split("\n\n")[:-2] if '"choices":[{' in e)
