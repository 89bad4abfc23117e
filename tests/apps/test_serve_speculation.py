"""Speculative decoding in `edgerun serve`: the edgerun_spec_* metrics, the serve option that turns it off
(`--no-speculate`, serve.toml `speculate = false`), and a served answer whose draft tokens the metrics count."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apps.cli import main as edgerun
from apps.cli.serve_cmd import add_arguments, build_config
from apps.server.config import ModelEntry, ServeConfig, parse_config
from apps.server.metrics import ServerMetrics
from apps.server.models import spec_of
from runtime.errors import BadInput
from runtime.residency.manager import ModelSpec, ResidencyManager
from tests.apps.serve_harness import LiveServer

NO_STORE = {"Cache-Control": "no-store"}
TEXT = ("The committee met on Tuesday to review the budget for the new library. The budget for the new library was "
        "approved after a long discussion about the cost of books, the cost of staff and the cost of heating.")


def _samples(metrics: ServerMetrics) -> dict[str, dict[tuple, float]]:
    body, _ = metrics.render()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_spec_counters_and_acceptance_ratio_per_model() -> None:
    counts = {"chat": {"drafted": 40, "accepted": 30}, "idle": {"drafted": 0, "accepted": 0}}
    m = ServerMetrics(speculation=lambda: counts, rss=None, temperature=None)
    got = _samples(m)
    assert got["edgerun_spec_drafted_total"] == {(("model", "chat"),): 40.0, (("model", "idle"),): 0.0}
    assert got["edgerun_spec_accepted_total"] == {(("model", "chat"),): 30.0, (("model", "idle"),): 0.0}
    # No drafts yet: no ratio rather than a made-up one.
    assert got["edgerun_spec_acceptance_ratio"] == {(("model", "chat"),): 0.75}
    counts["chat"] = {"drafted": 50, "accepted": 30}  # read at each scrape
    assert _samples(m)["edgerun_spec_acceptance_ratio"] == {(("model", "chat"),): 0.6}


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    args.verbose = False
    return args


def test_speculation_is_on_unless_the_flag_or_the_config_turns_it_off(tmp_path: Path) -> None:
    assert ServeConfig().speculate is True
    assert build_config(_args()).speculate is True
    assert build_config(_args("--no-speculate")).speculate is False
    assert parse_config({"speculate": False}).speculate is False
    toml = tmp_path / "serve.toml"
    toml.write_text("speculate = false\n")
    assert build_config(_args("--config", str(toml))).speculate is False
    entry = ModelEntry("chat", "default")
    assert spec_of(entry, "llm", 2, 8, speculate=False).options["speculate"] is False
    assert spec_of(entry, "llm", 2, 8).options["speculate"] is True
    assert "speculate" not in spec_of(ModelEntry("cls", "x"), "vision", 2, 8).options


def test_a_bad_speculate_value_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "serve.toml"
    path.write_text('speculate = "no"\n')
    assert edgerun(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "speculate" in err and "true or false" in err
    with ResidencyManager(1 << 30) as models, pytest.raises(BadInput, match="speculate='no' must be true or false"):
        models.add(ModelSpec("chat", "default", "llm", options={"speculate": "no"}))


@pytest.mark.slow
def test_the_loaded_engine_follows_the_option(smollm, shared_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGERUN_HOME", str(shared_home))
    with ResidencyManager(1 << 30) as models:
        models.add(spec_of(ModelEntry("chat", "default", options={"ctx": 512}), "llm", 1, 4, speculate=False))
        with models.acquire("chat") as engine:
            assert engine.stats()["speculate"] is False


@pytest.mark.slow
def test_served_answers_are_drafted_and_counted(llm_server: LiveServer) -> None:
    drafted = llm_server.metric("edgerun_spec_drafted_total", model="default") or 0.0
    accepted = llm_server.metric("edgerun_spec_accepted_total", model="default") or 0.0
    body = {"model": "default", "messages": [{"role": "user", "content": f"Repeat this text exactly: {TEXT}"}],
            "max_tokens": 60, "temperature": 0}
    status, _, raw = llm_server.request("POST", "/v1/chat/completions", body, NO_STORE)
    assert status == 200, raw
    usage = json.loads(raw)["usage"]
    assert 0 < usage["completion_tokens"] <= 60  # tokens, not steps: usage is what plain decoding reports
    assert llm_server.metric("edgerun_spec_drafted_total", model="default") > drafted
    assert llm_server.metric("edgerun_spec_accepted_total", model="default") > accepted
    ratio = llm_server.metric("edgerun_spec_acceptance_ratio", model="default")
    assert ratio is not None and 0 < ratio <= 1
