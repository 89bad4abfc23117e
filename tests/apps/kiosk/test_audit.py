"""The audit trail: one row per part in SQLite (WAL), reject pictures with heat maps, a seeded sample of passes,
a disk quota enforced oldest-first, rows and files consistent after a crash, CSV export since a time."""

from __future__ import annotations

import csv
import io
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import cv2
import numpy as np
import pytest

from apps.kiosk.audit import AuditTrail
from apps.kiosk.audit_export import CSV_COLUMNS, export_csv
from apps.kiosk.types import Decision, Verdict
from runtime.errors import BadInput

REPO = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc).timestamp()


def picture(seq: int, size: int = 48) -> np.ndarray:
    return np.random.default_rng(seq).integers(0, 256, (size, size + 16, 3), dtype=np.uint8)


def decision(seq: int, verdict: Verdict, *, failsafe: bool = False, heat: bool = False, frame_id: str | None = None) -> Decision:
    heatmap = np.linspace(0, 1, 12 * 16, dtype=np.float32).reshape(12, 16) if heat else None  # smaller than the picture
    return Decision(
        seq=seq, frame_id=frame_id or f"belt-{seq:05d}", verdict=verdict, reason="deadline" if failsafe else "score",
        label=None if heat else "good", score=0.1 * (seq % 10), confidence=0.9, failsafe=failsafe, model="parts",
        version="3", latency_ms={"capture": 1.0, "queue": 2.0, "preprocess": 3.0, "infer": 4.0 + seq, "decide": 0.5, "total": 10.5 + seq},
        heatmap=heatmap,
    )  # fmt: skip


def rows(db: Path) -> list[sqlite3.Row]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return con.execute("SELECT * FROM parts ORDER BY id").fetchall()
    finally:
        con.close()


