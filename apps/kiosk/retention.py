"""How long the audit trail keeps its rows and pictures, and the disk it may use: the oldest go first.

:class:`Retention` is the policy (``[audit]`` in kiosk.toml): rows older than ``max_age_s``, rows past
``db_quota_bytes`` of database pages in use, and, whenever the file system's free space falls under
``min_free_bytes`` (the floor), the oldest pictures and then the oldest rows. :class:`Keeper` carries it out, with the
picture quota, on the trail's connection; :class:`apps.kiosk.audit.AuditTrail` calls it under its lock, and it
counts what went. :meth:`Keeper.reconcile` makes rows and files agree when the trail is opened after a crash.

Order of a deletion, for crash safety: the rows stop naming their files (or are deleted) in one committed
transaction first, then the files are unlinked; a crash in between leaves only files no row names, which opening
the trail removes. The newest row is never deleted, so row ids (and the picture names made from them) are never
reused.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import BadInput

log = logging.getLogger(__name__)

DEFAULT_DB_QUOTA = 2 << 30  # bytes of database pages: ~8M rows, days to weeks of a line at 20 parts/s
DEFAULT_MIN_FREE = 256 << 20  # bytes the audit trail leaves free on its file system
ROW_BATCH = 1000  # rows deleted per statement: one short transaction, never a long stall of record()
MAX_BATCHES = 20  # batches per maintenance pass; what is left over goes at the next pass
PRUNED = ("rows_by_age", "rows_by_db_quota", "rows_for_free_space", "pictures_by_quota", "pictures_for_free_space",
          "pictures_with_rows")  # what Keeper.pruned counts
PICTURE = re.compile(r"^\d{1,19}-(pass|reject|review)(-heat)?\.(png|jpg)$")  # the trail's picture names
TMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class Retention:
    """``max_age_s``: seconds a row is kept (0: no age limit); ``db_quota_bytes``: database pages in use at most
    (0: no limit); ``min_free_bytes``: free space kept on the file system of the pictures and the database."""

    max_age_s: float = 0.0
    db_quota_bytes: int = DEFAULT_DB_QUOTA
    min_free_bytes: int = DEFAULT_MIN_FREE

    def checked(self) -> Retention:
        if not (isinstance(self.max_age_s, (int, float)) and math.isfinite(self.max_age_s) and self.max_age_s >= 0):
            raise BadInput(f"audit max age {self.max_age_s!r} is invalid; give seconds >= 0 (0 keeps rows of any age)")
        for name, value in (("database quota", self.db_quota_bytes), ("free-space floor", self.min_free_bytes)):
            if not (isinstance(value, int) and value >= 0):
                raise BadInput(f"audit {name} {value!r} is invalid; give a number of bytes >= 0")
        return self


def free_bytes(paths: Iterable[Path]) -> int:
    """The least space an unprivileged writer has left on the file systems of ``paths``."""
    free = []
    for path in paths:
        st = os.statvfs(path)
        free.append(st.f_bavail * st.f_frsize)
    return min(free)


def used_bytes(db: sqlite3.Connection) -> int:
    """Bytes of database pages holding data (the file keeps its size; freed pages are reused first)."""
    pages = db.execute("PRAGMA page_count").fetchone()[0] - db.execute("PRAGMA freelist_count").fetchone()[0]
    return int(pages) * int(db.execute("PRAGMA page_size").fetchone()[0])


def free_pages(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA freelist_count").fetchone()[0])


def kept_rows(db: sqlite3.Connection) -> int:
    """Rows kept: rows are only ever deleted oldest first, so the ids left are one run."""
    lo, hi = db.execute("SELECT MIN(id), MAX(id) FROM parts").fetchone()
    return 0 if lo is None else int(hi) - int(lo) + 1


def delete_oldest_rows(db: sqlite3.Connection, images: Path, limit: int, *, older_than: float | None = None) -> tuple[int, int, int]:
    """Delete up to ``limit`` of the oldest rows (only those recorded before ``older_than``, Unix seconds, when
    given; they are the oldest run of ids, so a clock set back never keeps a younger row in place of an older one)
    and their pictures, never the newest row. Returns (rows, pictures, picture bytes) deleted."""
    newest = db.execute("SELECT MAX(id) FROM parts").fetchone()[0]
    if newest is None or limit <= 0:
        return 0, 0, 0
    rows = db.execute("SELECT id, at, image, heatmap, image_bytes FROM parts WHERE id < ? ORDER BY id LIMIT ?",
                      (newest, limit)).fetchall()
    if older_than is not None:
        young = next((i for i, r in enumerate(rows) if r[1] >= older_than), len(rows))
        rows = rows[:young]
    if not rows:
        return 0, 0, 0
    with transaction(db):
        db.execute("DELETE FROM parts WHERE id <= ?", (rows[-1][0],))
    files = [n for _, _, image, heatmap, _ in rows for n in (image, heatmap) if n]
    unlink(images, files)  # the rows are gone: a crash before this leaves only orphans
    return len(rows), sum(1 for r in rows if r[2]), sum(int(r[4]) for r in rows)


def oldest_pictures(db: sqlite3.Connection, limit: int = 64) -> list[tuple[int, str, str | None, int]]:
    return db.execute("SELECT id, image, heatmap, image_bytes FROM parts WHERE image IS NOT NULL ORDER BY id LIMIT ?",
                      (limit,)).fetchall()


def drop_pictures(db: sqlite3.Connection, images: Path, victims: list[tuple[int, str, str | None, int]]) -> int:
    """Clear the rows' picture paths, then delete the files; returns the bytes freed."""
    with transaction(db):
        db.executemany("UPDATE parts SET image = NULL, heatmap = NULL, image_bytes = 0 WHERE id = ?", [(v[0],) for v in victims])
    unlink(images, [n for _, *names, _ in victims for n in names if n])
    return sum(int(v[3]) for v in victims)


