"""The kiosk pipeline on a real tiny ORT vision bundle through the real residency manager and batcher: exactly one
decision per part under normal load, overload, corrupt frames, a failing backend, a passed deadline and shutdown;
batching; model swaps between parts, rollback and a canary. Timing is forced only by delaying the real model."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from apps.kiosk.pipeline import FAILSAFE, Pipeline
from apps.kiosk.policy import Policy
from apps.kiosk.types import Decision, Part, Verdict
from runtime.errors import BadInput
from runtime.residency.manager import ModelSpec, ResidencyManager
from tests.apps.kiosk.kiosk_models import V2, TimedLoader, anomaly_bundle, kiosk_bundle, part

POLICY = Policy.from_config({"good": ["good"], "uncertain": "review"})
EXPECTED = {"good": Verdict.PASS, "scratch": Verdict.REJECT, "spot": Verdict.REJECT, "grey": Verdict.REVIEW}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kiosk-bundles")
    return {"1": kiosk_bundle(root / "v1", "1"), "2": kiosk_bundle(root / "v2", "2", V2),
            "anomaly": anomaly_bundle(root / "anomaly", "3")}


class Line:
    """A pipeline over ``loader`` (real default loaders when None) that records what on_decision gets."""

    def __init__(self, bundle: Path, loader: TimedLoader | None = None, policy: Policy = POLICY, **kw) -> None:
        self.decisions: list[Decision] = []
        self.residency = ResidencyManager(1 << 30, loaders=None if loader is None else {"vision": loader})
        self.residency.add(ModelSpec("parts", str(bundle), "vision", options={"threads": 1, "batch": 8}))
        self.pipeline = Pipeline("parts", self.residency, policy, on_decision=self.decisions.append, **kw)

    def by_seq(self) -> dict[int, Decision]:
        seqs = Counter(d.seq for d in self.decisions)
        assert all(n == 1 for n in seqs.values()), f"parts decided more than once: {[s for s, n in seqs.items() if n > 1]}"
        return {d.seq: d for d in self.decisions}

    def close(self) -> None:
        self.pipeline.close()
        self.residency.close()


def until(check, timeout: float = 10.0) -> bool:
    """Poll ``check`` until it holds (a loaded 2-core box may take far longer than a fixed sleep)."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def exactly_once(line: Line, n: int) -> dict[int, Decision]:
    assert line.pipeline.wait_idle(10)
    got = line.by_seq()
    assert sorted(got) == list(range(n)), "a part without a decision"
    stats = line.pipeline.stats()
    assert stats["decided"] == stats["submitted"] == n and stats["pending"] == 0
    assert stats["pass"] + stats["reject"] + stats["review"] == n
    assert stats["failsafe_total"] == sum(d.failsafe for d in got.values())
    return got


def test_normal_load_one_right_decision_per_part(bundles: dict[str, Path]) -> None:
    line = Line(bundles["1"], deadline_ms=2000)
    try:
        colors = ["good", "scratch", "spot", "grey"] * 10
        for seq, color in enumerate(colors):
            # the source's ground truth is kept out of the decision: the PLC and the audit get the model's class
            line.pipeline.submit(part(seq, color, label=f"truth-{color}"))
            time.sleep(0.002)
        got = exactly_once(line, len(colors))
    finally:
        line.close()
    for seq, color in enumerate(colors):
        d = got[seq]
        decided = d.label if color == "grey" else color  # grey: no class called; the label is the top class
        assert (d.verdict, d.failsafe, d.label, d.model, d.version) == (EXPECTED[color], False, decided, "parts", "1")
        assert not (d.label or "").startswith("truth-")
        assert set(d.latency_ms) == {"capture", "queue", "preprocess", "infer", "decide", "total"}
        assert d.latency_ms["total"] >= d.latency_ms["infer"] >= 0
    assert got[0].reason.startswith("good 1.00") and got[1].reason.startswith("scratch 1.00")
    assert got[3].reason.startswith("uncertain: no class called") and got[3].confidence == pytest.approx(1 / 3, abs=1e-3)
    stats = line.pipeline.stats()
    assert stats["latency_ms"]["total"]["p99"] >= stats["latency_ms"]["total"]["p50"] > 0
    assert stats["saturated"] is False and stats["failsafe_total"] == 0
    assert stats["placement"].startswith("placement: ort on cpu, 1 thread")  # the loader's report, as it ran