def files_on_disk(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def named_files(db: Path) -> set[str]:
    return {n for r in rows(db) for n in (r["image"], r["heatmap"]) if n}


def test_a_row_per_part_pictures_of_rejects_and_a_seeded_sample_of_passes(tmp_path):
    kinds = [Verdict.PASS] * 3 + [Verdict.REJECT, Verdict.REVIEW]
    decisions = [decision(i, kinds[i % 5], heat=i % 10 == 3) for i in range(100)]
    decisions.append(decision(100, Verdict.REJECT, failsafe=True))  # a corrupt frame: no picture to keep
    kept_passes = []
    for seed in (7, 7, 8):
        db = tmp_path / f"audit-{len(kept_passes)}.db"
        with AuditTrail(db, pass_sample=0.25, seed=seed) as audit:
            for d in decisions:
                audit.record(d, None if d.failsafe else picture(d.seq))
            assert audit.flush()
            stats = audit.stats()
            images = audit.images
        assert stats["rows"] == 101 and stats["pictures_dropped"] == stats["pictures_queued"] == 0
        assert stats["picture_bytes"] == sum(p.stat().st_size for p in images.iterdir())
        got = rows(db)
        kept_passes.append({r["seq"] for r in got if r["verdict"] == "pass" and r["image"]})
    assert len(got) == 101 and [r["seq"] for r in got] == list(range(101))
    first = got[3]
    assert (first["frame_id"], first["model"], first["version"], first["verdict"], first["reason"], first["label"]) == (
        "belt-00003", "parts", "3", "reject", "score", None)  # fmt: skip
    assert (first["infer_ms"], first["total_ms"], first["failsafe"]) == (7.0, 13.5, 0)
    assert (got[100]["failsafe"], got[100]["reason"], got[100]["image"]) == (1, "deadline", None)
    for r in got[:100]:
        if r["verdict"] != "pass":  # every reject and review has its picture, exactly as captured (PNG, RGB)
            assert np.array_equal(cv2.imread(str(images / r["image"]))[:, :, ::-1], picture(r["seq"]))
        assert (r["heatmap"] is not None) == (r["verdict"] != "pass" and r["seq"] % 10 == 3)
        if r["heatmap"]:
            overlay = cv2.imread(str(images / r["heatmap"]))
            assert overlay.shape == picture(0).shape and not np.array_equal(overlay[:, :, ::-1], picture(r["seq"]))
    passes = sum(d.verdict == Verdict.PASS for d in decisions)
    assert 0 < len(kept_passes[0]) < passes  # a sample, not all and not none
    assert kept_passes[0] == kept_passes[1] != kept_passes[2]  # the same seed keeps the same passes
    assert files_on_disk(images) == named_files(db)
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_heat_picture_is_the_dashboards_overlay(tmp_path):
    from apps.kiosk.overlay import blend

    d = decision(3, Verdict.REJECT, heat=True)
    with AuditTrail(tmp_path / "audit.db") as audit:
        audit.record(d, picture(3))
        assert audit.flush()
        images = audit.images
    (row,) = rows(tmp_path / "audit.db")
    saved = cv2.imread(str(images / row["heatmap"]))[:, :, ::-1]  # PNG: lossless
    assert np.array_equal(saved, blend(picture(3), d.heatmap))  # one overlay for the audit trail and the dashboard


def test_quota_deletes_the_oldest_pictures_first(tmp_path):
    db = tmp_path / "audit.db"
    with AuditTrail(db, quota_bytes=10**9) as probe:  # the size of one picture, to set the quota from
        probe.record(decision(0, Verdict.REJECT), picture(0))
        assert probe.flush()
        one = probe.picture_bytes
    db.unlink()
    quota = int(one * 3.5)
    with AuditTrail(db, images=tmp_path / "pictures", quota_bytes=quota) as audit:
        for i in range(12):
            audit.record(decision(i, Verdict.REJECT), picture(i))
            assert audit.flush()
            on_disk = sum(p.stat().st_size for p in audit.images.iterdir())
            assert on_disk == audit.picture_bytes <= quota
    got = rows(db)
    assert len(got) == 12  # the decisions stay; only the pictures go
    assert [r["seq"] for r in got if r["image"]] == [9, 10, 11]  # the newest three fit
    assert files_on_disk(tmp_path / "pictures") == named_files(db)


def test_reopen_after_a_crash_makes_rows_and_files_agree(tmp_path):
    db = tmp_path / "audit.db"
    with AuditTrail(db) as audit:
        for i in range(5):
            audit.record(decision(i, Verdict.REJECT, heat=True), picture(i))
        images = audit.images
    (images / "999-reject.png").write_bytes(b"written, renamed, row never committed")
    (images / "1000-reject.png.tmp").write_bytes(b"half a picture")
    (images / "notes.txt").write_text("not ours: left alone")
    (images / rows(db)[1]["image"]).unlink()  # a picture lost (a disk error, someone's rm)
    with AuditTrail(db) as audit:
        assert audit.picture_bytes == sum(p.stat().st_size for p in images.iterdir() if p.suffix == ".png")
    got = rows(db)
    assert got[1]["image"] is None and got[1]["heatmap"] is None  # the surviving heat map went with it
    assert all(r["image"] for i, r in enumerate(got) if i != 1)
    assert files_on_disk(images) == named_files(db) | {"notes.txt"}


def test_a_writer_that_falls_behind_drops_pictures_never_rows(tmp_path):
    db = tmp_path / "audit.db"
    big = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)  # tens of ms to encode
    with AuditTrail(db, queue=1) as audit:
        for i in range(30):  # a burst of rejects, faster than pictures are written
            audit.record(decision(i, Verdict.REJECT), big)
        dropped = audit.pictures_dropped
    got = rows(db)
    assert len(got) == 30 and 0 < dropped < 30
    assert sum(r["image"] is None for r in got) == dropped  # counted, and the rows say which
    assert files_on_disk(audit.images) == named_files(db)


WRITER = """
import sys, numpy as np
from apps.kiosk.audit import AuditTrail
from apps.kiosk.types import Decision, Verdict
pixels = np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
heat = np.random.default_rng(1).random((24, 32), dtype=np.float32)
with AuditTrail(sys.argv[1], quota_bytes=int(sys.argv[2])) as audit:
    for i in range(10**9):
        d = Decision(i, f"f{i}", Verdict.REJECT, "score", None, 0.9, 0.9, False, "m", "1", {"total": 1.0}, heat)
        audit.record(d, pixels)
        if i == 20:
            print("writing", flush=True)
"""


def test_killed_mid_write_leaves_a_consistent_trail(tmp_path):
    db = tmp_path / "audit.db"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(300_000)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline() == "writing\n"
    time.sleep(0.5)  # writing, renaming and deleting pictures (the quota) when the kill comes
    proc.send_signal(signal.SIGKILL)
    proc.wait(5)
    with AuditTrail(db, quota_bytes=300_000) as audit:
        images = audit.images
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    got = rows(db)
    assert [r["id"] for r in got] == list(range(1, len(got) + 1)) and len(got) > 20  # every committed row
    assert files_on_disk(images) == named_files(db)  # no picture without a row, no row naming a missing picture
    assert 0 < sum(p.stat().st_size for p in images.iterdir()) <= 300_000


