"""The audit trail: one SQLite row per decided part, and the pictures behind the rejects.

``AuditTrail(path)`` keeps, in SQLite (WAL, ``synchronous=NORMAL``: a killed kiosk loses no committed row):
time, source frame id, model name and version, the score(s), the decision and its reason, the latency of
each stage and whether the decision was fail-safe. Beside it (``audit-images/`` for ``audit.db``), the image of every reject
and review (with its anomaly heat-map overlay when the decision has one) and a seeded sample of passes,
under a disk quota: past it the oldest pictures are deleted first, and their rows keep the decision
but lose the path.

The row is committed by ``record()`` itself; pictures are encoded and written by a background thread, so
a burst of rejects never delays the next decision (a picture that finds the writer's bounded queue full is
dropped and counted, never the row).

Crash safety: a picture is written to a temporary name and renamed before its row names it; a row's path
is cleared before its file is deleted. So a crash at any point leaves at worst a file no row names, and
opening the trail removes those (and clears rows whose file is gone): rows and files always agree.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from queue import Full, Queue
from typing import IO

import numpy as np

from apps.kiosk import overlay
from apps.kiosk.audit_export import LATENCY as _LATENCY
from apps.kiosk.audit_export import export_csv
from apps.kiosk.types import STAGES, Decision, Verdict
from runtime.errors import BadInput

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DEFAULT_QUOTA = 512 << 20  # bytes of pictures
DEFAULT_PASS_SAMPLE = 0.02  # fraction of passes whose picture is kept
FORMATS = ("png", "jpg")
_CODEC = {"png": "png", "jpg": "jpeg"}  # file suffix -> apps.kiosk.overlay's format name
MAX_IMAGE_SIDE = 8192  # pixels; a larger "image" is a bug upstream, not a part
_PICTURE = re.compile(r"^\d{1,19}-(pass|reject|review)(-heat)?\.(png|jpg)$")
_TMP_SUFFIX = ".tmp"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS parts (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,           -- Unix seconds (UTC) when the decision was recorded
    seq INTEGER NOT NULL,       -- the source's part sequence number
    frame_id TEXT NOT NULL,
    model TEXT NOT NULL, version TEXT NOT NULL,
    verdict TEXT NOT NULL, reason TEXT NOT NULL,
    label TEXT,                 -- the decided class; NULL in anomaly mode
    score REAL, confidence REAL,
    scores TEXT,                -- JSON {{class: probability}} when the pipeline gave them
    failsafe INTEGER NOT NULL,
    {", ".join(f"{c} REAL" for c in _LATENCY)},
    image TEXT, heatmap TEXT,   -- file names under the images folder; NULL when none is kept
    image_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS parts_by_time ON parts (at);
CREATE INDEX IF NOT EXISTS parts_with_picture ON parts (id) WHERE image IS NOT NULL;
"""

def default_db_path() -> Path:
    from runtime.store import default_root

    return default_root() / "kiosk" / "audit.db"


