"""The kiosk app's hand-over of each decision to its outputs (PLC, audit trail, dashboard): bounded bookkeeping
on a line that runs for months, and one output failing or stalling never costs the others a decision."""

from __future__ import annotations

import threading
import time
from collections import deque
from types import SimpleNamespace

import pytest

from apps.kiosk import app as kiosk_app
from apps.kiosk.app import Kiosk
from apps.kiosk.config import KioskConfig
from apps.kiosk.types import Decision, Verdict


class Outputs:
    """Records what each output got (the real outputs are exercised end to end in test_kiosk_e2e)."""

    def __init__(self) -> None:
        self.plc: list[int] = []
        self.audit: list[int] = []
        self.dashboard: list[int] = []

    def send(self, d: Decision) -> int:
        self.plc.append(d.seq)
        return d.seq

    def record(self, d: Decision, image: object = None) -> int:
        self.audit.append(d.seq)
        return d.seq

    def on_decision(self, d: Decision, image: object = None) -> None:
        self.dashboard.append(d.seq)

    def state(self) -> SimpleNamespace:  # the PLC's, for the summary
        return SimpleNamespace(to_dict=lambda: {"backlog": 0})


def decision(seq: int) -> Decision:
    return Decision(seq, f"f{seq}", Verdict.PASS, "good", "good", 0.9, 0.9, False, "m", "1", {"total": 1.0})


def kiosk(outputs: Outputs) -> Kiosk:
    k = Kiosk(KioskConfig(source="parts", model="m", plc="loop://", dashboard=False))
    k.plc = k.audit = k.state = outputs
    return k


def test_bookkeeping_per_part_stays_bounded_and_still_catches_a_second_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiosk_app, "SEEN_WINDOW", 100, raising=False)
    out = Outputs()
    k = kiosk(out)
    k._start_recorder()
    for seq in range(1000):
        k._on_decision(decision(seq))
    k._on_decision(decision(990))  # a part decided again: named
    sizes = {name: len(v) for name, v in vars(k).items() if isinstance(v, (dict, set, list, deque))}
    assert max(sizes.values()) <= 100, sizes  # nothing grows with the parts seen
    assert k._records_idle(10)
    s = k.summary()
    assert (s["decided"], s["twice"]) == (1001, [990])
    assert out.plc == out.audit == out.dashboard == [*range(1000), 990]


class StuckAudit(Outputs):
    """An audit trail on a disk that stops answering until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def record(self, d: Decision, image: object = None) -> int:
        self.release.wait(10)
        return super().record(d, image)


def test_a_stalled_audit_trail_never_holds_up_the_plc() -> None:
    out = StuckAudit()
    k = kiosk(out)
    k._start_recorder()
    line = threading.Thread(target=lambda: [k._on_decision(decision(seq)) for seq in range(20)])
    line.start()
    try:
        end = time.monotonic() + 5
        while len(out.plc) < 20 and time.monotonic() < end:
            time.sleep(0.01)
        assert out.plc == list(range(20)) and out.audit == []  # every part reached the gate; the disk still hangs
    finally:
        out.release.set()
        line.join()
    assert k._records_idle(10)
    assert out.audit == out.dashboard == list(range(20))  # none lost, in order