def test_a_burst_is_batched(bundles: dict[str, Path]) -> None:
    loader = TimedLoader()
    line = Line(bundles["1"], loader, deadline_ms=5000, max_batch=8, max_wait_ms=50)
    try:
        loader.infer_s = 0.05  # parts pile up behind the first batch
        for seq in range(24):
            line.pipeline.submit(part(seq, "scratch"))
        got = exactly_once(line, 24)
    finally:
        line.close()
    assert all(d.verdict is Verdict.REJECT and not d.failsafe for d in got.values())
    assert max(loader.batch_sizes) == 8 and len(loader.batch_sizes) < 24  # one backend call per batch
    assert max(line.pipeline.stats()["batch_sizes"]) == 8


def test_overload_fails_safe_and_counts_saturation(bundles: dict[str, Path]) -> None:
    loader = TimedLoader()
    line = Line(bundles["1"], loader, deadline_ms=150, max_queue=4, max_batch=2, max_wait_ms=1)
    try:
        loader.infer_s = 0.03  # ~66 parts/s at best; the line below runs far faster
        for seq in range(60):
            line.pipeline.submit(part(seq))
        got = exactly_once(line, 60)
        stats = line.pipeline.stats()
    finally:
        line.close()
    failsafe = [d for d in got.values() if d.failsafe]
    assert stats["failsafe"]["saturated"] == stats["saturation"] > 0 and stats["saturated"] is True
    assert Counter(d.reason.split(":")[0] for d in failsafe) == {k: v for k, v in stats["failsafe"].items() if v}
    assert all(d.verdict is Verdict.REJECT and d.score == 0 and d.confidence == 0 for d in failsafe)
    assert any(not d.failsafe and d.verdict is Verdict.PASS for d in got.values())  # the box kept deciding


def test_corrupt_frames_fail_safe_with_the_reason(bundles: dict[str, Path]) -> None:
    line = Line(bundles["1"], deadline_ms=2000)
    bad = {1: {"error": "frame.png: cannot decode as an image"}, 2: {"image": None},
           3: {"image": np.zeros((8, 8), np.uint8)}, 4: {"image": np.zeros((8, 8, 3), np.float32)},
           5: {"image": np.zeros((0, 8, 3), np.uint8)}}
    try:
        for seq in range(8):
            line.pipeline.submit(part(seq, **bad.get(seq, {})))
        got = exactly_once(line, 8)
    finally:
        line.close()
    assert [seq for seq, d in got.items() if d.failsafe] == sorted(bad)
    assert got[1].reason == "corrupt_frame: frame.png: cannot decode as an image"
    assert got[2].reason == "corrupt_frame: image is NoneType, not uint8 HxWx3 RGB"
    assert "float32 (8, 8, 3)" in got[4].reason
    assert all(got[s].verdict is Verdict.PASS for s in (0, 6, 7))
    assert line.pipeline.stats()["failsafe"]["corrupt_frame"] == 5


def test_a_backend_error_fails_its_batch_safe_and_the_line_goes_on(bundles: dict[str, Path]) -> None:
    loader = TimedLoader()
    line = Line(bundles["1"], loader, deadline_ms=2000, max_batch=1)
    try:
        loader.fail = lambda n: n == 2  # the second backend call raises
        for seq in range(4):
            line.pipeline.submit(part(seq))
        got = exactly_once(line, 4)
    finally:
        line.close()
    assert got[1].failsafe and got[1].reason == "backend_error: RuntimeError: injected backend failure"
    assert [got[s].verdict for s in (0, 2, 3)] == [Verdict.PASS] * 3
    assert line.pipeline.stats()["failsafe"]["backend_error"] == 1


