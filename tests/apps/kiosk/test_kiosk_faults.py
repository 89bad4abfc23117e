"""A kiosk whose outputs fail: the PLC journal on a disk that fills up (a full SD card), the audit trail on one.

The real kiosk (a tiny ONNX bundle, the pipeline, the PLC frame link over ptys to the reference peer, the SQLite
audit trail, the dashboard over real HTTP): a decision the journal refuses latches a ``plc`` fault that
``/api/state`` shows, every later part reaches the PLC as a fail-safe reject until an operator clears it with
``POST /api/faults/clear``, and the audit trail's ``events`` say why and who cleared it. An audit trail on a full
disk is a visible fault and the line goes on deciding. Every dashboard response carries its security headers.
"""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from apps.kiosk.app import Kiosk
from apps.kiosk.config import KioskConfig
from apps.kiosk.dashboard import MAX_CLEAR_BODY, serve_dashboard
from apps.kiosk.faults import FaultKind, FaultLatch
from apps.kiosk.state import KioskState
from apps.kiosk.types import Verdict
from tests.apps.kiosk.kiosk_models import kiosk_bundle, part
from tests.apps.kiosk.small_disk import fill, small_disk
from tests.apps.kiosk.test_kiosk_e2e import Line

WAIT_S = 20.0
TOKEN = "kiosk-fault-token-0123456789abcdef"


def until(check: Callable[[], object], what: str, timeout: float = WAIT_S) -> object:
    end = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return got


