"""``edgerun kiosk report --since TIME [--out FILE] [--db PATH]``: the audit trail's parts since TIME as CSV.

One row per part (time in UTC, frame id, model and version, verdict, reason, scores, fail-safe, latency per
stage, the paths of its kept pictures). CSV on stdout, or written whole to ``--out`` (a temporary file
renamed: never half a report). The database is opened read-only, so a report can run beside the kiosk.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime, timedelta, timezone

from runtime.units import shown

HELP = "export the audit trail (one row per part) since a time as CSV"
MAX_AGE_DAYS = 3650  # a relative --since reaches back at most ten years
_AGE = re.compile(r"([0-9]{1,7})([smhd])")  # ASCII digits: \d would take "٣" too
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
VALID = "an ISO 8601 time such as 2026-12-01T00:00 (local time unless it ends in Z or +HH:MM) or an age such as 24h, 7d"


def since_time(text: str) -> datetime:
    """An argparse ``type=`` for ``--since``: an ISO 8601 date or time, or an age (``90m``, ``24h``, ``7d``),
    not in the future. Returns an aware datetime."""
    now = datetime.now(timezone.utc)
    s = text.strip()
    if len(s) > 40:
        raise argparse.ArgumentTypeError(f"{shown(text)} is too long: use {VALID}")
    if age := _AGE.fullmatch(s):
        delta = timedelta(**{_UNITS[age.group(2)]: int(age.group(1))})
        if delta > timedelta(days=MAX_AGE_DAYS):
            raise argparse.ArgumentTypeError(f"{shown(text)} reaches back more than {MAX_AGE_DAYS} days: use a smaller age")
        return now - delta
    try:
        when = datetime.fromisoformat(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a time: use {VALID}") from None
    if when.year < 1970:  # before the audit trail's clock starts (Unix seconds)
        raise argparse.ArgumentTypeError(f"{shown(text)} is before 1970: use {VALID}")
    if when.tzinfo is None:
        when = when.astimezone()  # naive: the kiosk's local time, as an operator reads it off the wall
    if when > now + timedelta(minutes=1):
        now_text = now.isoformat(timespec="minutes")
        raise argparse.ArgumentTypeError(f"{shown(text)} is in the future (now is {now_text}): use an earlier time")
    return when


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", type=since_time, required=True, metavar="TIME", help=f"export parts from TIME on: {VALID}")
    parser.add_argument("--out", metavar="FILE", help="write the CSV to FILE (default: stdout)")
    parser.add_argument("--db", metavar="PATH", help="the kiosk's audit database (default: $EDGERUN_HOME/kiosk/audit.db)")
    parser.add_argument("--images", metavar="DIR", help="its pictures folder, for the paths in the CSV (default: beside the database)")


def main(args: argparse.Namespace) -> int:
    from apps.kiosk.audit import default_db_path
    from apps.kiosk.audit_export import export_csv

    db = args.db or default_db_path()
    if args.out:
        n = export_csv(db, args.since, args.out, images=args.images)
    else:
        n = export_csv(db, args.since, sys.stdout, images=args.images)
    where = f" to {args.out}" if args.out else ""
    print(f"edgerun: {n} parts since {args.since.isoformat(timespec='seconds')}{where}", file=sys.stderr)
    return 0