def test_a_passed_deadline_fails_safe_on_time_and_the_late_verdict_is_dropped(bundles: dict[str, Path]) -> None:
    loader = TimedLoader()
    line = Line(bundles["1"], loader, deadline_ms=80, max_batch=1)
    try:
        loader.infer_s = 0.4
        line.pipeline.submit(part(0))
        old = part(1, t_capture=time.monotonic() - 1.0)  # captured a second ago: past its deadline on arrival
        line.pipeline.submit(old)
        assert until(lambda: line.pipeline.stats()["late"] == 1)  # the model's verdict for part 0, after its fail-safe
        got = exactly_once(line, 2)
        stats = line.pipeline.stats()
    finally:
        line.close()
    assert got[0].failsafe and got[0].reason.startswith("deadline: no decision within 80 ms")
    assert 80 <= got[0].latency_ms["total"] < 380  # decided by the timer, not after the 400 ms model call
    assert got[1].failsafe and got[1].reason.startswith("deadline")
    assert stats["late"] == 1 and stats["failsafe"]["deadline"] == 2 and stats["saturated"] is True


def test_shutdown_decides_every_queued_part(bundles: dict[str, Path]) -> None:
    loader = TimedLoader()
    line = Line(bundles["1"], loader, deadline_ms=10_000, max_batch=1)
    loader.infer_s = 0.1
    for seq in range(10):
        line.pipeline.submit(part(seq))
    assert until(lambda: loader.batch_sizes == [1])  # part 0's batch is running
    line.close()
    after = line.pipeline.submit(part(10))  # a part after close still gets its one decision
    got = line.by_seq()
    assert sorted(got) == list(range(11)) and after.result(1).seq == 10
    assert got[0].verdict is Verdict.PASS and not got[0].failsafe  # the running batch finished
    assert all(got[s].failsafe and got[s].reason.startswith("shutdown") for s in range(1, 11))


def test_swap_is_atomic_between_parts_with_parts_in_flight(bundles: dict[str, Path]) -> None:
    loader = TimedLoader()
    loader.load_s[str(bundles["2"])] = 0.4  # version 2 exists, half-loaded, for 0.4 s
    line = Line(bundles["1"], loader, deadline_ms=3000, max_queue=100, max_batch=4, max_wait_ms=2)
    stop, parts = threading.Event(), {}

    def feed() -> None:
        while not stop.is_set() or len(parts) < 60:
            parts[len(parts)] = p = part(len(parts), "good")
            line.pipeline.submit(p)
            time.sleep(0.01)

    feeder = threading.Thread(target=feed)
    try:
        feeder.start()
        time.sleep(0.2)
        assert line.pipeline.swap(str(bundles["2"])) == "2"
        after = len(parts)
        while len(parts) < after + 10:  # parts after the switch (the old version decided those during the load)
            time.sleep(0.01)
        stop.set()
        feeder.join()
        got = exactly_once(line, len(parts))
    finally:
        stop.set()
        line.close()
    versions = [got[s].version for s in sorted(got)]
    assert not [d.reason for d in got.values() if d.failsafe]
    switch = versions.index("2")
    assert switch > 0 and set(versions[:switch]) == {"1"} and set(versions[switch:]) == {"2"}  # one switch
    ready = loader.loaded_at[str(bundles["2"])]
    for d in got.values():  # red parts pass under 1 and are "scratch" under 2; none decided before 2 was whole
        assert d.verdict is (Verdict.PASS if d.version == "1" else Verdict.REJECT)
        if d.version == "2":
            assert parts[d.seq].t_capture + d.latency_ms["total"] / 1000 >= ready - 1e-5


