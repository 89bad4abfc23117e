"""The kiosk's fault soak: a run of parts while its outputs fail in every way a line has seen at once.

The real kiosk (a tiny ONNX bundle, the pipeline, the PLC frame link over ptys to the reference peer, the SQLite
audit trail, the dashboard over HTTP) decides SOAK_PARTS parts of three colours (pass, reject and uncertain ones).
While they run, the audit trail's disk fills up (a small tmpfs filled to the last byte where root can mount one,
else the trail's writes refuse as SQLite does on a full disk), the PLC restarts twice (the reference peer stopped
and started again on its own durable store) and the cable is pulled once. Then:

- every part got exactly one decision at the PLC, or a latched fault on the dashboard accounts for it;
- no part the model rejected reached the PLC as an accept, and the PLC's decision of each part is the audit
  trail's (where the trail could write) and the dashboard's count;
- the audit fault was latched and shown while the disk was full, and its latch and clear are in the trail.

The figures (parts, faults injected, decisions at the PLC, duplicates, time) go to docs/trust.md.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.kiosk.app import Kiosk
from apps.kiosk.types import Verdict
from devices.link.peer import ReferencePeer
from tests.apps.kiosk.kiosk_models import part
from tests.apps.kiosk.small_disk import fill
from tests.apps.kiosk.test_kiosk_faults import audit_events, audit_rows, clear, decided, kiosk_config, line, state, until

pytestmark = pytest.mark.slow
assert line  # the fixture, imported for this module's tests

SOAK_PARTS = 400
COLOURS = ("good", "scratch", "grey", "good", "spot")  # pass, reject, uncertain (review or fail-safe), ...
EXPECTED = {"good": Verdict.PASS, "scratch": Verdict.REJECT, "spot": Verdict.REJECT}
DISK_FULL_AT, DISK_ROOM_AT = 60, 160  # the audit disk is full from part 60 to part 160
PLC_RESTARTS_AT = (120, 300)  # once while the disk is full, once after
CABLE_PULLED_AT, CABLE_DOWN_S = 220, 1.5
GAP_S = 0.02  # between parts: ~50 parts a second offered, the kiosk's own pace decides


class AuditDisk:
    """The audit trail's disk: a tmpfs of its own where it can be mounted, else the trail's writes refused."""

    def __init__(self, folder: Path, mount: bool) -> None:
        self.folder, self.mount, self.mounted, self.filler, self.kiosk = folder, mount, False, None, None
        self.folder.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def mounted_or_not(self) -> Iterator[AuditDisk]:
        import subprocess

        if not self.mount:
            yield self
            return
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", str(self.folder)],
                                  capture_output=True, text=True, timeout=10)
            self.mounted = done.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            self.mounted = False
        try:
            yield self
        finally:
            if self.mounted:
                subprocess.run(["umount", "-l", str(self.folder)], capture_output=True, timeout=10)

    def attach(self, kiosk: Kiosk) -> None:
        self.kiosk, self.broken = kiosk, False
        if self.mounted:
            return
        trail = kiosk.audit
        record, event = trail.record, trail.event

        def refusing(real):
            def call(*args, **kwargs):
                if self.broken:
                    raise sqlite3.OperationalError("database or disk is full")
                return real(*args, **kwargs)
            return call

        trail.record, trail.event = refusing(record), refusing(event)

    def fill(self) -> None:
        if self.mounted:
            self.filler = fill(self.folder)
        self.broken = True

    def make_room(self) -> None:
        if self.filler is not None:
            self.filler.unlink()
        self.broken = False


def restart_plc(line) -> None:
    """The PLC's program restarts: its peer stops (the port closed) and a new one starts on the same store."""
    line.peer.close()
    time.sleep(0.3)
    line.peer = ReferencePeer(line.b.url, line.store)
    line.peer.start()