def unlink(images: Path, names: list[str]) -> None:
    for name in names:
        try:
            (images / name).unlink(missing_ok=True)
        except OSError as exc:  # left as an orphan: removed when the trail is next opened
            log.warning("audit: cannot delete the picture %s: %s", name, exc.strerror or exc)


class Keeper:
    """The trail's disk use: ``picture_bytes`` kept under ``quota_bytes``, and the :class:`Retention` of rows.
    Every method is called with the trail's lock held (or before its writer starts)."""

    def __init__(self, db: sqlite3.Connection, images: Path, db_dir: Path, quota_bytes: int, policy: Retention) -> None:
        self.db, self.images, self.paths = db, images, (images, db_dir)
        self.quota_bytes, self.policy = quota_bytes, policy.checked()
        self.picture_bytes = 0
        self.pruned: Counter[str] = Counter({k: 0 for k in PRUNED})
        self.low_space = False  # the file system is under the floor (the oldest pictures, then rows, go)

    def added(self, size: int) -> None:
        """A picture of ``size`` bytes is named by its row now."""
        self.picture_bytes += size
        self.enforce_quota()

    def enforce_quota(self) -> None:
        """Delete the oldest pictures until the total fits the quota."""
        while self.picture_bytes > self.quota_bytes:
            rows = oldest_pictures(self.db)
            if not rows:
                self.picture_bytes = 0
                return
            victims, freed = [], 0
            for victim in rows:
                victims.append(victim)
                freed += victim[3]
                if self.picture_bytes - freed <= self.quota_bytes:
                    break
            freed = drop_pictures(self.db, self.images, victims)
            self.picture_bytes -= freed
            self.pruned["pictures_by_quota"] += len(victims)
            log.info("audit quota: deleted the %d oldest pictures (%d bytes)", len(victims), freed)

    def maintain(self) -> None:
        """Apply the retention: rows past the age, rows past the database quota, then the free-space floor."""
        db, r = self.db, self.policy
        if r.max_age_s > 0:
            cutoff = time.time() - r.max_age_s
            for _ in range(MAX_BATCHES):
                if not self._delete_rows(ROW_BATCH, "rows_by_age", older_than=cutoff):
                    break
            db.execute("DELETE FROM events WHERE at < ?", (cutoff,))
        for _ in range(MAX_BATCHES if r.db_quota_bytes else 0):
            used = used_bytes(db)
            if used <= r.db_quota_bytes:
                break
            per_row = used / max(1, kept_rows(db))
            if not self._delete_rows(min(ROW_BATCH, 1 + math.ceil((used - r.db_quota_bytes) / per_row)), "rows_by_db_quota"):
                break
        self.room(0)

    def room(self, need: int) -> bool:
        """Keep the free-space floor with ``need`` more bytes written: the oldest pictures go first, then (at a
        maintenance pass, ``need`` 0, once the database has no free page left) a batch of the oldest rows, so new
        rows reuse their pages instead of growing the file. True when ``need`` bytes fit above the floor."""
        floor = self.policy.min_free_bytes
        if not floor:
            return True
        free = free_bytes(self.paths)
        while free - need < floor and (victims := oldest_pictures(self.db)):
            self.picture_bytes -= drop_pictures(self.db, self.images, victims)
            self.pruned["pictures_for_free_space"] += len(victims)
            free = free_bytes(self.paths)
        if free - need < floor and need == 0 and free_pages(self.db) == 0:
            self._delete_rows(ROW_BATCH, "rows_for_free_space")
        low = free - need < floor
        if low and not self.low_space:
            log.warning("audit: %d bytes free on the audit trail's disk, under the floor of %d: the oldest pictures "
                        "and rows are deleted, new pictures are not kept", free, floor)
        self.low_space = low
        return not low

    def _delete_rows(self, limit: int, why: str, *, older_than: float | None = None) -> int:
        rows, pictures, freed = delete_oldest_rows(self.db, self.images, limit, older_than=older_than)
        self.pruned[why] += rows
        self.pruned["pictures_with_rows"] += pictures
        self.picture_bytes -= freed
        return rows

    def reconcile(self) -> None:
        """Make rows and files agree after a crash, and count the bytes of pictures kept."""
        db = self.db
        named: set[str] = set()
        total, gone, resized = 0, [], []
        for rid, image, heatmap, recorded in db.execute("SELECT id, image, heatmap, image_bytes FROM parts WHERE image IS NOT NULL"):
            files = [n for n in (image, heatmap) if n]
            try:
                size = sum((self.images / n).stat().st_size for n in files)
            except FileNotFoundError:  # the survivor of a pair is an orphan now, removed below
                gone.append((rid,))
                continue
            named.update(files)
            total += size
            if size != recorded:
                resized.append((size, rid))
        with transaction(db):
            db.executemany("UPDATE parts SET image = NULL, heatmap = NULL, image_bytes = 0 WHERE id = ?", gone)
            db.executemany("UPDATE parts SET image_bytes = ? WHERE id = ?", resized)
        if gone:
            log.warning("audit: %d rows named pictures that are gone; their paths are cleared", len(gone))
        orphans = 0
        for entry in os.scandir(self.images):
            ours = PICTURE.match(entry.name.removesuffix(TMP_SUFFIX))
            if ours and entry.is_file() and (entry.name.endswith(TMP_SUFFIX) or entry.name not in named):
                os.unlink(entry.path)
                orphans += 1
        if orphans:
            log.warning("audit: removed %d pictures no row names (left by a crash)", orphans)
        self.picture_bytes = total


class transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an exception) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
