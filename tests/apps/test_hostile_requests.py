"""The hostile-request suite against the real servers (tests/hostile/): every case clean, no 500, no hang, no crash,
no traceback in the server's log, and the server's peak RSS inside the memory plan it announced.

bench/hostile.py runs the same cases and prints the table that docs/trust.md shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile import dashboard_cases, http, serve_cases, targets, wyoming_cases

pytestmark = pytest.mark.slow

FLOODS = ((1100, False), (300, True))  # past a Pi's 1,024 descriptors idle; slowloris half-headers


def _assert_held(t: targets.Target, outcomes: list[http.Outcome]) -> None:
    bad = [f"{o.case.klass} / {o.case.name}: {o.verdict} {o.status} {o.body[-300:]!r}"
           for o in outcomes if o.verdict != "clean"]
    assert not bad, "\n".join(bad)
    assert t.alive()
    assert t.tracebacks() == 0, t.log.read_text(errors="replace")[-4000:]


def test_serve_holds_every_hostile_request(smollm, shared_home: Path, tmp_path: Path) -> None:
    bundle = targets.small_vision_bundle(tmp_path / "vision")
    with targets.serve(tmp_path, home=shared_home, vision_bundle=bundle) as t:
        cases = serve_cases.every_case("vision")
        outcomes = http.run(t.port, cases, process_alive=t.alive)
        outcomes += [http.flood(t.port, n, half_header=half) for n, half in FLOODS]
        _assert_held(t, outcomes)
        assert len(outcomes) == len(cases) + len(FLOODS)
        assert t.plan_bytes and t.peak_rss() <= t.plan_bytes, (t.peak_rss(), t.plan_bytes)


def test_wyoming_holds_every_hostile_event(tmp_path: Path, shared_home: Path) -> None:
    with targets.wyoming(tmp_path, home=shared_home) as t:
        cases = wyoming_cases.every_case()
        outcomes = wyoming_cases.run(t.port, cases, process_alive=t.alive)
        _assert_held(t, outcomes)
        assert len(outcomes) == len(cases)
        assert t.plan_bytes and t.peak_rss() <= t.plan_bytes, (t.peak_rss(), t.plan_bytes)


def test_kiosk_dashboard_holds_every_hostile_request(tmp_path: Path, shared_home: Path) -> None:
    with targets.kiosk(tmp_path, home=shared_home) as t:
        cases = dashboard_cases.every_case()
        outcomes = http.run(t.port, cases, process_alive=t.alive, health="/api/state")
        outcomes += [http.flood(t.port, n, half_header=half, health="/api/state") for n, half in FLOODS]
        _assert_held(t, outcomes)
        assert t.plan_bytes and t.peak_rss() <= t.plan_bytes, (t.peak_rss(), t.plan_bytes)  # the process term too
