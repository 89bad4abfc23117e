"""Reading the audit trail back: its rows since a time as CSV, from a read-only connection.

Used by ``edgerun kiosk report`` and :meth:`apps.kiosk.audit.AuditTrail.export_csv`; it never writes to the
database, so a report can run beside a working kiosk (SQLite WAL: readers do not block the writer).
"""

from __future__ import annotations

import csv
import os
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from apps.kiosk.types import STAGES
from runtime.errors import BadInput

LATENCY = [f"{stage}_ms" for stage in STAGES]  # the audit table's latency columns

CSV_COLUMNS = ["time", "seq", "frame_id", "model", "version", "verdict", "reason", "label", "score", "confidence",
               "failsafe", "scores", *LATENCY, "image", "heatmap"]  # fmt: skip


def export_csv(db_path: str | os.PathLike[str], since: datetime | float, out: str | os.PathLike[str] | IO[str], *,
               images: str | os.PathLike[str] | None = None) -> int:  # fmt: skip
    """Export from an audit database without opening it for writing (a report beside a running kiosk).

    ``since``: an aware datetime, a naive one (local time) or Unix seconds. ``out``: a path (written to a
    temporary file and renamed: never half a report) or an open text file. Returns the rows written.
    Picture paths are absolute; text that a spreadsheet would run as a formula is prefixed with ``'``.
    """
    path = Path(db_path)
    if not path.is_file():
        raise BadInput(f"audit database {str(path)!r} does not exist; give the kiosk's audit.db (--db)")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            return _export(db, Path(images) if images else path.parent / f"{path.stem}-images", since, out)
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise BadInput(f"audit database {str(path)!r} cannot be read: {exc}") from exc


def _export(db: sqlite3.Connection, images: Path, since: datetime | float, out: str | os.PathLike[str] | IO[str]) -> int:
    start = since.timestamp() if isinstance(since, datetime) else float(since)
    if not isinstance(out, (str, os.PathLike)):
        return _write_csv(db, images, start, out)
    target = Path(out)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            n = _write_csv(db, images, start, f)
        os.replace(tmp, target)
    except OSError as exc:
        raise BadInput(f"cannot write the report to {str(target)!r}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return n


def _write_csv(db: sqlite3.Connection, images: Path, start: float, f: IO[str]) -> int:
    columns = ["at", "seq", "frame_id", "model", "version", "verdict", "reason", "label", "score", "confidence",
               "failsafe", "scores", *LATENCY, "image", "heatmap"]  # fmt: skip
    cur = db.execute(f"SELECT {', '.join(columns)} FROM parts WHERE at >= ? ORDER BY at, id", (start,))
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    n = 0
    while rows := cur.fetchmany(1024):
        for at, *rest in rows:
            *fields, image, heatmap = rest
            writer.writerow([_iso(at), *(_cell(v) for v in fields), *(str(images.resolve() / p) if p else "" for p in (image, heatmap))])
        n += len(rows)
    return n


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cell(value: object) -> object:
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value  # a frame id or reason from a file name must not run as a spreadsheet formula
    return "" if value is None else value
