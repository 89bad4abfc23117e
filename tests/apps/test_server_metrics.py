"""apps.server.metrics and apps.server.reqlog: the Prometheus text the server exposes and its request log lines."""

from __future__ import annotations

import io
import json
import logging
from functools import partial
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apps.server import reqlog
from apps.server.metrics import REQUEST_BUCKETS, TTFT_BUCKETS, ServerMetrics, device_temperature_c
from runtime.metrics import rss_bytes

FIXTURES = Path(__file__).resolve().parents[1] / "devices" / "fixtures"


def scrape(metrics: ServerMetrics) -> dict[str, list]:
    """The rendered text parsed back by prometheus-client's own parser: {family name: [samples]}."""
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    return {family.name: family.samples for family in text_string_to_metric_families(body.decode())}


def values(samples: list, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for s in samples if s.name == name}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_request_histograms_and_counters_carry_the_listed_labels() -> None:
    m = ServerMetrics(rss=None, temperature=None)
    m.observe_request(model="smol", version="2", priority="interactive", status="ok", total_s=0.8, ttft_s=0.12,
                      prompt_tokens=30, completion_tokens=12)
    m.observe_request(model="smol", version="3", priority="batch", status="error", total_s=0.05)  # no token came
    m.count_blocked("output", "blocklist")
    got = scrape(m)
    ttft = values(got["edgerun_ttft_seconds"], "edgerun_ttft_seconds_count")
    assert ttft == {(("model", "smol"), ("priority", "interactive"), ("version", "2")): 1.0}  # the error had no TTFT
    total = values(got["edgerun_request_seconds"], "edgerun_request_seconds_count")
    assert total == {(("model", "smol"), ("priority", "interactive"), ("status", "ok"), ("version", "2")): 1.0,
                     (("model", "smol"), ("priority", "batch"), ("status", "error"), ("version", "3")): 1.0}
    assert values(got["edgerun_tokens"], "edgerun_tokens_total") == {
        (("kind", "prompt"), ("model", "smol")): 30.0, (("kind", "completion"), ("model", "smol")): 12.0}
    assert values(got["edgerun_requests"], "edgerun_requests_total") == {
        (("model", "smol"), ("status", "ok"), ("version", "2")): 1.0, (("model", "smol"), ("status", "error"), ("version", "3")): 1.0}
    assert values(got["edgerun_blocked"], "edgerun_blocked_total") == {(("reason", "blocklist"), ("stage", "output")): 1.0}


def test_priority_enums_become_their_lower_case_names() -> None:
    import enum

    class Priority(enum.IntEnum):  # what runtime.serving.scheduler.Priority is: an IntEnum, str() would give "1"
        URGENT = 0
        INTERACTIVE = 1

    m = ServerMetrics(rss=None, temperature=None, queue_depth=lambda: {"smol": {Priority.URGENT: 2}})
    m.observe_request(model="smol", version="1", priority=Priority.URGENT, status="ok", total_s=0.1, ttft_s=0.01)
    got = scrape(m)
    assert ("priority", "urgent") in next(iter(values(got["edgerun_ttft_seconds"], "edgerun_ttft_seconds_count")))
    assert values(got["edgerun_queue_depth"], "edgerun_queue_depth") == {(("model", "smol"), ("priority", "urgent")): 2.0}


def test_ttft_buckets_span_milliseconds_to_tens_of_seconds() -> None:
    # A result-cache hit (<= 5 ms) lands in the first bucket, a long prefill on a Pi (30 s) below the last.
    assert TTFT_BUCKETS[0] <= 0.005 and TTFT_BUCKETS[-1] >= 30
    assert list(TTFT_BUCKETS) == sorted(TTFT_BUCKETS)
    # Between them no bucket is more than 2.5x the one before: p95 stays readable at every scale.
    assert all(b / a <= 2.5 for a, b in zip(TTFT_BUCKETS, TTFT_BUCKETS[1:], strict=False))
    assert REQUEST_BUCKETS[-1] >= 120
    m = ServerMetrics(rss=None, temperature=None)
    for seconds in (0.004, 0.3, 12.0):
        m.observe_request(model="m", version="1", priority="urgent", status="ok", total_s=seconds, ttft_s=seconds)
    buckets = {s.labels["le"]: s.value for s in scrape(m)["edgerun_ttft_seconds"] if s.name == "edgerun_ttft_seconds_bucket"}
    assert buckets["0.005"] == 1 and buckets["0.5"] == 2 and buckets["10.0"] == 2 and buckets["20.0"] == 3


