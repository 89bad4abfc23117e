"""The reference peer: what a PLC or microcontroller does on its side of the link.

It applies each result of a stream exactly once, in sequence order, and answers
with cumulative ACKs (and one NACK per gap so the sender rewinds at once). The
applied results and the "applied up to" counter of each stream are committed in
one SQLite transaction *before* the ACK goes out, so a peer killed at any
instant restarts knowing exactly what it applied: the sender's journal replays
the rest, and nothing is applied twice. A peer without a store (``store_path``
None) behaves like a PLC that loses its memory on reboot: the sender's HELLO
tells it where to resume, so nothing is lost, but results applied and not yet
acknowledged before the reboot may be applied again (no peer can avoid that
without durable state).

It can also send COMMAND frames (for example a trigger) and resends each until
the link acknowledges it. A peer that has no session yet (it just started, so
its command counter may be back at 1) says HELLO until the link's HELLO
arrives, and sends no command before that: the link starts a new command
session on that HELLO, so the restarted counter's commands run instead of
being taken for resends.

Run it as ``edgerun serial-peer URL``; tests and the benchmark use it in-process.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass

from devices.link.frame import DecoderStats, Frame, FrameDecoder, FrameType, parse_hello
from devices.link.transport import LinkDown, SerialTransport
from runtime.errors import BadInput

log = logging.getLogger(__name__)

QUIET_S = 0.1  # seconds of silence after which a buffered partial frame is dropped as noise

_SCHEMA = """
PRAGMA journal_mode=WAL;
PRAGMA synchronous=FULL;
CREATE TABLE IF NOT EXISTS streams (stream BLOB PRIMARY KEY, applied INTEGER NOT NULL);
-- No uniqueness constraint on (stream, seq) on purpose: the store records what was
-- applied, so a duplicate (a protocol bug) shows up as a second row instead of being
-- hidden by the database.
CREATE TABLE IF NOT EXISTS applied (
    id INTEGER PRIMARY KEY, stream BLOB NOT NULL, seq INTEGER NOT NULL, type INTEGER NOT NULL, payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS applied_by_seq ON applied (stream, seq);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class Applied:
    stream: bytes
    seq: int
    type: FrameType
    payload: bytes


@dataclass
class PeerStats:
    applied: int = 0
    duplicates: int = 0  # frames at or below "applied up to": resent after a lost ACK
    gaps: int = 0  # frames above the next expected one: an earlier frame was lost
    hellos: int = 0
    commands_sent: int = 0
    disconnects: int = 0

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class PeerStore:
    """Applied results and per-stream progress; ``path=None`` keeps them in memory only.

    Thread-safe: the peer's thread commits results while another thread (:meth:`ReferencePeer.send_command`, the
    CLI's trigger loop) numbers commands on the same connection, and each transaction holds the store's lock (two
    interleaved BEGINs on one connection fail with "cannot start a transaction within a transaction", which
    ended the peer's thread)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path or ":memory:", isolation_level=None, check_same_thread=False)
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise BadInput(f"peer store {path!r} is not a usable SQLite database: {exc}") from exc
        self._applied = dict(self._db.execute("SELECT stream, applied FROM streams").fetchall())

    def applied_upto(self, stream: bytes) -> int:
        return int(self._applied.get(stream, 0))

    def commit(self, stream: bytes, upto: int, results: list[Applied]) -> None:
        """Record new results and the new "applied up to" in one transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO applied(stream, seq, type, payload) VALUES (?, ?, ?, ?)",
                    [(r.stream, r.seq, int(r.type), r.payload) for r in results],
                )
                self._db.execute(
                    "INSERT INTO streams(stream, applied) VALUES (?, ?) ON CONFLICT(stream) DO UPDATE SET applied = excluded.applied",
                    (stream, upto),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._applied[stream] = upto

    def next_command_seq(self) -> int:
        """The next command's sequence, counted in the store (a restarted peer never reuses one)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT value FROM meta WHERE key = 'command_seq'").fetchone()
                seq = (row[0] if row else 0) + 1
                self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('command_seq', ?)", (seq,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return seq

    def results(self, stream: bytes | None = None) -> list[Applied]:
        query, args = "SELECT stream, seq, type, payload FROM applied", ()
        if stream is not None:
            query, args = query + " WHERE stream = ?", (stream,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY id", args).fetchall()
        return [Applied(bytes(s), q, FrameType(t), bytes(p)) for s, q, t, p in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class ReferencePeer:
    """The PLC side. ``run()`` blocks until ``stop()``; ``start()`` runs it on a thread."""

    def __init__(
        self,
        url: str,
        store_path: str | None = None,
        *,
        on_apply=None,  # callable(Applied), called after the result is committed, before the ACK
        read_timeout_s: float = 0.02,
        command_timeout_s: float = 0.5,
        backoff_max_s: float = 1.0,
    ) -> None:
        self.transport = SerialTransport(url, read_timeout_s=read_timeout_s)
        self.store = PeerStore(store_path)
        self.stats = PeerStats()
        self.decoder_stats = DecoderStats()
        self._on_apply = on_apply
        self._command_timeout_s = command_timeout_s
        self._backoff_max_s = backoff_max_s
        self._stream: bytes | None = None
        self._nacked_at: int | None = None
        self._commands: deque[tuple[int, bytes]] = deque()
        self._command_sent_at = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def send_command(self, payload: bytes) -> int:
        """Queue a command for the link; it is resent until acknowledged. Returns its sequence."""
        with self._lock:
            seq = self.store.next_command_seq()
            self._commands.append((seq, bytes(payload)))
        return seq

    def start(self) -> "ReferencePeer":
        self._thread = threading.Thread(target=self.run, name="reference peer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def close(self) -> None:
        self.stop()
        self.transport.close()
        self.store.close()

    def __enter__(self) -> "ReferencePeer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self) -> None:
        backoff = 0.02
        while not self._stop.is_set():
            try:
                self.transport.open()
                backoff = 0.02
                self._serve()
            except LinkDown as exc:
                self.stats.disconnects += 1
                log.info("peer: %s", exc)
                self.transport.close()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max_s)

    def _serve(self) -> None:
        decoder = FrameDecoder(stats=self.decoder_stats)
        while not self._stop.is_set():
            self._send_commands()
            frames = decoder.receive(self.transport.read(), time.monotonic(), QUIET_S)
            if frames:
                self._handle(frames)

    def _handle(self, frames: list[Frame]) -> None:
        fresh: list[Applied] = []
        replies: list[Frame] = []
        stream = self._stream
        upto = self.store.applied_upto(stream) if stream else 0
        for frame in frames:
            if frame.type is FrameType.HELLO:
                if fresh:  # commit what the old session sent before switching streams
                    self._commit(stream, upto, fresh)
                    fresh = []
                stream, base = parse_hello(frame.payload)
                self.stats.hellos += 1
                upto = max(self.store.applied_upto(stream), base - 1)
                if upto != self.store.applied_upto(stream):
                    self._commit(stream, upto, [])
                self._stream, self._nacked_at = stream, None
                with self._lock:
                    self._command_sent_at = 0.0  # in session now: a waiting command goes out at once
                replies.append(Frame(upto, FrameType.HELLO_ACK, stream))
            elif frame.type in (FrameType.RESULT, FrameType.FAILSAFE):
                if stream is None:
                    replies.append(Frame(0, FrameType.HELLO))  # "who are you?": we lost the session
                elif frame.seq == upto + 1:
                    upto = frame.seq
                    fresh.append(Applied(stream, frame.seq, frame.type, frame.payload))
                elif frame.seq <= upto:
                    self.stats.duplicates += 1
                else:
                    self.stats.gaps += 1
                    if self._nacked_at != upto:  # one NACK per gap, not one per frame behind it
                        self._nacked_at = upto
                        replies.append(Frame(upto, FrameType.NACK))
            elif frame.type is FrameType.COMMAND_ACK:
                with self._lock:
                    if self._commands and self._commands[0][0] == frame.seq:
                        self._commands.popleft()
                        self._command_sent_at = 0.0
        if fresh:
            self._commit(stream, upto, fresh)
        if stream is not None and any(f.type in (FrameType.RESULT, FrameType.FAILSAFE) for f in frames):
            replies.append(Frame(upto, FrameType.ACK))
        if replies:
            self.transport.write(b"".join(f.encode() for f in replies))

    def _commit(self, stream: bytes, upto: int, fresh: list[Applied]) -> None:
        self.store.commit(stream, upto, fresh)
        self.stats.applied += len(fresh)
        if self._on_apply is not None:
            for result in fresh:
                self._on_apply(result)

    def _send_commands(self) -> None:
        with self._lock:
            if not self._commands and self._stream is not None:
                return
            now = time.monotonic()
            if now - self._command_sent_at < self._command_timeout_s:
                return
            self._command_sent_at = now
            if self._stream is None:  # no session yet: announce ourselves, hold the commands
                frame = Frame(0, FrameType.HELLO)
            else:
                seq, payload = self._commands[0]
                frame = Frame(seq, FrameType.COMMAND, payload)
        self.transport.write(frame.encode())
        if frame.type is FrameType.COMMAND:
            self.stats.commands_sent += 1