@pytest.mark.parametrize("disk_kind", ["tmpfs", "refused"])  # tmpfs: the refused writes where it cannot be mounted
def test_the_kiosk_holds_through_a_full_disk_two_plc_restarts_and_a_pulled_cable(tmp_path: Path, line,
                                                                                  disk_kind: str) -> None:
    started = time.monotonic()
    colour = {seq: COLOURS[seq % len(COLOURS)] for seq in range(1, SOAK_PARTS + 1)}
    seen_latched = False
    with AuditDisk(tmp_path / "auditdisk", disk_kind == "tmpfs").mounted_or_not() as disk:
        kiosk = Kiosk(kiosk_config(tmp_path, line, audit_db=disk.folder / "audit.db"), plc_drain_s=30)
        kiosk.start()
        try:
            disk.attach(kiosk)
            for seq in range(1, SOAK_PARTS + 1):
                if seq == DISK_FULL_AT:
                    decided(kiosk, seq - 1)  # the rows before it are written
                    disk.fill()
                if seq == DISK_ROOM_AT:
                    page = until(lambda: (s := state(kiosk))["faults"]["latched"] and s, "the audit fault shown")
                    seen_latched = any(f["kind"] == "audit" and not f["rejecting"] for f in page["faults"]["active"])
                    disk.make_room()
                if seq in PLC_RESTARTS_AT:
                    restart_plc(line)
                if seq == CABLE_PULLED_AT:
                    line.cable.pull(line.a, CABLE_DOWN_S)
                kiosk.submit(part(seq, colour[seq]))
                time.sleep(GAP_S)
            page = decided(kiosk, SOAK_PARTS)
            assert until(lambda: kiosk.plc.drain(1.0), "every decision acknowledged by the PLC", 60)
            shown = page["faults"]
            assert clear(kiosk.dashboard.url, "soak", "disk emptied")[0] == 200
        finally:
            kiosk.close()
        rows = {r["seq"]: r for r in audit_rows(disk.folder / "audit.db")}
        events = [(e["kind"], e["action"], e["operator"]) for e in audit_events(disk.folder / "audit.db")]
    summary = kiosk.summary()

    # every part exactly one decision at the PLC (the journal's disk never failed: no PLC fault may account for one)
    at_plc = [m for _, m in line.applied()]
    times = Counter(m.seq for m in at_plc)
    assert sorted(times) == list(range(1, SOAK_PARTS + 1)), "a part without a decision at the PLC"
    assert [s for s, n in times.items() if n > 1] == [], "a part decided twice at the PLC"
    assert not any(f["kind"] == "plc" for f in shown["active"]) and summary["output_errors"].get("plc", 0) == 0
    # no reject reported as an accept: what the model makes of each colour, and the trail's record of each part
    plc = {m.seq: m for m in at_plc}
    for seq, m in plc.items():
        want = EXPECTED.get(colour[seq])
        if want is not None:
            assert m.verdict is want, (seq, colour[seq], m.verdict, m.reason)
        else:  # uncertain: never an accept
            assert m.verdict is not Verdict.PASS, (seq, m.verdict)
    assert rows, "the audit trail wrote nothing"
    for seq, row in rows.items():
        assert Verdict(row["verdict"]) is plc[seq].verdict and bool(row["failsafe"]) == plc[seq].failsafe, seq
    counts = page["counts"]
    assert counts["parts"] == SOAK_PARTS
    assert counts["pass"] == sum(m.verdict is Verdict.PASS for m in at_plc)
    assert counts["reject"] == sum(m.verdict is Verdict.REJECT for m in at_plc)
    # the full disk: latched and shown while it lasted, and accounted for in the trail
    missing = sorted(set(plc) - set(rows))
    assert seen_latched and missing, "the full disk cost no row, or its fault was never shown"
    assert min(missing) >= DISK_FULL_AT and max(missing) < DISK_ROOM_AT + 10, (len(missing), missing[-20:], len(rows))  # only while full
    assert ("audit", "latched", None) in events and ("audit", "cleared", "soak") in events
    assert summary["plc"]["backlog"] == 0
    report = {"parts": SOAK_PARTS, "tmpfs": disk.mounted, "rows_missing": len(missing), "plc_restarts": len(PLC_RESTARTS_AT),
              "cable_pulls": line.cable.stats.pulls, "decisions_at_plc": len(at_plc), "duplicates_at_plc": 0,
              "rejects_as_accepts": 0, "passes": counts["pass"], "rejects": counts["reject"],
              "seconds": round(time.monotonic() - started, 1)}
    print("kiosk soak:", json.dumps(report))