def test_gauges_read_the_sources_at_each_scrape() -> None:
    state = {"busy": 1, "resident": [{"name": "smol", "version": "2", "kind": "llm", "planned_bytes": 150_000_000, "pinned": True}]}
    m = ServerMetrics(slots_busy=lambda: {"smol": state["busy"]}, resident=lambda: state["resident"],
                      queue_depth=lambda: {"smol": {"interactive": 4, "batch": 0}}, rss=lambda: 123_456_789,
                      temperature=lambda: 51.35, caches=lambda: {"prefix": {"hits": 7, "misses": 3}})
    m.count_cache("result", hit=True)
    m.count_cache("result", hit=False, n=2)
    got = scrape(m)
    assert values(got["edgerun_slots_busy"], "edgerun_slots_busy") == {(("model", "smol"),): 1.0}
    assert values(got["edgerun_resident_models"], "edgerun_resident_models") == {(): 1.0}
    assert values(got["edgerun_model_planned_bytes"], "edgerun_model_planned_bytes") == {
        (("kind", "llm"), ("model", "smol"), ("version", "2")): 150_000_000.0}
    assert values(got["edgerun_queue_depth"], "edgerun_queue_depth")[(("model", "smol"), ("priority", "interactive"))] == 4
    assert values(got["edgerun_process_rss_bytes"], "edgerun_process_rss_bytes") == {(): 123_456_789.0}
    assert values(got["edgerun_device_temperature_celsius"], "edgerun_device_temperature_celsius") == {(): 51.35}
    assert values(got["edgerun_cache_hits"], "edgerun_cache_hits_total") == {(("cache", "prefix"),): 7.0, (("cache", "result"),): 1.0}
    assert values(got["edgerun_cache_misses"], "edgerun_cache_misses_total") == {(("cache", "prefix"),): 3.0, (("cache", "result"),): 2.0}

    state["busy"], state["resident"] = 3, []  # a model evicted, more slots busy: the next scrape says so
    got = scrape(m)
    assert values(got["edgerun_slots_busy"], "edgerun_slots_busy") == {(("model", "smol"),): 3.0}
    assert values(got["edgerun_resident_models"], "edgerun_resident_models") == {(): 0.0}
    assert values(got["edgerun_model_planned_bytes"], "edgerun_model_planned_bytes") == {}


def test_resident_models_and_the_plan_from_a_real_residency_manager(tmp_path: Path) -> None:
    from runtime.residency.manager import ModelSpec, ResidencyManager
    from tests.runtime.modelgen import vision_bundle

    bundle = vision_bundle(tmp_path / "tiny", "onnx")
    with ResidencyManager(1 << 30) as models:
        models.add(ModelSpec(name="tiny", ref=str(bundle), kind="vision", options={"threads": 1, "target": "cpu"}))
        m = ServerMetrics(resident=models.resident, memory=models.stats, rss=None, temperature=None)
        assert values(scrape(m)["edgerun_resident_models"], "edgerun_resident_models") == {(): 0.0}
        with models.acquire("tiny"):
            got = scrape(m)
        planned = values(got["edgerun_model_planned_bytes"], "edgerun_model_planned_bytes")
        assert list(planned) == [(("kind", "vision"), ("model", "tiny"), ("version", "1"))]
        assert next(iter(planned.values())) == models.planned_bytes("tiny") > 0
        plan = values(got["edgerun_memory_plan_bytes"], "edgerun_memory_plan_bytes")
        assert plan[(("part", "budget"),)] == 1 << 30 and plan[(("part", "used"),)] >= models.planned_bytes("tiny")
        assert set(plan) == {(("part", "budget"),), (("part", "reserve"),), (("part", "used"),)}


def test_two_entries_of_one_model_version_are_one_sample() -> None:
    # During a swap to the same version the old entry stays until its last lease ends: a repeated label set
    # would make the whole scrape unparseable.
    rows = [{"name": "smol", "version": "2", "kind": "llm", "planned_bytes": 100},
            {"name": "smol", "version": "2", "kind": "llm", "planned_bytes": 120}]
    got = scrape(ServerMetrics(resident=lambda: rows, rss=None, temperature=None))
    assert values(got["edgerun_model_planned_bytes"], "edgerun_model_planned_bytes") == {
        (("kind", "llm"), ("model", "smol"), ("version", "2")): 220.0}
    assert values(got["edgerun_resident_models"], "edgerun_resident_models") == {(): 2.0}


