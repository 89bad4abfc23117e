"""The audit trail on a real disk: a committed row and its picture survive a power cut (fsync order, synchronous=FULL),
rows and pictures are deleted oldest first by age, by a database quota and to keep a free-space floor, and a full
disk is a reported fault, never a crash."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from apps.kiosk import audit as audit_module
from apps.kiosk.audit import AuditTrail, AuditWriteError
from apps.kiosk.config import parse_config
from apps.kiosk.retention import Retention, used_bytes
from apps.kiosk.types import Decision, Verdict
from runtime.errors import BadInput
from tests.apps.kiosk.small_disk import fill, free, small_disk
from tests.apps.kiosk.test_kiosk_faults import audit_rows

DAY = 86400.0
NO_FLOOR = Retention(min_free_bytes=0)


def decision(seq: int, verdict: Verdict = Verdict.REJECT) -> Decision:
    return Decision(seq, f"belt-{seq:05d}", verdict, "score", "scratch", 0.9, 0.9, False, "parts", "3", {"total": 5.0})


def noise(seq: int, side: int = 64) -> np.ndarray:
    """Random pixels: a PNG that does not compress, so a picture's size is about side*side*3 bytes."""
    return np.random.default_rng(seq).integers(0, 256, (side, side, 3), dtype=np.uint8)


def rows(db: Path) -> list[dict]:
    return audit_rows(db)


def named(db: Path) -> set[str]:
    return {n for r in rows(db) for n in (r["image"], r["heatmap"]) if n}