def http(url: str, *, body: bytes | None = None, headers: dict[str, str] | None = None,
         method: str | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def state(kiosk: Kiosk) -> dict:
    status, _, body = http(kiosk.dashboard.url + "api/state")
    assert status == 200
    return json.loads(body)


def clear(url: str, operator: str, note: str = "") -> tuple[int, bytes]:
    status, _, body = http(url + "api/faults/clear", body=json.dumps({"operator": operator, "note": note}).encode(),
                           headers={"Content-Type": "application/json"}, method="POST")
    return status, body


def decided(kiosk: Kiosk, n: int) -> dict:
    """The page once ``n`` parts are decided and recorded."""
    return until(lambda: (s := state(kiosk))["counts"]["parts"] >= n and s, f"{n} parts on the dashboard")


def table(db: Path, name: str) -> list[dict]:
    """Every row of the audit trail's table ``name`` ("parts" or "events"), oldest first."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(f"SELECT * FROM {name} ORDER BY id")]
    finally:
        con.close()


def audit_rows(db: Path) -> list[dict]:
    return table(db, "parts")


def audit_events(db: Path) -> list[dict]:
    return table(db, "events")


@pytest.fixture
def line(tmp_path: Path):
    ln = Line(tmp_path)
    yield ln
    ln.close()


def kiosk_config(tmp: Path, line: Line, **kw) -> KioskConfig:
    (tmp / "belt").mkdir(exist_ok=True)  # a watched folder nothing arrives in: the test submits the parts itself
    base = KioskConfig(source=str(tmp / "belt"), watch=True, model=str(kiosk_bundle(tmp / "bundle", "1")),
                       plc=line.a.url, plc_journal=tmp / "journal.db", audit_db=tmp / "audit.db", dashboard=True,
                       port=0, deadline_ms=10_000, threads=1, audit_min_free=0)
    return replace(base, **kw)


class FullDisk:
    """The journal on a tmpfs that is filled to the last byte, then given room again."""

    def __init__(self, disk: Path) -> None:
        self.disk = disk
        self.filler: Path | None = None

    def attach(self, kiosk: Kiosk) -> None:
        pass

    def break_(self) -> None:
        self.filler = fill(self.disk)

    def mend(self) -> None:
        self.filler.unlink()


class RefusedAppend(FullDisk):
    """Where no tmpfs can be mounted: the journal's append refuses as SQLite does on a full disk."""

    def attach(self, kiosk: Kiosk) -> None:
        journal = kiosk.plc.journal
        real = journal.append
        self.broken = False

        def append(*args, **kwargs):
            if self.broken:
                raise sqlite3.OperationalError("database or disk is full")
            return real(*args, **kwargs)

        journal.append = append

    def break_(self) -> None:
        self.broken = True

    def mend(self) -> None:
        self.broken = False


@pytest.mark.parametrize("how", ["tmpfs", "refused"])
def test_a_journal_that_cannot_write_latches_a_fault_and_rejects_until_cleared(tmp_path: Path, line: Line,
                                                                                how: str) -> None:
    with small_disk(tmp_path / "disk", "4m") if how == "tmpfs" else _nothing(tmp_path / "disk") as disk:
        faults = FullDisk(disk) if how == "tmpfs" else RefusedAppend(disk)
        kiosk = Kiosk(kiosk_config(tmp_path, line, plc_journal=disk / "journal.db"), plc_drain_s=15)
        kiosk.start()
        try:
            faults.attach(kiosk)
            for seq in (1, 2, 3):
                kiosk.submit(part(seq, "good"))
            assert not decided(kiosk, 3)["faults"]["latched"]

            faults.break_()  # the SD card is full
            kiosk.submit(part(4, "good"))
            shown = until(lambda: (s := state(kiosk))["faults"]["latched"] and s, "the latched fault on /api/state")
            (fault,) = shown["faults"]["active"]
            assert (fault["kind"], fault["part"], fault["rejecting"]) == ("plc", 4, True)
            assert "part 4 (pass) did not reach the PLC journal" in fault["message"] and "full" in fault["message"]
            assert shown["faults"]["rejecting"] is True

            faults.mend()  # room again: still latched, and the parts go out as rejects
            for seq in (5, 6):
                kiosk.submit(part(seq, "good"))
            page = decided(kiosk, 6)
            assert page["faults"]["latched"] and page["counts"]["reject"] == 3 and page["counts"]["pass"] == 3
            assert page["last"]["reason"].startswith("fault_latched: the plc fault since ")

            status, body = clear(kiosk.dashboard.url, "ana", "SD card swapped")
            assert status == 200
            answer = json.loads(body)
            assert [f["kind"] for f in answer["cleared"]] == ["plc"] and not answer["faults"]["latched"]
            assert state(kiosk)["faults"]["active"] == []
            kiosk.submit(part(7, "good"))
            assert decided(kiosk, 7)["last"]["verdict"] == "pass"
        finally:
            kiosk.close()
    summary = kiosk.summary()
    assert summary["output_errors"] == {"plc": 1} and summary["faults"]["cleared_total"] == 1
    at_plc = {m.seq: (m.verdict, m.failsafe) for _, m in line.applied()}
    assert at_plc == {1: (Verdict.PASS, False), 2: (Verdict.PASS, False), 3: (Verdict.PASS, False),
                      5: (Verdict.REJECT, True), 6: (Verdict.REJECT, True), 7: (Verdict.PASS, False)}
    rows = {r["seq"]: r for r in audit_rows(tmp_path / "audit.db")}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6, 7]
    assert (rows[4]["verdict"], rows[4]["failsafe"]) == ("reject", 1)
    assert rows[4]["reason"].startswith("plc_fault: pass not delivered to the PLC: ")  # the PLC never heard of it
    assert all(rows[s]["reason"].startswith("fault_latched: ") and rows[s]["verdict"] == "reject" for s in (5, 6))
    events = [(e["kind"], e["action"], e["operator"]) for e in audit_events(tmp_path / "audit.db")]
    assert events == [("plc", "latched", None), ("plc", "cleared", "ana")]
    latched, cleared = audit_events(tmp_path / "audit.db")
    assert "part 4" in latched["message"] and "SD card swapped" in cleared["message"]


