"""The hostile-request suite against the real servers, as the table in docs/trust.md.

Starts ``edgerun serve`` (the default LLM and a vision model), ``edgerun wyoming`` and ``edgerun kiosk`` (its
dashboard), each as its own process on loopback at a Pi's open-file limit (1,024), sends every case of
tests/hostile/, and prints one row per class: cases tried, clean answers, errors (a 500 or an unexpected status),
hangs, crashes, the slowest case, then per server the tracebacks in its log and its peak RSS against its plan.
Writes bench/results/hostile.json. tests/apps/test_hostile_requests.py runs the same cases and asserts the zeros.

    python bench/hostile.py [--only serve|wyoming|kiosk ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

# the project root, in place of bench/ (whose serial.py would shadow pyserial)
sys.path[0] = str(Path(__file__).resolve().parents[1])

from tests.hostile import dashboard_cases, http, serve_cases, targets, wyoming_cases  # noqa: E402

FLOODS = ((1100, False), (300, True))  # past the Pi's 1,024 descriptors idle; slowloris half-headers


def attack_serve(folder: Path, home: Path) -> dict:
    bundle = targets.small_vision_bundle(folder / "vision")
    with targets.serve(folder, home=home, vision_bundle=bundle) as t:
        outcomes = http.run(t.port, serve_cases.every_case("vision"), process_alive=t.alive)
        outcomes += [http.flood(t.port, n, half_header=half) for n, half in FLOODS]
        return _summary(t, outcomes)


def attack_wyoming(folder: Path, home: Path) -> dict:
    with targets.wyoming(folder, home=home) as t:
        return _summary(t, wyoming_cases.run(t.port, wyoming_cases.every_case(), process_alive=t.alive))


def attack_kiosk(folder: Path, home: Path) -> dict:
    with targets.kiosk(folder, home=home) as t:
        outcomes = http.run(t.port, dashboard_cases.every_case(), process_alive=t.alive, health="/api/state")
        outcomes += [http.flood(t.port, n, half_header=half, health="/api/state") for n, half in FLOODS]
        return _summary(t, outcomes)


def _summary(t: targets.Target, outcomes: list[http.Outcome]) -> dict:
    rows = http.table(outcomes)
    return {"server": t.name, "alive": t.alive(), "tracebacks": t.tracebacks(), "peak_rss": t.peak_rss(),
            "plan_bytes": t.plan_bytes, "rows": [r.__dict__ for r in rows]}


def print_table(results: list[dict]) -> None:
    print(f"{'server':<16} {'class':<36} {'tried':>5} {'clean':>5} {'errors':>6} {'hangs':>5} {'crashes':>7} {'slowest s':>9}")
    for res in results:
        for r in res["rows"]:
            print(f"{res['server']:<16} {r['klass'][:36]:<36} {r['tried']:>5} {r['clean']:>5} {r['errors']:>6} "
                  f"{r['hangs']:>5} {r['crashes']:>7} {r['slowest_s']:>9.2f}")
        mib = lambda b: "?" if b is None else f"{b / 2**20:.0f}"  # noqa: E731
        print(f"{res['server']:<16} tracebacks in log {res['tracebacks']}, peak RSS {mib(res['peak_rss'])} MiB "
              f"of a {mib(res['plan_bytes'])} MiB plan, alive after: {res['alive']}")
        for r in res["rows"]:
            for bad in r["bad"]:
                print(f"  NOT CLEAN {r['klass']}: {bad}")


ATTACKS = {"serve": attack_serve, "wyoming": attack_wyoming, "kiosk": attack_kiosk}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--keep", type=Path, metavar="DIR", help="work in DIR and keep the servers' logs there")
    args = parser.parse_args()
    home = Path(os.environ.get("EDGERUN_HOME", Path.home() / ".edgerun"))
    results = []
    with tempfile.TemporaryDirectory(prefix="edgerun-hostile-") as tmp:
        for name in args.only:
            folder = (args.keep or Path(tmp)) / name
            folder.mkdir(parents=True)
            results.append(ATTACKS[name](folder, home))
    print_table(results)
    out = Path(__file__).resolve().parent / "results" / "hostile.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": os.uname().machine, "load": os.getloadavg(), "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
