"""apps.server.canary: fraction routing, automatic rollback on errors or latency, promote/rollback by hand."""

from __future__ import annotations

import logging
import random
import threading
from collections import Counter
from collections.abc import Callable

import pytest

from apps.server.canary import CANARY, PROMOTED, ROLLED_BACK, CanaryRouter, p95
from runtime.errors import BadInput


def serve(router: CanaryRouter, backends: dict[str, Callable[[], float]], n: int) -> Counter:
    """``n`` requests routed by ``router``: each backend returns its latency in seconds or raises. Returns how many
    requests each version got; every request is recorded, as the server does."""
    got: Counter = Counter()
    for _ in range(n):
        version = router.pick()
        got[version] += 1
        try:
            seconds, ok = backends[version](), True
        except RuntimeError:
            seconds, ok = 0.001, False
        router.record(version, ok, seconds)
    return got


def latency(mean: float, rng: random.Random) -> Callable[[], float]:
    return lambda: rng.uniform(0.8 * mean, 1.2 * mean)


def broken() -> float:
    raise RuntimeError("backend failed")


def test_a_canary_whose_backend_raises_is_rolled_back_after_min_requests(caplog: pytest.LogCaptureFixture) -> None:
    changes = []
    router = CanaryRouter("smol:1", "smol:2", 0.3, min_requests=20, rng=random.Random(1),
                          on_change=lambda state, reason: changes.append((state, reason)))
    rng = random.Random(2)
    with caplog.at_level(logging.WARNING, logger="apps.server.canary"):
        got = serve(router, {"smol:1": latency(0.1, rng), "smol:2": broken}, 400)
    state = router.state()
    assert state["state"] == ROLLED_BACK
    assert state["versions"]["smol:2"]["requests"] == 20  # rolled back at the 20th canary request, none after
    assert got["smol:2"] == 20 and got["smol:1"] == 380
    assert "error rate 100.0% over its last 20 requests exceeds the stable's 0.0% by more than 5.0%" in state["reason"]
    assert "canary smol:2 rolled back to smol:1 automatically: error rate 100.0%" in caplog.text
    assert changes == [(ROLLED_BACK, state["reason"])]
    assert {router.pick() for _ in range(100)} == {"smol:1"}


def test_a_slow_canary_is_rolled_back_on_p95() -> None:
    router = CanaryRouter("v1", "v2", 0.5, margin_p95=1.5, min_requests=30, rng=random.Random(3))
    rng = random.Random(4)
    serve(router, {"v1": latency(0.2, rng), "v2": latency(0.5, rng)}, 200)
    state = router.state()
    assert state["state"] == ROLLED_BACK and state["versions"]["v2"]["errors"] == 0
    assert state["reason"].startswith("p95 latency") and "exceeds the stable's" in state["reason"] and "times 1.5" in state["reason"]
    assert state["versions"]["v2"]["requests"] == 30  # decided as soon as both sides had min_requests


def test_a_healthy_canary_is_not_rolled_back() -> None:
    router = CanaryRouter("v1", "v2", 0.5, min_requests=20, rng=random.Random(5))
    rng = random.Random(6)
    flaky = random.Random(7)

    def sometimes(mean: float) -> Callable[[], float]:  # both versions fail 2% of the time, with the same latency
        def call() -> float:
            if flaky.random() < 0.02:
                raise RuntimeError("transient")
            return rng.uniform(0.8 * mean, 1.2 * mean)
        return call

    serve(router, {"v1": sometimes(0.2), "v2": sometimes(0.2)}, 2000)
    state = router.state()
    assert state["state"] == CANARY and state["reason"] is None
    assert state["versions"]["v2"]["errors"] > 0 and state["versions"]["v2"]["requests"] > 900


def test_error_margin_is_a_strict_bound() -> None:
    # 10 errors in 200 is 5.0%: at the margin over a clean stable, not beyond it, however certain; one more is.
    router = CanaryRouter("v1", "v2", 1.0, margin_error=0.05, min_requests=20, rng=random.Random(0))
    for _ in range(2000):
        router.record("v1", ok=True, seconds=0.1)
    for i in range(200):
        router.record("v2", ok=i % 20 != 19, seconds=0.1)  # never above 5% at any point
    assert router.state()["state"] == CANARY
    router.record("v2", ok=False, seconds=0.1)  # 11 of the last 200
    assert router.state()["state"] == ROLLED_BACK


