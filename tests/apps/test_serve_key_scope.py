"""What one API key's caller may learn of the server and of other keys: /readyz without a key says only the status
(a start-up error may name files and folders), and the result cache never answers one key with another's request."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.server.config import Limits, ModelEntry, ServeConfig
from tests.apps.serve_harness import LiveServer

KEY_A = "sk-scope-a-0123456789abcdef"
KEY_B = "sk-scope-b-0123456789abcdef"


def _keys(folder: Path) -> Path:
    path = folder / "keys.txt"
    path.write_text(f"{KEY_A}\n{KEY_B}\n")
    return path


def _readyz(server: LiveServer, key: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    status, _, body = server.request("GET", "/readyz", headers=headers)
    return status, json.loads(body)


def test_readyz_without_a_key_hides_the_start_up_error(tmp_path: Path) -> None:
    missing = tmp_path / "secret-folder" / "model.gguf"
    cfg = ServeConfig(api_keys_file=_keys(tmp_path), models=[ModelEntry("chat", str(missing), kind="llm")])
    server = LiveServer(cfg)  # start-up fails in the background: the model file is not there
    try:
        deadline = time.monotonic() + 60
        while server.state.failed is None:
            assert time.monotonic() < deadline, "start-up did not fail"
            time.sleep(0.05)
        status, body = _readyz(server, None)
        assert status == 503 and body["error"]["code"] == "not_ready", body
        assert "secret-folder" not in json.dumps(body) and "start-up failed" in body["error"]["message"]
        status, body = _readyz(server, "sk-wrong-0123456789abcdef")
        assert status == 503 and "secret-folder" not in json.dumps(body)
        status, body = _readyz(server, KEY_A)  # a key holder gets the reason
        assert status == 503 and "secret-folder" in body["error"]["message"], body
    finally:
        server.stop()


def test_readyz_without_a_key_is_the_status_alone(tmp_path: Path) -> None:
    server = LiveServer(ServeConfig(api_keys_file=_keys(tmp_path)), load=False)
    server.state.ready.set()
    try:
        assert _readyz(server, None) == (200, {"status": "ready"})
        status, body = _readyz(server, KEY_B)
        assert status == 200 and body["status"] == "ready" and "models" in body
    finally:
        server.stop()


@pytest.fixture(scope="module")
def keyed_llm(smollm, shared_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with pytest.MonkeyPatch.context() as mp:  # the server thread resolves models in the session's store
        mp.setenv("EDGERUN_HOME", str(shared_home))
        cfg = ServeConfig(slots=1, api_keys_file=_keys(tmp_path_factory.mktemp("scope-keys")),
                          models=[ModelEntry("default", "default", pinned=True, options={"ctx": 256})],
                          limits=Limits(result_cache=1 << 20))
        server = LiveServer(cfg)
        server.wait_ready()
        yield server
        server.stop()


@pytest.mark.slow
def test_the_result_cache_never_answers_one_key_with_anothers_request(keyed_llm: LiveServer) -> None:
    req = {"model": "default", "prompt": "The capital of Italy is", "max_tokens": 4, "temperature": 0}

    def ask(key: str) -> tuple[str | None, dict]:
        status, headers, body = keyed_llm.request("POST", "/v1/completions", req, {"Authorization": f"Bearer {key}"})
        assert status == 200, body
        return headers.get("x-edgerun-cache"), json.loads(body)

    first = ask(KEY_A)
    assert first[0] is None
    other = ask(KEY_B)  # the same request from another key: generated for it, not a hit on key A's entry
    assert other[0] is None and other[1]["choices"][0]["text"] == first[1]["choices"][0]["text"]  # greedy: same text
    assert ask(KEY_A)[0] == "hit" and ask(KEY_B)[0] == "hit"  # each key's own entry