def test_export_csv_since_a_time(tmp_path):
    db = tmp_path / "audit.db"
    with AuditTrail(db) as audit:
        for i in range(10):
            name = "=HYPERLINK(evil)" if i == 7 else None  # a frame id from a file name
            audit.record(decision(i, Verdict.REJECT if i % 2 else Verdict.PASS, frame_id=name), picture(i), at=T0 + 60 * i,
                         scores={"good": 0.2, "scratch": 0.8})  # fmt: skip
        assert audit.flush()
        buffer = io.StringIO()
        assert audit.export_csv(datetime.fromtimestamp(T0 + 300, timezone.utc), buffer) == 5
        out = tmp_path / "report.csv"
        assert export_csv(db, T0 + 300, out) == 5  # read-only, beside the open trail
    assert out.read_text() == buffer.getvalue()
    got = list(csv.DictReader(io.StringIO(buffer.getvalue())))
    assert list(got[0]) == CSV_COLUMNS
    assert [r["seq"] for r in got] == ["5", "6", "7", "8", "9"]
    assert got[0]["time"] == "2026-12-01T08:05:00.000Z"
    assert got[2]["frame_id"] == "'=HYPERLINK(evil)"  # not a formula when a spreadsheet opens it
    assert got[0]["scores"] == '{"good": 0.2, "scratch": 0.8}' and got[0]["infer_ms"] == "9.0"
    assert all(Path(r["image"]).is_file() for r in got if r["verdict"] == "reject")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"quota_bytes": -1}, "quota -1"),
        ({"pass_sample": 1.5}, "pass sample 1.5"),  # a fraction
        ({"image_format": "gif"}, "valid: png, jpg"),
    ],
)
def test_settings_are_checked(tmp_path, kwargs, message):
    with pytest.raises(BadInput, match=message):
        AuditTrail(tmp_path / "audit.db", **kwargs)


def test_not_a_database_is_one_line(tmp_path):
    db = tmp_path / "audit.db"
    db.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(BadInput, match="not a usable SQLite database"):
        AuditTrail(db)
    with pytest.raises(BadInput, match="cannot be read"):
        export_csv(db, 0, tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists()  # no half-written report


@pytest.fixture
def trail(tmp_path):
    db = tmp_path / "audit.db"
    with AuditTrail(db) as audit:
        for i in range(6):
            audit.record(decision(i, Verdict.REJECT if i % 3 == 0 else Verdict.PASS), picture(i), at=T0 + 3600 * i)
    return db


def test_report_command_writes_the_csv(trail, tmp_path, capsys):
    from apps.cli import main

    out = tmp_path / "parts.csv"
    assert main(["kiosk", "report", "--since", "2026-12-01T10:00Z", "--db", str(trail), "--out", str(out)]) == 0
    got = list(csv.DictReader(out.open()))
    assert [(r["seq"], r["verdict"]) for r in got] == [("2", "pass"), ("3", "reject"), ("4", "pass"), ("5", "pass")]
    assert "4 parts since 2026-12-01T10:00:00+00:00 to" in capsys.readouterr().err
    assert main(["kiosk", "report", "--since", "2026-12-01T12:30+01:00", "--db", str(trail)]) == 0  # 11:30 UTC
    assert [line.split(",")[1] for line in capsys.readouterr().out.splitlines()[1:]] == ["4", "5"]


def test_naive_since_is_local_time(monkeypatch):
    from apps.kiosk.report_cmd import since_time

    monkeypatch.setenv("TZ", "CET-1")  # POSIX TZ: one hour east of UTC, no tz database needed
    time.tzset()
    try:
        assert since_time("2026-12-01T09:00") == datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
        assert since_time("2026-12-01") == datetime(2026, 11, 30, 23, 0, tzinfo=timezone.utc)
    finally:
        monkeypatch.undo()
        time.tzset()
    ago = datetime.now(timezone.utc) - since_time("24h")
    assert abs(ago.total_seconds() - 86400) < 5


@pytest.mark.parametrize(
    "since, message",
    [
        ("2026-13-01", "is not a time"),  # month 13
        ("yesterday", "is not a time"),
        ("12345678d", "is not a time"),  # an age of more than 7 digits is not parsed at all
        ("4000d", "more than 3650 days"),
        ("1969-12-31", "before 1970"),
        ("9999-01-01T00:00Z", "in the future"),
        ("2026-12-01T00:00" + " " * 30 + "x", "too long"),
    ],
)
def test_report_refuses_a_bad_since_in_one_line(trail, capsys, since, message):
    from apps.cli import main

    assert main(["kiosk", "report", "--since", since, "--db", str(trail)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_report_without_a_database_is_one_line(tmp_path, capsys):
    from apps.cli import main

    assert main(["kiosk", "report", "--since", "24h", "--db", str(tmp_path / "none.db")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and err.count("\n") == 1
    assert not (tmp_path / "none.db").exists()  # a report never creates a database


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("a file where the kiosk's folder should be")
    with pytest.raises(BadInput, match="cannot create the audit trail's folders"):
        AuditTrail(tmp_path / "file" / "kiosk" / "audit.db")