def test_a_difference_chance_explains_does_not_roll_back() -> None:
    # Both versions fail 5% of the time. 3 canary errors in its first 20 (15%) are 10 points over the stable's 5%,
    # past the margin, but 20 requests cannot tell 15% from 5%; latencies drawn alike, whose small-sample p95s
    # differ by more than the margin, cannot either.
    router = CanaryRouter("v1", "v2", 0.5, min_requests=20, rng=random.Random(0))
    for i in range(200):
        router.record("v1", ok=i % 20 != 0, seconds=0.1)
    for i in range(20):
        router.record("v2", ok=i not in (3, 9, 15), seconds=0.1)
    assert router.state()["state"] == CANARY
    slow_tail = CanaryRouter("v1", "v2", 0.5, min_requests=20, rng=random.Random(0))
    for i in range(1, 21):
        slow_tail.record("v1", ok=True, seconds=i / 10)  # p95 1.9 s
        slow_tail.record("v2", ok=True, seconds={19: 3.0, 20: 3.1}.get(i, i / 10))  # p95 3.0 s: 1.58 times
    assert slow_tail.state()["state"] == CANARY


def test_identical_versions_are_rarely_rolled_back_by_chance() -> None:
    """Many seeded rollouts of two identical versions (5% errors, widely spread latencies), looked at after every
    request as the server does: chance alone must not end them (the bare comparison rolled back 19 of these 40)."""
    rolled = 0
    for seed in range(40):
        router = CanaryRouter("v1", "v2", 0.5, rng=random.Random(seed))
        rng = random.Random(1000 + seed)
        for _ in range(1000):
            version = router.pick()
            router.record(version, ok=rng.random() >= 0.05, seconds=rng.lognormvariate(-1.0, 0.6))
        rolled += router.state()["state"] == ROLLED_BACK
    assert rolled <= 2


def test_nothing_is_decided_before_min_requests() -> None:
    router = CanaryRouter("v1", "v2", 1.0, min_requests=20, rng=random.Random(0))
    for _ in range(19):
        router.record("v2", ok=False, seconds=0.1)
    assert router.state()["state"] == CANARY


def test_latency_is_compared_only_when_the_stable_has_enough_requests() -> None:
    router = CanaryRouter("v1", "v2", 1.0, min_requests=10, rng=random.Random(0))
    for _ in range(5):
        router.record("v1", ok=True, seconds=0.1)
    for _ in range(50):
        router.record("v2", ok=True, seconds=5.0)
    assert router.state()["state"] == CANARY  # 5 stable samples say nothing about its p95
    for _ in range(5):
        router.record("v1", ok=True, seconds=0.1)
    assert router.state()["state"] == ROLLED_BACK


def test_the_window_forgets_old_outcomes() -> None:
    # An early burst of errors slides out of the window; a canary recovered since is judged on what it does now.
    router = CanaryRouter("v1", "v2", 1.0, margin_error=0.5, min_requests=10, window=10, rng=random.Random(0))
    for ok in [False] * 5 + [True] * 5:  # 50%: not beyond 0% + 50%
        router.record("v2", ok=ok, seconds=0.1)
    for _ in range(10):
        router.record("v2", ok=True, seconds=0.1)
    router.record("v2", ok=False, seconds=0.1)
    state = router.state()
    assert state["state"] == CANARY and state["versions"]["v2"]["error_rate"] == 0.1 and state["versions"]["v2"]["errors"] == 6


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.25, 0.5, 1.0])
def test_fraction_routing_within_tolerance_for_a_fixed_seed(fraction: float) -> None:
    router = CanaryRouter("v1", "v2", fraction, rng=random.Random(42))
    picks = Counter(router.pick() for _ in range(20_000))
    assert abs(picks["v2"] / 20_000 - fraction) < 0.01


def test_the_same_seed_routes_the_same_way() -> None:
    a = CanaryRouter("v1", "v2", 0.3, rng=random.Random(9))
    b = CanaryRouter("v1", "v2", 0.3, rng=random.Random(9))
    assert [a.pick() for _ in range(500)] == [b.pick() for _ in range(500)]


