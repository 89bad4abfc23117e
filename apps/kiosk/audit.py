"""The audit trail: one SQLite row per decided part, and the pictures behind the rejects.

``AuditTrail(path)`` keeps, in SQLite (WAL, ``synchronous=FULL``: a committed row survives a killed kiosk and a
power cut): time, source frame id, model name and version, the score(s), the decision and its reason, the latency
of each stage and whether the decision was fail-safe; and, in ``events``, every fault the kiosk latched and who
cleared it (:mod:`apps.kiosk.faults`). Beside it (``audit-images/`` for ``audit.db``), the image of every reject
and review (with its anomaly heat-map overlay when the decision has one) and a seeded sample of passes, under a
disk quota: past it the oldest pictures are deleted first, and their rows keep the decision but lose the path.
Rows (with their pictures) are deleted oldest first by age, by a database quota and to keep a free-space floor
(:mod:`apps.kiosk.retention`); what went is counted in :meth:`AuditTrail.stats`.

The row is committed by ``record()`` itself; pictures are encoded and written by a background thread, so
a burst of rejects never delays the next decision (a picture that finds the writer's bounded queue full, or the
disk at its floor, is dropped and counted, never the row). A row that cannot be written raises
:class:`AuditWriteError`; a picture that cannot be written for want of disk (any OSError) is reported to
``on_fault``.

Crash safety: a picture is written to a temporary name, fsynced, renamed and its folder fsynced before its row
names it (so a power cut never leaves a row naming an empty file); a row's path is cleared before its file is
deleted. So a crash at any point leaves at worst a file no row names, and opening the trail removes those (and
clears rows whose file is gone): rows and files always agree.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from queue import Full, Queue
from typing import IO

import numpy as np

from apps.kiosk import overlay
from apps.kiosk.audit_export import LATENCY as _LATENCY
from apps.kiosk.audit_export import export_csv
from apps.kiosk.retention import TMP_SUFFIX, Keeper, Retention, free_bytes, kept_rows, unlink, used_bytes
from apps.kiosk.types import STAGES, Decision, Verdict
from runtime.errors import BadInput
from runtime.files import fsync_dir

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DEFAULT_QUOTA = 512 << 20  # bytes of pictures
DEFAULT_PASS_SAMPLE = 0.02  # fraction of passes whose picture is kept
FORMATS = ("png", "jpg")
_CODEC = {"png": "png", "jpg": "jpeg"}  # file suffix -> apps.kiosk.overlay's format name
MAX_IMAGE_SIDE = 8192  # pixels; a larger "image" is a bug upstream, not a part
DEFAULT_RETENTION = Retention()  # any age, the default database quota and free-space floor
MAINTAIN_EVERY_S = 1.0  # how often record() applies the retention (age, database quota, free-space floor)

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
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,           -- Unix seconds (UTC)
    kind TEXT NOT NULL,         -- what it is about: a fault kind ("plc", "audit")
    action TEXT NOT NULL,       -- "latched" or "cleared"
    message TEXT NOT NULL,      -- the failure, or what the operator cleared
    operator TEXT               -- who cleared it; NULL for a latch
);
"""


class AuditWriteError(RuntimeError):
    """A row or event could not be committed (a full or failing disk); the message is one line."""


def default_db_path() -> Path:
    from runtime.bundle.store import default_root

    return default_root() / "kiosk" / "audit.db"