def test_a_caller_cancelling_its_future_does_not_take_the_decision_from_the_line(bundles: dict[str, Path]) -> None:
    line = Line(bundles["1"], deadline_ms=2000)
    try:
        futures = [line.pipeline.submit(part(seq, "scratch")) for seq in range(4)]
        assert not any(f.cancel() for f in futures)  # the part is on the belt: its decision is not the caller's to drop
        got = exactly_once(line, 4)
    finally:
        line.close()
    assert all(got[s].verdict is Verdict.REJECT and f.result(1) == got[s] for s, f in enumerate(futures))


def test_a_swap_loads_beside_the_deciding_version_so_the_line_never_waits_for_it(bundles: dict[str, Path]) -> None:
    loader = TimedLoader()
    loader.load_s[str(bundles["2"])] = 2.0  # far beyond the deadline: a part that waited for the load would fail safe
    line = Line(bundles["1"], loader, deadline_ms=1000, max_queue=100, max_batch=4, max_wait_ms=2)
    parts: dict[int, Part] = {}
    result: dict[str, str] = {}
    swapper = threading.Thread(target=lambda: result.update(version=line.pipeline.swap(str(bundles["2"]))))
    try:
        swapper.start()
        while swapper.is_alive():
            parts[len(parts)] = p = part(len(parts), "good")
            line.pipeline.submit(p)
            time.sleep(0.02)
        swapper.join()
        parts[len(parts)] = p = part(len(parts), "good")
        line.pipeline.submit(p)
        got = exactly_once(line, len(parts))
        assert len(line.residency.specs()) == 1  # the old version was retired after the switch
    finally:
        line.close()
    assert result["version"] == "2"
    assert not [d.reason for d in got.values() if d.failsafe]
    ready = loader.loaded_at[str(bundles["2"])]
    during = [s for s, d in got.items() if parts[s].t_capture + d.latency_ms["total"] / 1000 < ready]
    assert len(during) >= 10  # parts kept being decided while version 2 loaded...
    assert all((got[s].version, got[s].verdict) == ("1", Verdict.PASS) for s in during)  # ...by version 1
    assert (got[len(parts) - 1].version, got[len(parts) - 1].verdict) == ("2", Verdict.REJECT)


