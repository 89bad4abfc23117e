"""The outgoing journal: every result is on disk before it is sent, until the peer acknowledges it.

SQLite in WAL mode with ``synchronous=FULL`` by default: a committed result
survives a process kill and a power cut. Sequence numbers come from the journal
(``meta.next_seq``), so they keep increasing across restarts even when the
outbox is empty, and the peer's "applied up to n" stays meaningful. Each journal
has a random 16-byte stream id, created once, that names its sequence space to
the peer (a fresh journal is a new stream, not a replay of an old one).

The journal also keeps a *sent mark* (``meta.sent_mark``): no sequence above it
has ever been sent. The sender raises it, durably, before it sends anything
above it (to the last sequence assigned, so one commit covers a burst), and a
handshake raises it too. A peer's HELLO_ACK can therefore exceed the mark only
when the peer saw this stream get further than this file: the file was restored
from a backup, and its entries above the mark may carry numbers the peer already
applied to other results. :meth:`Journal.adopt` then drops what is at or below
the mark and renumbers the rest after the peer's number instead of deleting it.
Results the backup still held may so reach the peer a second time, under new
numbers; none is lost and no number is reused.

Fail-safe sends are recorded in ``failsafe_log`` with the reason and time, and
outlive their acknowledgement: that record is the audit trail the issue asks for.

One connection, shared by the submitting thread and the link thread under a lock.
"""

from __future__ import annotations

import enum
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass

from devices.link.frame import MAX_PAYLOAD, MAX_SEQ, STREAM_ID_SIZE, FrameType
from runtime.errors import BadInput

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY,
    type INTEGER NOT NULL,
    payload BLOB NOT NULL,
    created_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS failsafe_log (
    seq INTEGER PRIMARY KEY,
    reason TEXT NOT NULL,
    at_ns INTEGER NOT NULL
);
"""


class Durability(str, enum.Enum):
    """How hard each commit is pushed to disk (SQLite ``synchronous`` in WAL mode)."""

    FULL = "full"  # survives power loss: fsync per commit (about 0.4 ms on an SSD)
    NORMAL = "normal"  # survives a process kill, may lose the last commits on power loss


@dataclass(frozen=True)
class Entry:
    seq: int
    type: FrameType
    payload: bytes


class Journal:
    """Open (or create) the journal at ``path``. Use as a context manager or call close()."""

    def __init__(self, path: str | os.PathLike[str], durability: Durability | str = Durability.FULL) -> None:
        try:
            self.durability = Durability(durability)
        except ValueError:
            raise BadInput(f"durability {durability!r} is invalid; valid: {[d.value for d in Durability]}") from None
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={self.durability.value.upper()}")
            self._db.executescript(_SCHEMA)
            self.stream_id = self._init_meta()
        except sqlite3.DatabaseError as exc:
            raise BadInput(f"journal {self.path!r} is not a usable SQLite database: {exc}") from exc

    def _init_meta(self) -> bytes:
        with self._tx():
            rows = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            if "schema" in rows and int(rows["schema"]) != SCHEMA_VERSION:
                raise BadInput(f"journal {self.path!r} has schema {rows['schema']}, this edgerun reads {SCHEMA_VERSION}")
            if "stream_id" not in rows:
                rows["stream_id"] = os.urandom(STREAM_ID_SIZE)
                rows["next_seq"] = 1
                self._db.executemany(
                    "INSERT INTO meta(key, value) VALUES (?, ?)",
                    [("schema", str(SCHEMA_VERSION)), ("stream_id", rows["stream_id"]), ("next_seq", 1)],
                )
            if "sent_mark" not in rows:
                # A journal from before the mark may have sent anything it assigned: trust its numbers, as edgerun did.
                rows["sent_mark"] = int(rows["next_seq"]) - 1
                self._db.execute("INSERT INTO meta(key, value) VALUES ('sent_mark', ?)", (rows["sent_mark"],))
            self._sent_mark = int(rows["sent_mark"])
        return bytes(rows["stream_id"])

    class _Tx:
        def __init__(self, journal: "Journal") -> None:
            self.journal = journal

        def __enter__(self) -> sqlite3.Connection:
            self.journal._lock.acquire()
            self.journal._db.execute("BEGIN IMMEDIATE")
            return self.journal._db

        def __exit__(self, exc_type, *_: object) -> None:
            try:
                self.journal._db.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self.journal._lock.release()

    def _tx(self) -> "Journal._Tx":
        if self._db is None:
            raise BadInput(f"journal {self.path!r} is closed")
        return Journal._Tx(self)

    def append(self, payload: bytes, type: FrameType = FrameType.RESULT, *, failsafe_reason: str | None = None) -> int:
        """Store one outgoing result durably and return its sequence number."""
        if type not in (FrameType.RESULT, FrameType.FAILSAFE):
            raise BadInput(f"journal holds RESULT and FAILSAFE frames, not {type!r}")
        if len(payload) > MAX_PAYLOAD:
            raise BadInput(f"result of {len(payload)} bytes exceeds the frame maximum of {MAX_PAYLOAD}")
        now = time.time_ns()
        with self._tx() as db:
            (seq,) = db.execute("SELECT value FROM meta WHERE key = 'next_seq'").fetchone()
            seq = int(seq)
            if seq > MAX_SEQ:
                raise BadInput(f"journal {self.path!r} used every sequence number; start a new journal file")
            db.execute("UPDATE meta SET value = ? WHERE key = 'next_seq'", (seq + 1,))
            db.execute(
                "INSERT INTO outbox(seq, type, payload, created_ns) VALUES (?, ?, ?, ?)",
                (seq, int(type), bytes(payload), now),
            )
            if failsafe_reason is not None:
                db.execute("INSERT INTO failsafe_log(seq, reason, at_ns) VALUES (?, ?, ?)", (seq, failsafe_reason, now))
        return seq

    def pending(self, after: int = 0, limit: int = 64) -> list[Entry]:
        """Unacknowledged entries with seq > ``after``, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, type, payload FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            ).fetchall()
        return [Entry(seq, FrameType(t), bytes(p)) for seq, t, p in rows]

    def next_seq(self) -> int:
        """The sequence number the next append will get."""
        with self._lock:
            return int(self._db.execute("SELECT value FROM meta WHERE key = 'next_seq'").fetchone()[0])

    def first_unacked(self) -> int:
        """The lowest seq still held; with none held, the next seq to be assigned."""
        # One read under the lock: an append between two reads would make us report
        # its seq as acknowledged, and the peer would skip it.
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE((SELECT MIN(seq) FROM outbox), (SELECT value FROM meta WHERE key = 'next_seq'))"
            ).fetchone()
        return int(row[0])

    def ack(self, upto: int) -> int:
        """Drop every entry with seq <= ``upto``; returns how many were dropped."""
        with self._tx() as db:
            return db.execute("DELETE FROM outbox WHERE seq <= ?", (upto,)).rowcount

    @property
    def sent_mark(self) -> int:
        """No sequence above this has ever been sent (see :meth:`sending` and :meth:`adopt`)."""
        return self._sent_mark

    def sending(self, upto: int) -> None:
        """Call before sending entries up to ``upto``: durably raises the sent mark over them.

        The mark goes to the last sequence assigned so far (never to one not yet
        assigned), so one commit covers a whole burst of results, not one per frame."""
        if upto <= self._sent_mark:
            return
        with self._tx() as db:
            (next_seq,) = db.execute("SELECT value FROM meta WHERE key = 'next_seq'").fetchone()
            mark = max(int(next_seq) - 1, self._sent_mark)
            db.execute("UPDATE meta SET value = ? WHERE key = 'sent_mark'", (mark,))
        self._sent_mark = mark

    def adopt(self, applied: int) -> tuple[int, int]:
        """Take the peer's "applied up to ``applied``" (its HELLO_ACK); returns (dropped, renumbered).

        Up to the sent mark, this is :meth:`ack`. Above it, the peer has applied
        numbers this journal may have given to other results: the file was restored
        from a backup (or the peer is confused). Entries up to the mark are dropped
        (their numbers, hence their contents, are the ones the peer applied); the
        entries held above it keep their order and move up so the first is
        ``applied + 1`` (fail-safe log rows with them), and ``next_seq`` follows, so
        the peer sees no gap. Either way the mark then rises to the last assigned
        sequence (every entry held now is numbered past anything the peer has seen,
        so sending it can never be mistaken for a restore). One transaction, so no result is lost and no number the peer saw is
        reused, whenever the process dies."""
        with self._tx() as db:
            mark, renumbered = self._sent_mark, 0
            dropped = db.execute("DELETE FROM outbox WHERE seq <= ?", (min(applied, mark),)).rowcount
            (next_seq,) = db.execute("SELECT value FROM meta WHERE key = 'next_seq'").fetchone()
            next_seq = int(next_seq)
            if applied > mark:
                # The outbox is one contiguous run (acks drop a prefix); HELLO's base keeps the
                # peer at or above its first entry - 1, so only a conflict needs moving.
                (first,) = db.execute("SELECT MIN(seq) FROM outbox").fetchone()
                if first is not None and applied >= first:
                    shift = applied + 1 - first
                    if next_seq - 1 + shift > MAX_SEQ:
                        raise BadInput(f"journal {self.path!r} cannot renumber past the peer's seq {applied}; start a new journal file")
                    # Two steps: seq + shift could collide with a row not yet moved (seq is the primary key).
                    for table in ("outbox", "failsafe_log"):
                        db.execute(f"UPDATE {table} SET seq = -seq WHERE seq >= ?", (first,))
                        db.execute(f"UPDATE {table} SET seq = ? - seq WHERE seq < 0", (shift,))
                    (renumbered,) = db.execute("SELECT COUNT(*) FROM outbox").fetchone()
                    next_seq += shift
                next_seq = max(next_seq, applied + 1)
                db.execute("UPDATE meta SET value = ? WHERE key = 'next_seq'", (next_seq,))
            db.execute("UPDATE meta SET value = ? WHERE key = 'sent_mark'", (next_seq - 1,))
        self._sent_mark = next_seq - 1
        if applied > mark:
            log.warning(
                "peer has applied up to seq %d, beyond this journal's sent mark %d (restored from a backup?); "
                "%d held result(s) renumbered from %d",
                applied, mark, renumbered, applied + 1,
            )
        return dropped, renumbered

    def backlog(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def failsafes(self) -> list[tuple[int, str, int]]:
        """(seq, reason, at_ns) for every fail-safe value ever sent from this journal."""
        with self._lock:
            return [tuple(r) for r in self._db.execute("SELECT seq, reason, at_ns FROM failsafe_log ORDER BY seq")]

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with self._lock:
                db.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