class AuditTrail:
    """``with AuditTrail(path) as audit: audit.record(decision, image)``; thread-safe, one writer."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        images: str | os.PathLike[str] | None = None,
        quota_bytes: int = DEFAULT_QUOTA,
        pass_sample: float = DEFAULT_PASS_SAMPLE,
        seed: int = 0,
        image_format: str = "png",
        queue: int = 64,
    ) -> None:
        if not (isinstance(quota_bytes, int) and quota_bytes >= 0):
            raise BadInput(f"audit quota {quota_bytes!r} is invalid; give a number of bytes >= 0 (0 keeps no pictures)")
        if not (isinstance(pass_sample, (int, float)) and 0.0 <= pass_sample <= 1.0):
            raise BadInput(f"pass sample {pass_sample!r} is invalid; give a fraction from 0 to 1")
        if image_format not in FORMATS:
            raise BadInput(f"image format {image_format!r} is invalid; valid: {', '.join(FORMATS)}")
        if not (isinstance(queue, int) and 1 <= queue <= 4096):
            raise BadInput(f"audit picture queue {queue!r} is invalid; give 1..4096 pictures")
        self.path = Path(path)
        self.images = Path(images) if images is not None else self.path.parent / f"{self.path.stem}-images"
        self.quota_bytes, self.pass_sample, self.image_format = quota_bytes, float(pass_sample), image_format
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.images.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"cannot create the audit trail's folders ({exc.filename}): {exc.strerror or exc}") from exc
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._check_schema()
            self._bytes = self._reconcile()
        except sqlite3.DatabaseError as exc:
            raise BadInput(f"audit database {str(self.path)!r} is not a usable SQLite database: {exc}") from exc
        self._enforce_quota()
        self.pictures_dropped = 0  # pictures not kept because the writer fell behind (the rows are all there)
        self._queue: Queue[tuple[int, Decision, np.ndarray] | None] = Queue(queue)
        self._writer = threading.Thread(target=self._write_loop, name=f"audit pictures {self.images}", daemon=True)
        self._writer.start()

    # --- writing -----------------------------------------------------------------

    def record(
        self,
        decision: Decision,
        image: np.ndarray | None = None,
        *,
        scores: Mapping[str, float] | None = None,
        at: float | None = None,
    ) -> int:
        """One row for ``decision`` (``at``: Unix seconds, default now), committed when this returns (well under
        a millisecond). Its picture is kept when it is not a pass, or is a pass drawn for the sample; pictures are
        encoded and written by a background thread, so a burst of rejects never holds up the next decision
        (``image`` must not be modified afterwards). A picture that cannot be written, or that finds the
        writer's queue full, is logged and counted, never raised: the row is what must not be lost.
        Returns the row id."""
        at = time.time() if at is None else float(at)
        row = {
            "at": at, "seq": int(decision.seq), "frame_id": str(decision.frame_id), "model": decision.model,
            "version": decision.version, "verdict": Verdict(decision.verdict).value, "reason": decision.reason,
            "label": decision.label, "score": _real(decision.score), "confidence": _real(decision.confidence),
            "scores": json.dumps({str(k): _real(v) for k, v in scores.items()}) if scores else None,
            "failsafe": int(bool(decision.failsafe)),
        }  # fmt: skip
        row.update({c: _real(decision.latency_ms.get(s)) for c, s in zip(_LATENCY, STAGES, strict=True)})
        keep = image is not None and self.quota_bytes > 0 and (
            decision.verdict != Verdict.PASS or self._rng.random() < self.pass_sample
        )
        with self._lock:
            cur = self._require().execute(f"INSERT INTO parts ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
            rid = int(cur.lastrowid)
        if keep:
            try:
                self._queue.put_nowait((rid, decision, image))
            except Full:
                self.pictures_dropped += 1
                log.warning("audit: picture of part %s not kept: %d pictures wait to be written", decision.seq, self._queue.maxsize)
        return rid

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every picture recorded so far is written (or given up); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _write_loop(self) -> None:
        while (job := self._queue.get()) is not None:
            rid, decision, image = job
            try:
                files = self._write_pictures(rid, decision, image)
                if files:  # the files are in place before the row names them: a crash leaves only orphans
                    with self._lock:
                        self._require().execute("UPDATE parts SET image = ?, heatmap = ?, image_bytes = ? WHERE id = ?", (*files, rid))
                        self._bytes += files[2]
                        self._enforce_quota()
            except Exception:  # a bug must not stop the trail: later pictures still get written
                log.exception("audit: picture of part %s", decision.seq)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _write_pictures(self, rid: int, decision: Decision, image: np.ndarray) -> tuple[str, str | None, int] | None:
        name = f"{rid}-{Verdict(decision.verdict).value}"
        written: list[Path] = []
        try:
            _check_picture(image)
            pictures = [f"{name}.{self.image_format}"]
            if decision.heatmap is not None:  # the same overlay as the dashboard's (apps.kiosk.overlay)
                pictures.append(f"{name}-heat.{self.image_format}")
            size = 0
            for filename, heat in zip(pictures, (None, decision.heatmap), strict=False):
                size += self._write(filename, overlay.encode(image, heat, fmt=_CODEC[self.image_format], quality=95,
                                                              max_side=MAX_IMAGE_SIDE))
                written.append(self.images / filename)
        except (OSError, ValueError, BadInput) as exc:
            for path in written:
                path.unlink(missing_ok=True)
            log.warning("picture of part %s (frame %s) not kept: %s", decision.seq, decision.frame_id, exc)
            return None
        return pictures[0], pictures[1] if len(pictures) > 1 else None, size

    def _write(self, filename: str, data: bytes) -> int:
        tmp = self.images / (filename + _TMP_SUFFIX)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self.images / filename)  # a reader or a crash never sees half a picture
        return len(data)

    def _enforce_quota(self) -> None:
        """Delete the oldest pictures until the total fits the quota (caller holds the lock, or is __init__)."""
        db = self._require()
        while self._bytes > self.quota_bytes:
            rows = db.execute(
                "SELECT id, image, heatmap, image_bytes FROM parts WHERE image IS NOT NULL ORDER BY id LIMIT 64"
            ).fetchall()
            if not rows:
                self._bytes = 0
                return
            freed, victims = 0, []
            for rid, image, heatmap, size in rows:
                victims.append((rid, image, heatmap))
                freed += size
                if self._bytes - freed <= self.quota_bytes:
                    break
            with _transaction(db):
                db.executemany("UPDATE parts SET image = NULL, heatmap = NULL, image_bytes = 0 WHERE id = ?", [(v[0],) for v in victims])
            for _, *names in victims:  # the rows no longer name them: a crash here leaves only orphans
                for n in names:
                    if n:
                        (self.images / n).unlink(missing_ok=True)
            self._bytes -= freed
            log.info("audit quota: deleted the %d oldest pictures (%d bytes)", len(victims), freed)

    def _reconcile(self) -> int:
        """Make rows and files agree after a crash; returns the bytes of pictures kept."""
        db = self._require()
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
        with _transaction(db):
            db.executemany("UPDATE parts SET image = NULL, heatmap = NULL, image_bytes = 0 WHERE id = ?", gone)
            db.executemany("UPDATE parts SET image_bytes = ? WHERE id = ?", resized)
        if gone:
            log.warning("audit: %d rows named pictures that are gone; their paths are cleared", len(gone))
        orphans = 0
        for entry in os.scandir(self.images):
            ours = _PICTURE.match(entry.name.removesuffix(_TMP_SUFFIX))
            if ours and entry.is_file() and (entry.name.endswith(_TMP_SUFFIX) or entry.name not in named):
                os.unlink(entry.path)
                orphans += 1
        if orphans:
            log.warning("audit: removed %d pictures no row names (left by a crash)", orphans)
        return total

    def _check_schema(self) -> None:
        db = self._require()
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta(key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif row[0] != str(SCHEMA_VERSION):
            raise BadInput(f"audit database {str(self.path)!r} has schema {row[0]}; this edgerun reads {SCHEMA_VERSION}")

    # --- reading -----------------------------------------------------------------

    @property
    def picture_bytes(self) -> int:
        return self._bytes

    def stats(self) -> dict[str, int]:
        """For the dashboard: rows recorded, bytes of pictures kept and the quota, pictures dropped or still queued."""
        with self._lock:
            rows = self._require().execute("SELECT COALESCE(MAX(id), 0) FROM parts").fetchone()[0]  # rows are never deleted
            kept = self._bytes
        return {"rows": int(rows), "picture_bytes": kept, "quota_bytes": self.quota_bytes,
                "pictures_dropped": self.pictures_dropped, "pictures_queued": self._queue.qsize()}  # fmt: skip

    def export_csv(self, since: datetime | float, out: str | os.PathLike[str] | IO[str]) -> int:
        """Rows recorded at or after ``since`` as CSV (see :func:`export_csv`), on a reader connection of its
        own: a long export does not hold up :meth:`record`."""
        return export_csv(self.path, since, out, images=self.images)

    def _require(self) -> sqlite3.Connection:
        if self._db is None:
            raise BadInput(f"audit trail {str(self.path)!r} is closed")
        return self._db

    def close(self) -> None:
        """Write the pictures still queued, then close."""
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join()
        with self._lock:
            db, self._db = self._db, None
            if db is not None:
                db.close()

    def __enter__(self) -> "AuditTrail":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def _real(value: object) -> float | None:
    try:
        value = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _check_picture(image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise BadInput(f"picture must be an HxWx3 uint8 array, got {getattr(image, 'dtype', type(image).__name__)}")
    if image.ndim == 3 and image.shape[2] != 3 or not 0 < max(image.shape[:2]) <= MAX_IMAGE_SIDE or min(image.shape[:2]) == 0:
        raise BadInput(f"picture of shape {image.shape} is invalid; give HxWx3 with sides 1..{MAX_IMAGE_SIDE}")