class _nothing:
    """The folder itself, for the variant that needs no file system of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def __exit__(self, *exc: object) -> None:
        pass


def test_an_audit_trail_on_a_full_disk_is_a_fault_and_the_line_goes_on(tmp_path: Path, line: Line) -> None:
    with small_disk(tmp_path / "disk", "2m") as disk:
        kiosk = Kiosk(kiosk_config(tmp_path, line, audit_db=disk / "audit.db"), plc_drain_s=15)
        kiosk.start()
        try:
            filler = fill(disk)
            for seq in (1, 2):
                kiosk.submit(part(seq, "good"))
            page = decided(kiosk, 2)  # the dashboard got both: the recorder did not die with the audit row
            (fault,) = page["faults"]["active"]
            assert fault["kind"] == "audit" and not fault["rejecting"] and fault["count"] >= 2
            assert "the row of part 1 was not written" in fault["message"] and "full" in fault["message"]
            filler.unlink()
            kiosk.submit(part(3, "good"))
            assert decided(kiosk, 3)["last"]["verdict"] == "pass"  # an audit fault does not reject
            until(lambda: state(kiosk)["audit"] and state(kiosk)["audit"]["rows"] == 1, "the audit stats on the page")
            assert clear(kiosk.dashboard.url, "ben")[0] == 200
        finally:
            kiosk.close()
        rows = audit_rows(disk / "audit.db")
        events = [(e["kind"], e["action"], e["operator"]) for e in audit_events(disk / "audit.db")]
    at_plc = [(m.seq, m.verdict) for _, m in line.applied()]
    assert at_plc == [(1, Verdict.PASS), (2, Verdict.PASS), (3, Verdict.PASS)]  # the PLC got every decision
    assert [r["seq"] for r in rows] == [3]
    assert events == [("audit", "latched", None), ("audit", "cleared", "ben")]  # written once there was room
    assert kiosk.summary()["output_errors"]["audit"] == 2


# --- the dashboard's side ------------------------------------------------------------------------------------------


def test_every_dashboard_response_carries_the_security_headers() -> None:
    state = KioskState(temperature=None)
    with serve_dashboard(state, port=0, token=TOKEN) as dash:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        for path, headers, method, expected in (("", bearer, None, 200), ("api/state", bearer, None, 200),
                                                ("app.js", bearer, None, 200), ("api/state", {}, None, 401),
                                                ("api/frame/latest", bearer, None, 404), ("no/such/page", bearer, None, 404),
                                                ("api/faults/clear", bearer, "GET", 405)):
            status, got, _ = http(dash.url + path, headers=headers, method=method)
            assert status == expected, path
            assert got.get("cross-origin-resource-policy") == "same-origin", (path, status)
            assert got.get("x-content-type-options") == "nosniff" and "default-src 'none'" in got["content-security-policy"]
        with urllib.request.urlopen(urllib.request.Request(dash.url + "events", headers=bearer), timeout=10) as stream:
            assert stream.headers["Cross-Origin-Resource-Policy"] == "same-origin"
            assert stream.headers["Cache-Control"] == "no-cache"  # the stream's own, not overwritten


def test_the_clear_action_refuses_in_one_line_what_it_cannot_take() -> None:
    latch = FaultLatch()
    latch.latch(FaultKind.PLC, "journal: database or disk is full", part=9)
    state = KioskState(temperature=None, faults=latch)
    json_type = {"Content-Type": "application/json"}
    with serve_dashboard(state, port=0) as dash:
        url = dash.url + "api/faults/clear"
        for body, headers, expected, says in (
            (b'{"operator": "ana"}', {}, 415, "Content-Type: application/json"),  # what a cross-site form sends
            (b"not json", json_type, 400, "not JSON"),
            (b'["ana"]', json_type, 400, "nothing else"),
            (b'{"operator": "ana", "force": true}', json_type, 400, "nothing else"),
            (b'{"operator": "ana\\nroot"}', json_type, 400, "operator"),
            (b'{"operator": "ana", "note": "' + b"x" * 300 + b'"}', json_type, 400, "note"),
            (b'{"operator": "ana"}', {**json_type, "Origin": "http://evil.example"}, 403, "another site"),
            (b'{"operator": "ana"}', {**json_type, "Sec-Fetch-Site": "cross-site"}, 403, "another site"),
            (b'{"operator": "' + b"a" * MAX_CLEAR_BODY + b'"}', json_type, 413, "at most"),
        ):
            status, _, answer = http(url, body=body, headers=headers, method="POST")
            text = answer.decode()
            assert (status, says in text, text.count("\n")) == (expected, True, 1), (body[:40], status, text)
            assert latch.rejecting() is not None  # still latched
        origin = {**json_type, "Origin": dash.url.rstrip("/"), "Sec-Fetch-Site": "same-origin"}  # the page itself
        status, _, answer = http(url, body=b'{"operator": "ana"}', headers=origin, method="POST")
        assert status == 200 and json.loads(answer)["cleared"][0]["part"] == 9
        assert latch.rejecting() is None and latch.cleared_total == 1
        status, _, answer = http(url, body=b'{"operator": "ana"}', headers=json_type, method="POST")
        assert status == 200 and json.loads(answer)["cleared"] == []  # nothing latched: nothing to clear