def pictures(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# --- durability --------------------------------------------------------------------------------------------------


def test_a_picture_is_on_disk_with_its_name_before_its_row_names_it(tmp_path, monkeypatch):
    """Power-cut order: file data fsynced, renamed into place, the folder fsynced, and only then the row names it;
    the row itself is committed with synchronous=FULL."""
    db = tmp_path / "audit.db"
    steps: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith("audit-images"):  # the folder: does a row name a picture yet?
            con = sqlite3.connect(db)
            try:
                steps.append(("fsync dir", str(con.execute("SELECT image FROM parts WHERE seq = 7").fetchone()[0])))
            finally:
                con.close()
        else:
            steps.append(("fsync", Path(path).name))
        real_fsync(fd)

    def replace(src, dst) -> None:
        steps.append(("rename", f"{Path(src).name} -> {Path(dst).name}"))
        real_replace(src, dst)

    with AuditTrail(db, retention=NO_FLOOR) as audit:
        assert audit._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: the WAL is fsynced per commit
        monkeypatch.setattr(audit_module.os, "fsync", fsync)
        monkeypatch.setattr(audit_module.os, "replace", replace)
        rid = audit.record(decision(7), noise(7))
        assert audit.flush(10)
        monkeypatch.undo()
    name = f"{rid}-reject.png"
    assert steps == [("fsync", name + ".tmp"), ("rename", f"{name}.tmp -> {name}"), ("fsync dir", "None")], steps
    assert rows(db)[0]["image"] == name  # named once it was safe to


# --- retention -----------------------------------------------------------------------------------------------------


def test_rows_past_the_max_age_go_oldest_first_with_their_pictures(tmp_path, monkeypatch):
    db = tmp_path / "audit.db"
    now = time.time()
    with AuditTrail(db, retention=NO_FLOOR) as audit:
        for seq in range(10):  # ten days of a line, one part a day, then three parts today
            audit.record(decision(seq), noise(seq, 16), at=now - (10 - seq) * DAY)
        for seq in range(10, 13):
            audit.record(decision(seq), noise(seq, 16), at=now - 60)
        assert audit.flush(10)
        images = audit.images
    assert len(rows(db)) == 13
    with AuditTrail(db, retention=Retention(max_age_s=4.5 * DAY, min_free_bytes=0)) as audit:  # applied on open
        stats = audit.stats()
    left = rows(db)
    assert [r["seq"] for r in left] == [6, 7, 8, 9, 10, 11, 12]  # younger than 4.5 days
    assert stats["pruned"]["rows_by_age"] == 6 and stats["pruned"]["pictures_with_rows"] == 6
    assert stats["rows"] == 7 and stats["recorded"] == 13
    assert pictures(images) == named(db) and len(named(db)) == 7  # the old rows' pictures went with them

    # the newest row is never deleted (its id would be reused); a running trail applies the age at most every
    # MAINTAIN_EVERY_S, and then the last old row goes
    monkeypatch.setattr(audit_module, "MAINTAIN_EVERY_S", 0.0)
    with AuditTrail(db, retention=Retention(max_age_s=30.0, min_free_bytes=0)) as audit:
        assert [r["seq"] for r in rows(db)] == [12] and audit.pruned["rows_by_age"] == 6
        audit.record(decision(13), at=time.time())
        assert audit.pruned["rows_by_age"] == 7
    assert [(r["id"], r["seq"]) for r in rows(db)] == [(14, 13)] and pictures(images) == set()


def test_the_database_quota_deletes_the_oldest_rows_and_the_file_stops_growing(tmp_path, monkeypatch):
    monkeypatch.setattr(audit_module, "MAINTAIN_EVERY_S", 0.0)  # every record() applies it: the bound is exact
    db = tmp_path / "audit.db"
    quota = 96 << 10
    with AuditTrail(db, retention=Retention(db_quota_bytes=quota, min_free_bytes=0)) as audit:
        for seq in range(1500):  # ~300 bytes a row with its index entries: ~500 rows fit
            audit.record(decision(seq, Verdict.PASS))
            if seq % 100 == 99:
                assert used_bytes(audit._db) <= quota, seq
        stats = audit.stats()
        size = db.stat().st_size
    left = rows(db)
    assert stats["db_bytes"] <= quota and stats["pruned"]["rows_by_db_quota"] > 0
    assert left[-1]["seq"] == 1499 and 200 < len(left) < 1500  # the newest kept, the oldest gone
    assert [r["id"] for r in left] == list(range(left[0]["id"], 1501))  # one run of ids: oldest first, no holes
    assert stats["rows"] == len(left) and stats["pruned"]["rows_by_db_quota"] == 1500 - len(left)
    assert size <= 2 * quota  # freed pages are reused: the file does not grow with the parts


def test_a_floor_that_cannot_be_kept_removes_pictures_oldest_first_and_keeps_new_ones_out(tmp_path):
    """The floor checked against the real file system: above all the space there is, so nothing fits."""
    db = tmp_path / "audit.db"
    with AuditTrail(db, retention=NO_FLOOR) as audit:
        for seq in range(6):
            audit.record(decision(seq), noise(seq))
        assert audit.flush(10)
        images = audit.images
    assert len(pictures(images)) == 6
    unreachable = free(tmp_path) + (1 << 40)
    with AuditTrail(db, retention=Retention(min_free_bytes=unreachable)) as audit:
        assert audit.low_space and pictures(images) == set()  # every picture went, oldest first, at open
        audit.record(decision(6), noise(6))
        assert audit.flush(10)
        stats = audit.stats()
    assert stats["pruned"]["pictures_for_free_space"] == 6 and stats["pictures_skipped"] == 1
    assert stats["low_space"] is True and stats["min_free_bytes"] == unreachable
    assert rows(db)[-1]["seq"] == 6 and rows(db)[-1]["image"] is None  # the row is still written, not its picture
    assert pictures(images) == named(db) == set()


def test_on_a_small_disk_the_floor_is_kept_and_the_newest_pictures_stay(tmp_path):
    with small_disk(tmp_path / "disk", "3m") as disk:
        floor = 1 << 20
        with AuditTrail(disk / "audit.db", retention=Retention(min_free_bytes=floor)) as audit:
            for seq in range(30):  # ~50 KB each: 1.5 MB of pictures on a disk that keeps 1 MiB of 3 free
                audit.record(decision(seq), noise(seq, 128))
                assert audit.flush(10)
                assert free(disk) >= floor, seq
            stats = audit.stats()
            kept = sorted(r["seq"] for r in rows(disk / "audit.db") if r["image"])
            on_disk = pictures(audit.images) == named(disk / "audit.db")
    assert stats["pruned"]["pictures_for_free_space"] > 0 and on_disk
    assert kept and kept == list(range(30 - len(kept), 30))  # the newest stayed, the oldest went first


# --- a full disk -----------------------------------------------------------------------------------------------------


def test_a_full_disk_is_a_reported_fault_and_the_trail_goes_on_once_there_is_room(tmp_path):
    faults: list[str] = []
    with small_disk(tmp_path / "disk", "2m") as disk:
        with AuditTrail(disk / "audit.db", retention=NO_FLOOR, on_fault=faults.append) as audit:
            audit.record(decision(0), noise(0))
            assert audit.flush(10)
            filler = fill(disk, leave=48 << 10)  # room for a row, not for a 150 KB picture
            audit.record(decision(1), noise(1, 224))
            assert audit.flush(10)
            assert len(faults) == 1 and "No space left on device" in faults[0] and "part 1" in faults[0]
            fill(disk)  # not a byte left: the row itself cannot be committed
            with pytest.raises(AuditWriteError, match=r"the row of part 2 was not written to .*(full|space)") as err:
                audit.record(decision(2))
            assert "\n" not in str(err.value)
            assert audit.stats()["last_error"] == str(err.value)
            filler.unlink()  # an operator makes room: the same trail writes again
            audit.record(decision(3), noise(3))
            assert audit.flush(10)
            images = audit.images
            got = rows(disk / "audit.db")
            assert [r["seq"] for r in got] == [0, 1, 3]
            assert [bool(r["image"]) for r in got] == [True, False, True]
            assert pictures(images) == named(disk / "audit.db")  # no half-written or temporary file left


# --- configuration ---------------------------------------------------------------------------------------------------


def test_retention_settings_from_kiosk_toml():
    cfg = parse_config({"audit": {"max_age_days": 30, "db_quota": "64M", "min_free": "1G"}})
    assert (cfg.audit_max_age_days, cfg.audit_db_quota, cfg.audit_min_free) == (30.0, 64 << 20, 1 << 30)
    for audit, message in (({"max_age_days": -1}, r"\[audit\] max_age_days -1 is out of range"),
                           ({"db_quota": "1K"}, r"\[audit\] db_quota"),  # below the few pages SQLite needs
                           ({"min_free": "lots"}, r"\[audit\] min_free")):
        with pytest.raises(BadInput, match=message):
            parse_config({"audit": audit})
    with pytest.raises(BadInput, match="audit max age"):
        Retention(max_age_s=float("nan")).checked()