def test_a_swap_without_room_for_two_versions_swaps_in_place(bundles: dict[str, Path],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    from runtime.residency.manager import RESERVE_FRACTION

    spec = ModelSpec("parts", str(bundles["1"]), "vision", pinned=True, options={"threads": 1, "batch": 8})
    with ResidencyManager(1 << 30) as probe:
        probe.add(spec)
        planned = probe.planned_bytes("parts")
    decisions: list[Decision] = []
    with ResidencyManager(int(planned / (1 - RESERVE_FRACTION)) + 64) as rm:  # one version fits, two do not
        rm.add(spec)
        with Pipeline("parts", rm, POLICY, deadline_ms=2000, on_decision=decisions.append) as pipeline:
            with caplog.at_level(logging.WARNING, logger="apps.kiosk.pipeline"):
                assert pipeline.swap(str(bundles["2"])) == "2"
            assert "no room" in caplog.text and [s.ref for s in rm.specs()] == [str(bundles["2"])]
            pipeline.submit(part(0))
            assert pipeline.wait_idle(5)
            assert pipeline.rollback() == "1"
            pipeline.submit(part(1))
            assert pipeline.wait_idle(5)
    assert [(d.version, d.verdict, d.failsafe) for d in decisions] == [("2", Verdict.REJECT, False), ("1", Verdict.PASS, False)]


def test_the_version_shown_is_the_new_one_after_a_batch_of_the_old_one_ends(bundles: dict[str, Path]) -> None:
    loader = TimedLoader()
    line = Line(bundles["1"], loader, deadline_ms=5000, max_batch=1)
    try:
        loader.infer_s = 0.3
        line.pipeline.submit(part(0))
        assert until(lambda: loader.batch_sizes == [1])  # version 1 is deciding part 0
        assert line.pipeline.swap(str(bundles["2"])) == "2"
        got = exactly_once(line, 1)
        stats = line.pipeline.stats()
    finally:
        line.close()
    assert got[0].version == "1" and stats["version"] == "2"  # the dashboard and fail-safe rows name version 2


def spotted(seq: int) -> Part:
    p = part(seq, "good")
    p.image[:6, :6] = (40, 40, 220)  # a blue spot in the top left corner of a red part
    return p


def test_anomaly_bundle_decides_with_its_threshold_and_heat_map(bundles: dict[str, Path]) -> None:
    decisions: list[Decision] = []
    with ResidencyManager(1 << 30) as rm:
        rm.add(ModelSpec("parts", str(bundles["anomaly"]), "anomaly", options={"threads": 1, "batch": 8}))
        with Pipeline("parts", rm, Policy(), deadline_ms=2000, on_decision=decisions.append) as pipeline:
            for seq in range(6):
                pipeline.submit(spotted(seq) if seq % 2 else part(seq, "good"))
            assert pipeline.wait_idle(5)
    got = {d.seq: d for d in decisions}
    assert sorted(got) == list(range(6)) and not any(d.failsafe for d in decisions)
    for seq, d in got.items():
        assert d.verdict is (Verdict.REJECT if seq % 2 else Verdict.PASS) and d.version == "3"
        assert d.heatmap is not None and d.heatmap.shape == (24, 32) and d.heatmap.dtype == np.float32
    spot = got[1]
    assert spot.reason.startswith("anomaly 0.728 >= 0.3") and spot.score == pytest.approx(0.728, abs=1e-3)
    assert np.unravel_index(spot.heatmap.argmax(), spot.heatmap.shape)[0] < 8 and spot.heatmap.max() == 1.0
    assert got[0].score == 0 and got[0].heatmap.max() == 0


def test_swap_from_a_classifier_to_an_anomaly_bundle_and_back(bundles: dict[str, Path]) -> None:
    line = Line(bundles["1"], deadline_ms=2000)
    try:
        assert line.pipeline.swap(str(bundles["anomaly"])) == "3"  # the adapter follows the bundle's kind
        assert line.residency.specs()[0].kind == "anomaly"
        line.pipeline.submit(spotted(0))
        assert line.pipeline.wait_idle(5)
        assert line.pipeline.rollback() == "1"
        line.pipeline.submit(spotted(1))
        got = exactly_once(line, 2)
    finally:
        line.close()
    assert (got[0].version, got[0].verdict, got[0].reason[:7]) == ("3", Verdict.REJECT, "anomaly")
    assert (got[1].version, got[1].verdict, got[1].heatmap) == ("1", Verdict.PASS, None)  # the mean is still red


def test_rollback_returns_to_the_previous_version(bundles: dict[str, Path]) -> None:
    line = Line(bundles["1"], deadline_ms=2000)
    try:
        with pytest.raises(BadInput, match="no previous version"):
            line.pipeline.rollback()
        assert line.pipeline.swap(str(bundles["2"])) == "2"
        line.pipeline.submit(part(0))
        assert line.pipeline.wait_idle(5)
        assert line.pipeline.rollback() == "1"
        line.pipeline.submit(part(1))
        got = exactly_once(line, 2)
        assert line.pipeline.stats()["previous_versions"] == 0
        with pytest.raises(BadInput, match="no previous version"):
            line.pipeline.rollback()
    finally:
        line.close()
    assert (got[0].version, got[0].verdict, got[1].version, got[1].verdict) == ("2", Verdict.REJECT, "1", Verdict.PASS)


def test_a_swap_to_a_version_that_does_not_fit_the_policy_keeps_the_old_one(bundles: dict[str, Path], tmp_path: Path) -> None:
    other = kiosk_bundle(tmp_path / "v3", "3", labels=("ok", "scratch", "spot"))  # the policy's "good" is gone
    line = Line(bundles["1"], deadline_ms=2000)
    try:
        with pytest.raises(BadInput, match="policy names class 'good' that model parts does not have"):
            line.pipeline.swap(str(other))
        assert line.residency.specs()[0].ref == str(bundles["1"])
        line.pipeline.submit(part(0))
        got = exactly_once(line, 1)
    finally:
        line.close()
    assert (got[0].version, got[0].verdict) == ("1", Verdict.PASS)


def test_canary_logs_disagreements_then_promotes(bundles: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    line = Line(bundles["1"], deadline_ms=2000)
    caplog.set_level(logging.WARNING, logger="apps.kiosk.canary")
    colors = ["good", "spot", "spot", "scratch"] * 3  # the canary takes 0, 2, 4...: red parts 0, 4, 8 and blue ones
    try:
        assert line.pipeline.swap(str(bundles["2"]), canary=0.5) == "2"
        for seq, color in enumerate(colors):
            line.pipeline.submit(part(seq, color))
            assert line.pipeline.wait_idle(5)  # one part per batch: every other part goes to the canary
        assert line.pipeline._canary.wait_idle(5)
        canary = line.pipeline.stats()["canary"]
        assert line.pipeline.promote() == "2"
        line.pipeline.submit(part(len(colors), "good"))
        got = exactly_once(line, len(colors) + 1)
    finally:
        line.close()
    assert all(got[s].version == "1" for s in range(len(colors))) and got[len(colors)].version == "2"
    assert canary["compared"] == 6 and canary["disagreed"] == 3  # version 2 calls red "scratch"; blue is "spot" in both
    assert [r["seq"] for r in canary["recent"]] == [0, 4, 8]
    assert canary["recent"][0] | {} == {"seq": 0, "frame_id": "f0000", "stable": "pass", "stable_version": "1",
                                        "canary": "reject", "canary_version": "2", "canary_reason": "scratch 1.00 >= 0.50"}
    assert sum("the canary says reject" in r.getMessage() for r in caplog.records) == 3
    assert line.pipeline.stats()["canary"]["outcome"] == "promoted"


def test_on_decision_failing_does_not_stop_the_line(bundles: dict[str, Path]) -> None:
    line = Line(bundles["1"], deadline_ms=2000)
    seen = []

    def flaky(d: Decision) -> None:
        seen.append(d.seq)
        if d.seq == 0:
            raise OSError("audit disk full")

    line.pipeline.on_decision = flaky
    try:
        for seq in range(3):
            line.pipeline.submit(part(seq))
        assert line.pipeline.wait_idle(5)
        assert line.pipeline.stats()["callback_errors"] == 1
    finally:
        line.close()
    assert sorted(seen) == [0, 1, 2]


@pytest.mark.parametrize("kw, policy, match", [
    ({"deadline_ms": 0}, POLICY, "deadline_ms = 0"),
    ({"max_queue": 2.5}, POLICY, "max_queue"),
    ({"max_batch": 0}, POLICY, "max_batch"),
    ({}, Policy.from_config({"good": ["ok"]}), "policy names class 'ok' that model parts does not have"),
])
def test_bad_settings_are_one_line(bundles: dict[str, Path], kw: dict, policy: Policy, match: str) -> None:
    with ResidencyManager(1 << 30) as rm:
        rm.add(ModelSpec("parts", str(bundles["1"]), "vision", options={"threads": 1}))
        with pytest.raises(BadInput, match=match):
            Pipeline("parts", rm, policy, **kw)


def test_only_parts_are_submitted(bundles: dict[str, Path]) -> None:
    line = Line(bundles["1"])
    try:
        with pytest.raises(BadInput, match="submit\\(\\) takes a Part, not ndarray"):
            line.pipeline.submit(np.zeros((8, 8, 3), np.uint8))  # type: ignore[arg-type]
        assert line.pipeline.stats()["submitted"] == 0
    finally:
        line.close()


def test_failsafe_reasons_are_the_documented_keys() -> None:
    assert FAILSAFE == ("deadline", "saturated", "corrupt_frame", "backend_error", "shutdown")
