"""Canary rollout through the server: a fraction of a model's traffic goes to another version; a broken version
(its llama.cpp backend raises on every decode) is rolled back automatically and no request fails because of it;
the admin endpoint promotes and rolls back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.server.config import CanaryRoute, Limits, ModelEntry, ServeConfig
from apps.server.models import Models
from runtime.errors import BackendError
from runtime.residency.loaders import default_loaders
from runtime.residency.manager import ResidencyManager
from tests.apps.serve_harness import LiveServer

pytestmark = pytest.mark.slow
NO_STORE = {"Cache-Control": "no-store"}
OPTS = {"ctx": 256, "slots": 1}
ADMIN_KEY = "sk-admin-0123456789abcdef"  # the admin endpoint needs a key marked admin


class _BrokenNext:
    """The runtime's LLM loader; the model loaded as "chat-next" gets a backend whose every decode raises."""

    def __init__(self) -> None:
        self.real = default_loaders()["llm"]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def load(self, spec: Any, budget: int) -> Any:
        obj = self.real.load(spec, budget)
        if spec.name == "chat-next":
            def broken(rows: Any) -> list[int]:
                raise BackendError("llama_decode failed (the broken canary)")

            obj.backend.decode = broken
        return obj


@pytest.fixture(scope="module")
def server(smollm, shared_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    keys = tmp_path_factory.mktemp("canary-keys") / "keys.txt"
    keys.write_text(f"{ADMIN_KEY} interactive admin\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGERUN_HOME", str(shared_home))
        entries = [ModelEntry(name, "default", options=OPTS) for name in ("chat", "chat-next", "calm")]
        entries.append(ModelEntry("gone", str(shared_home / "no-such-model.gguf")))  # cannot even be planned
        cfg = ServeConfig(models=entries, limits=Limits(result_cache=0), api_keys_file=keys,
                          canary=[CanaryRoute("chat", "chat-next", 0.5, min_requests=3),
                                  CanaryRoute("calm", "chat", 0.0, min_requests=3),
                                  CanaryRoute("chat-next", "gone", 1.0)])
        loaders = {**default_loaders(), "llm": _BrokenNext()}
        from runtime.llm.plan import default_budget

        live = LiveServer(cfg, models=Models(cfg, ResidencyManager(default_budget(), loaders=loaders)), api_key=ADMIN_KEY)
        live.wait_ready()
        yield live
        live.stop()


def _ask(server: LiveServer, model: str) -> tuple[int, dict[str, str], bytes]:
    return server.request("POST", "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 3,
                                                      "temperature": 0}, NO_STORE)


def test_broken_canary_rolls_back_and_no_request_fails(server: LiveServer) -> None:
    answers = [_ask(server, "chat") for _ in range(16)]
    assert [a[0] for a in answers] == [200] * 16  # the canary's failures were answered by the stable version
    failed = server.metric("edgerun_requests_total", model="chat", status="error")
    assert failed is not None and failed >= 3  # the canary was tried, and counted
    state = json.loads(server.request("GET", "/admin/canary")[2])["chat"]
    assert state["state"] == "rolled_back" and "error rate" in state["reason"]
    tried = failed
    for _ in range(4):
        assert _ask(server, "chat")[0] == 200
    assert server.metric("edgerun_requests_total", model="chat", status="error") == tried  # no traffic to it now


def test_admin_promotes_and_rolls_back(server: LiveServer) -> None:
    def served_by(version: str) -> float:
        return sum(v for k, v in _versions(server, "calm").items() if k.startswith(version + "@"))

    before = served_by("chat")
    assert _ask(server, "calm")[0] == 200 and served_by("chat") == before  # fraction 0: all to the stable
    status, _, body = server.request("POST", "/admin/canary/calm/promote")
    assert status == 200 and json.loads(body)["state"] == "promoted"
    assert _ask(server, "calm")[0] == 200 and served_by("chat") == before + 1
    status, _, body = server.request("POST", "/admin/canary/calm/rollback")
    assert status == 200 and json.loads(body)["state"] == "rolled_back"
    assert _ask(server, "calm")[0] == 200 and served_by("chat") == before + 1
    assert server.request("POST", "/admin/canary/calm/explode")[0] == 400
    assert server.request("POST", "/admin/canary/nope/promote")[0] == 404


def _versions(server: LiveServer, model: str) -> dict[str, float]:
    _, _, body = server.request("GET", "/metrics")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("edgerun_requests_total{") and f'model="{model}"' in line and 'status="ok"' in line:
            version = line.split('version="', 1)[1].split('"', 1)[0]
            out[version] = out.get(version, 0) + float(line.rsplit(" ", 1)[1])
    return out


def test_a_canary_that_cannot_be_planned_is_rolled_back_at_start(server: LiveServer) -> None:
    state = json.loads(server.request("GET", "/admin/canary")[2])["chat-next"]
    assert state["state"] == "rolled_back" and "no-such-model.gguf" in state["reason"]
    status, _, body = _ask(server, "gone")
    assert status == 503 and "could not be planned" in json.loads(body)["error"]["message"]