def test_a_failing_source_leaves_out_its_gauge_not_the_scrape(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> dict:
        raise RuntimeError("engine gone")

    m = ServerMetrics(slots_busy=broken, rss=lambda: 1, temperature=None)
    with caplog.at_level(logging.WARNING, logger="apps.server.metrics"):
        got = scrape(m)
    assert values(got["edgerun_slots_busy"], "edgerun_slots_busy") == {}
    assert values(got["edgerun_process_rss_bytes"], "edgerun_process_rss_bytes") == {(): 1.0}
    assert "metrics source slots_busy failed: RuntimeError: engine gone" in caplog.text


@pytest.mark.parametrize("board, celsius", [("pi5", 51.35), ("jetson-orin-nano", 48.5), ("x86-server", 45.0)])
def test_device_temperature_comes_from_the_boards_cpu_zone(board: str, celsius: float) -> None:
    m = ServerMetrics(rss=None, temperature=partial(device_temperature_c, str(FIXTURES / board)))
    assert values(scrape(m)["edgerun_device_temperature_celsius"], "edgerun_device_temperature_celsius") == {(): celsius}


def test_no_thermal_sensor_means_no_temperature_sample(tmp_path: Path) -> None:
    (tmp_path / "sys" / "class").mkdir(parents=True)  # a board tree without thermal zones
    assert device_temperature_c(str(tmp_path)) is None
    m = ServerMetrics(rss=None, temperature=partial(device_temperature_c, str(tmp_path)))
    assert values(scrape(m)["edgerun_device_temperature_celsius"], "edgerun_device_temperature_celsius") == {}


def test_default_rss_is_this_process() -> None:
    got = values(scrape(ServerMetrics(temperature=None))["edgerun_process_rss_bytes"], "edgerun_process_rss_bytes")[()]
    assert abs(got - rss_bytes()) < 64 << 20 and got > 10 << 20


def test_tokens_per_second_over_the_window() -> None:
    clock = Clock()
    m = ServerMetrics(rss=None, temperature=None, rate_window_s=10.0, clock=clock)
    clock.now += 20
    m.observe_request(model="smol", version="1", priority="batch", status="ok", total_s=1, ttft_s=0.1, completion_tokens=50)
    clock.now += 5
    m.observe_request(model="smol", version="1", priority="batch", status="ok", total_s=1, ttft_s=0.1, completion_tokens=30)
    assert m.tokens_per_second() == {"smol": 8.0}  # 80 tokens in the last 10 s
    clock.now += 6  # the first request left the window
    rate = values(scrape(m)["edgerun_tokens_per_second"], "edgerun_tokens_per_second")
    assert rate == {(("model", "smol"),): 3.0}


def test_the_tokens_per_second_window_stays_bounded_when_nobody_scrapes() -> None:
    # A server that no Prometheus scrapes must not keep one record per request forever.
    clock = Clock()
    m = ServerMetrics(rss=None, temperature=None, rate_window_s=10.0, clock=clock)
    for _ in range(5000):
        clock.now += 0.1
        m.observe_request(model="smol", version="1", priority="batch", status="ok", total_s=1, completion_tokens=1)
    assert len(m._completions["smol"]) <= 101  # the last 10 s at 10 requests per second, not all 5000
    assert m.tokens_per_second() == {"smol": pytest.approx(10.0, rel=0.02)}


def test_each_instance_has_its_own_registry() -> None:
    a, b = ServerMetrics(rss=None, temperature=None), ServerMetrics(rss=None, temperature=None)
    a.count_blocked("input", "size")
    assert values(scrape(b)["edgerun_blocked"], "edgerun_blocked_total") == {}


def test_bad_sources_and_caches_are_refused() -> None:
    m = ServerMetrics(rss=None, temperature=None)
    with pytest.raises(TypeError, match="unknown metrics source 'queue'"):
        m.bind(queue=lambda: {})
    with pytest.raises(TypeError, match="must be callable"):
        m.bind(rss=5)
    with pytest.raises(ValueError, match="unknown cache 'kv'; valid: prefix, result"):
        m.count_cache("kv", hit=True)


# --- request log ------------------------------------------------------------------------------------------------


def test_request_log_is_one_json_line_without_prompt_text(caplog: pytest.LogCaptureFixture) -> None:
    import enum

    class Priority(enum.IntEnum):
        BATCH = 2

    stream = io.StringIO()
    logger = logging.getLogger(reqlog.LOGGER)
    handler = reqlog.handler(stream)
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger=reqlog.LOGGER):
            line = reqlog.log_request(id="req-1", model="smol", version="2", priority=Priority.BATCH, status="ok",
                                      prompt_tokens=31, completion_tokens=9, ttft_ms=120.44449, total_ms=900.0,
                                      cache="miss", truncated=4, client="127.0.0.1:5000\nforged line", error=None)
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert written == line + "\n" and written.count("\n") == 1  # a newline in a value cannot start a second line
    record = json.loads(line)
    assert record["priority"] == "batch" and record["ttft_ms"] == 120.444 and record["truncated"] == 4
    assert set(record) == {"id", "model", "version", "priority", "status", "prompt_tokens", "completion_tokens", "ttft_ms",
                           "total_ms", "cache", "truncated", "client", "error", "stream", "ts"}


def test_request_log_has_no_field_for_prompt_text() -> None:
    with pytest.raises(TypeError, match="prompt"):
        reqlog.log_request(id="1", model="m", version="1", priority="urgent", status="ok", prompt="tell me a secret")


def test_request_log_non_finite_timings_become_null() -> None:
    record = json.loads(reqlog.RequestRecord(id="1", model="m", version="1", priority="urgent", status="timeout",
                                             ttft_ms=None, total_ms=float("inf")).to_json())
    assert record["ttft_ms"] is None and record["total_ms"] is None