def test_promote_then_rollback_then_no_promote() -> None:
    changes = []
    router = CanaryRouter("v1", "v2", 0.1, rng=random.Random(0), on_change=lambda s, r: changes.append(s))
    assert router.serving == "v1"
    state = router.promote()
    assert state["state"] == PROMOTED and router.serving == "v2" and {router.pick() for _ in range(50)} == {"v2"}
    assert router.promote()["state"] == PROMOTED and changes == [PROMOTED]  # promoting twice changes nothing
    state = router.rollback("  answers got worse\nafter the switch ")
    assert state["state"] == ROLLED_BACK and state["reason"] == "answers got worse after the switch"
    assert router.serving == "v1" and {router.pick() for _ in range(50)} == {"v1"}
    assert router.rollback("again")["reason"] == "answers got worse after the switch"  # the first reason stays
    assert changes == [PROMOTED, ROLLED_BACK]
    with pytest.raises(BadInput, match=r"canary v2 was rolled back \(answers got worse after the switch\); start a new rollout"):
        router.promote()


def test_manual_rollback_needs_a_reason_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    router = CanaryRouter("v1", "v2", 0.1, rng=random.Random(0))
    with pytest.raises(BadInput, match="a rollback needs a reason"):
        router.rollback("   ")
    with caplog.at_level(logging.WARNING, logger="apps.server.canary"):
        router.rollback("operator saw bad answers")
    assert "canary v2 rolled back to v1: operator saw bad answers" in caplog.text


def test_requests_in_flight_at_the_switch_are_still_recorded() -> None:
    router = CanaryRouter("v1", "v2", 1.0, rng=random.Random(0))
    assert router.pick() == "v2"
    router.rollback("manual")
    router.record("v2", ok=True, seconds=0.3)  # the request routed before the rollback finishes afterwards
    assert router.state()["versions"]["v2"]["requests"] == 1 and router.state()["state"] == ROLLED_BACK


def test_a_failing_hook_does_not_undo_the_transition(caplog: pytest.LogCaptureFixture) -> None:
    def hook(state: str, reason: str) -> None:
        raise RuntimeError("hook broke")

    router = CanaryRouter("v1", "v2", 0.1, rng=random.Random(0), on_change=hook)
    with caplog.at_level(logging.ERROR, logger="apps.server.canary"):
        assert router.promote()["state"] == PROMOTED
    assert "on_change hook failed after promoted" in caplog.text


def test_concurrent_picks_and_records_lose_nothing() -> None:
    router = CanaryRouter("v1", "v2", 0.5, min_requests=50, window=100, rng=random.Random(0))
    picked: Counter = Counter()
    lock = threading.Lock()

    def worker() -> None:
        local: Counter = Counter()
        for _ in range(2000):
            v = router.pick()
            local[v] += 1
            router.record(v, ok=True, seconds=0.1)
        with lock:
            picked.update(local)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    versions = router.state()["versions"]
    assert versions["v1"]["requests"] == picked["v1"] and versions["v2"]["requests"] == picked["v2"]
    assert picked["v1"] + picked["v2"] == 16_000 and router.state()["state"] == CANARY


@pytest.mark.parametrize("kwargs, message", [
    (dict(stable="v1", canary="v1", fraction=0.1), "two different versions"),
    (dict(stable="v1", canary="v2", fraction=1.5), "fraction 1.5 is not valid; give a number from 0 to 1"),
    (dict(stable="v1", canary="v2", fraction=float("nan")), "fraction nan is not valid"),
    (dict(stable="v1", canary="v2", fraction=0.1, margin_error=-0.1), "error-rate margin -0.1 is not valid"),
    (dict(stable="v1", canary="v2", fraction=0.1, margin_p95=0.5), "p95 margin 0.5 is not valid; give a factor from 1 to 100"),
    (dict(stable="v1", canary="v2", fraction=0.1, min_requests=0), "min_requests 0 is not valid"),
    (dict(stable="v1", canary="v2", fraction=0.1, min_requests=50, window=20),
     r"window 20 is not valid; give a whole number >= min_requests \(50\)"),
])
def test_bad_settings_are_refused_in_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        CanaryRouter(**kwargs)


def test_unknown_version_and_bad_time_are_refused() -> None:
    router = CanaryRouter("v1", "v2", 0.1)
    with pytest.raises(BadInput, match=r"version 'v3' is not in this rollout; valid: 'v1', 'v2'"):
        router.record("v3", ok=True, seconds=0.1)
    with pytest.raises(BadInput, match="request time -1 is not valid"):
        router.record("v1", ok=True, seconds=-1)


def test_p95_is_nearest_rank() -> None:
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([3.0]) == 3.0
    assert p95([1.0] * 19 + [10.0]) == 1.0 and p95([1.0] * 18 + [10.0] * 2) == 10.0