class AuditTrail:
    """``with AuditTrail(path) as audit: audit.record(decision, image)``; thread-safe, one writer.

    ``retention``: how long rows are kept and the disk they may use (:class:`apps.kiosk.retention.Retention`);
    ``on_fault``: called with one line when a picture cannot be written for an OSError (a full disk), from the
    picture writer's thread; it must not block."""

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
        retention: Retention = DEFAULT_RETENTION,
        on_fault: Callable[[str], None] | None = None,
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
        self.on_fault = on_fault
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.pictures_dropped = 0  # pictures not kept because the writer fell behind (the rows are all there)
        self.pictures_skipped = 0  # pictures not kept because the disk was at its free-space floor
        self.last_error: str | None = None  # the latest write that failed, for the dashboard
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.images.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"cannot create the audit trail's folders ({exc.filename}): {exc.strerror or exc}") from exc
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # WAL fsynced at every commit: a power cut loses no row
            self._db.executescript(_SCHEMA)
            self._check_schema()
            self._keep = Keeper(self._db, self.images, self.path.parent, quota_bytes, retention)
            self._keep.reconcile()
            fsync_dir(self.path.parent)  # the database's and its WAL's names are on disk too
            fsync_dir(self.images.parent)
            self._keep.enforce_quota()
            self._keep.maintain()
        except sqlite3.DatabaseError as exc:
            raise BadInput(f"audit database {str(self.path)!r} is not a usable SQLite database: {exc}") from exc
        except OSError as exc:
            raise BadInput(f"audit trail {str(self.path)!r} cannot be opened: {exc.strerror or exc}") from exc
        self._maintained = time.monotonic()
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
        """One row for ``decision`` (``at``: Unix seconds, default now), committed and fsynced when this returns
        (a millisecond or a few on flash). Its picture is kept when it is not a pass, or is a pass drawn for the
        sample; pictures are encoded and written by a background thread, so a burst of rejects never holds up the
        next decision (``image`` must not be modified afterwards). A picture that cannot be written, or that finds
        the writer's queue full, is logged and counted, never raised: the row is what must not be lost.
        Returns the row id; :class:`AuditWriteError` when the row could not be committed (a full disk)."""
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
            try:
                rid = self._insert("parts", row, f"the row of part {decision.seq}")
            except AuditWriteError:  # a full disk: the retention may make room (pictures first), then one more try
                self._guarded(self._keep.maintain, "the audit retention")
                rid = self._insert("parts", row, f"the row of part {decision.seq}")
            if time.monotonic() - self._maintained >= MAINTAIN_EVERY_S:
                self._maintained = time.monotonic()
                self._guarded(self._keep.maintain, "the audit retention")
        if keep:
            try:
                self._queue.put_nowait((rid, decision, image))
            except Full:
                self.pictures_dropped += 1
                log.warning("audit: picture of part %s not kept: %d pictures wait to be written", decision.seq, self._queue.maxsize)
        return rid

    def event(self, kind: str, action: str, message: str, *, operator: str | None = None, at: float | None = None) -> int:
        """One row of ``events`` (a fault latched or cleared), committed when this returns; AuditWriteError else."""
        row = {"at": time.time() if at is None else float(at), "kind": str(kind), "action": str(action),
               "message": str(message), "operator": operator}
        with self._lock:
            return self._insert("events", row, f"the {kind} {action} event")

    def _insert(self, table: str, row: Mapping[str, object], what: str) -> int:
        """Caller holds the lock."""
        try:
            cur = self._require().execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                                          list(row.values()))
        except sqlite3.Error as exc:
            self.last_error = f"{what} was not written to {self.path}: {exc}"
            raise AuditWriteError(self.last_error) from exc
        return int(cur.lastrowid)

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
            files = None
            try:
                files = self._write_pictures(rid, decision, image)
                if files:  # the files are in place before the row names them: a crash leaves only orphans
                    with self._lock:
                        named = self._require().execute("UPDATE parts SET image = ?, heatmap = ?, image_bytes = ? WHERE id = ?",
                                                        (*files, rid)).rowcount
                        if named:
                            self._keep.added(files[2])
                        else:  # the row went meanwhile (retention): its pictures go too
                            unlink(self.images, [n for n in files[:2] if n])
            except sqlite3.Error as exc:  # the disk is full or failing: no row names the files, so they go
                unlink(self.images, [n for n in (files or ())[:2] if n])
                self._fault(f"the picture of part {decision.seq} was not named in {self.path}: {exc}")
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
                data = overlay.encode(image, heat, fmt=_CODEC[self.image_format], quality=95, max_side=MAX_IMAGE_SIDE)
                with self._lock:
                    room = self._keep.room(len(data))
                if not room:
                    self.pictures_skipped += 1
                    raise _NoRoom(f"the disk is at its free-space floor of {self._keep.policy.min_free_bytes} bytes")
                written.append(self.images / filename)  # removed again when this or the next one fails
                size += self._write(filename, data)
        except (OSError, ValueError, BadInput, _NoRoom) as exc:
            unlink(self.images, [p.name for p in written])
            message = f"picture of part {decision.seq} (frame {decision.frame_id}) not kept: {exc}"
            if isinstance(exc, OSError):  # no space, an I/O error: the evidence is missing, a fault
                self._fault(message)
            else:
                log.warning("audit: %s", message)
            return None
        return pictures[0], pictures[1] if len(pictures) > 1 else None, size

    def _write(self, filename: str, data: bytes) -> int:
        """Write, fsync, rename, fsync the folder: once this returns, a power cut leaves the whole picture."""
        tmp = self.images / (filename + TMP_SUFFIX)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
            os.replace(tmp, self.images / filename)  # a reader or a crash never sees half a picture
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(self.images)  # the new name is on disk before the row names it
        return len(data)

    def _fault(self, message: str) -> None:
        self.last_error = message
        log.error("audit: %s", message)
        if self.on_fault is not None:
            self.on_fault(message)

    def _guarded(self, step: Callable[[], None], what: str) -> None:
        """Run a housekeeping step; its failure (a full disk) is a fault, never an exception for the caller."""
        try:
            step()
        except (sqlite3.Error, OSError) as exc:
            self._fault(f"{what} failed: {exc}")

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
        return self._keep.picture_bytes

    @property
    def pruned(self) -> dict[str, int]:
        """What the retention and the quota deleted since the trail was opened (retention.PRUNED names them)."""
        return dict(self._keep.pruned)

    @property
    def low_space(self) -> bool:
        return self._keep.low_space

    def stats(self) -> dict[str, object]:
        """For the dashboard: rows kept and recorded, database bytes in use and its quota, bytes of pictures kept
        and their quota, pictures dropped (writer behind), skipped (disk at its floor) or still queued, what the
        retention deleted (``pruned``), the free bytes and floor, and the latest write error."""
        with self._lock:
            db = self._require()
            recorded = int(db.execute("SELECT COALESCE(MAX(id), 0) FROM parts").fetchone()[0])
            rows, used, kept = kept_rows(db), used_bytes(db), self._keep.picture_bytes
            pruned, policy, low = dict(self._keep.pruned), self._keep.policy, self._keep.low_space
        try:
            free: int | None = free_bytes((self.images, self.path.parent))
        except OSError:
            free = None
        return {"rows": rows, "recorded": recorded, "db_bytes": used, "db_quota_bytes": policy.db_quota_bytes,
                "max_age_s": policy.max_age_s, "picture_bytes": kept, "quota_bytes": self.quota_bytes,
                "pictures_dropped": self.pictures_dropped, "pictures_skipped": self.pictures_skipped,
                "pictures_queued": self._queue.qsize(), "pruned": pruned, "free_bytes": free,
                "min_free_bytes": policy.min_free_bytes, "low_space": low,
                "last_error": self.last_error}  # fmt: skip

    def events(self) -> list[dict[str, object]]:
        """Every fault event kept, oldest first."""
        with self._lock:
            cur = self._require().execute("SELECT id, at, kind, action, message, operator FROM events ORDER BY id")
            names = [c[0] for c in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

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


class _NoRoom(Exception):
    """A picture not written because the disk is at the free-space floor (counted, not a fault)."""


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
