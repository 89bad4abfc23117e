"""The result link: journaled results go out over a serial transport until the peer acknowledges them.

One background thread owns the port. It connects (with exponential backoff
while the port is missing or refuses), says HELLO with the journal's stream id
and lowest unacknowledged sequence, learns how far the peer has applied, then
streams journal entries with a go-back-N window: up to ``window`` frames in
flight, cumulative ACKs delete from the journal, a NACK or an ACK timeout
rewinds to the first unacknowledged frame. Nothing is deleted before the peer
said it applied it, and the peer applies each sequence once, so a dropped
cable, a killed peer or a killed edgerun loses and duplicates nothing.

Results may be submitted while the link is down: they wait in the journal.

Acknowledgements are checked against what was sent: an ACK or NACK above the
highest sequence sent in this session is a protocol error, counted in
``bad_acks``, ignored and answered with a fresh handshake, so it never deletes
a result the peer cannot have seen. A HELLO_ACK above the journal's sent mark
(a journal restored from a backup) renumbers the held entries past the peer's
number (:meth:`Journal.adopt`) instead of dropping them.

Commands from the peer run once per command session: a session starts when the
port opens and again when the peer says HELLO (it restarted and its command
counter with it); within a session a COMMAND at or below the last one run is a
resend, acknowledged and not run again. A command whose COMMAND_ACK was lost
just before the link dropped can run again after the reconnect: across sessions
the link cannot tell that resend from a restarted peer's new command.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field

from devices.link.failsafe import FailSafe, FailSafePolicy, PendingDecision
from devices.link.frame import (
    DecoderStats,
    Frame,
    FrameDecoder,
    FrameType,
    hello_payload,
)
from devices.link.journal import Journal
from devices.link.transport import LinkDown, SerialTransport, SerialURL
from runtime.errors import BadInput

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkConfig:
    url: str
    window: int = 8  # frames in flight before waiting for an ACK
    ack_timeout_s: float = 0.25  # rewind and resend when the oldest frame is unacknowledged this long
    hello_timeout_s: float = 0.5  # resend HELLO this often until the peer answers
    backoff_initial_s: float = 0.05  # first wait after a failed open; doubles up to backoff_max_s
    backoff_max_s: float = 2.0
    quiet_s: float = 0.1  # a partial frame older than this (no bytes arriving) is dropped as noise
    read_timeout_s: float = 0.02  # longest a read blocks; bounds how late deadlines are noticed

    def __post_init__(self) -> None:
        SerialURL.parse(self.url)  # raises BadInput naming the bad URL
        if not (isinstance(self.window, int) and 1 <= self.window <= 64):
            raise BadInput(f"link window {self.window!r} is invalid; valid: an integer 1..64")
        for name in ("ack_timeout_s", "hello_timeout_s", "backoff_initial_s", "backoff_max_s", "quiet_s", "read_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise BadInput(f"link {name}={value!r} is invalid; give a positive number of seconds")


@dataclass
class LinkStats:
    connects: int = 0
    disconnects: int = 0
    open_failures: int = 0
    frames_sent: int = 0  # including resends
    resent: int = 0
    rewinds: int = 0  # go-back events (timeout or NACK)
    acked: int = 0  # journal entries deleted on acknowledgement
    nacks: int = 0
    commands: int = 0
    bad_acks: int = 0  # ACK/NACK above the highest seq sent: a confused peer, ignored, then a new handshake
    renumbered: int = 0  # held entries moved past a HELLO_ACK above the journal's sent mark
    decoder: DecoderStats = field(default_factory=DecoderStats)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "decoder"}
        out["decoder"] = self.decoder.to_dict()
        return out


class ResultLink:
    """Owns the transport and the link thread. ``with ResultLink(...) as link: link.submit(b"...")``."""

    def __init__(
        self,
        config: LinkConfig,
        journal: Journal,
        *,
        failsafe: FailSafePolicy | None = None,
        on_command=None,  # callable(bytes) for COMMAND frames from the peer, called once per command
    ) -> None:
        self.config = config
        self.journal = journal
        self.stats = LinkStats()
        self.transport = SerialTransport(config.url, read_timeout_s=config.read_timeout_s)
        self.failsafe = FailSafe(journal, failsafe, on_journal=self._wake) if failsafe else None
        self._on_command = on_command
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread: threading.Thread | None = None
        self._connected = threading.Event()
        self._last_command_seq = 0  # highest COMMAND seq run in this command session (see the module docstring)
        self._rehandshake = False

    # --- public API ----------------------------------------------------------------

    def start(self) -> "ResultLink":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"link {self.config.url}", daemon=True)
            self._thread.start()
        return self

    def submit(self, payload: bytes, type: FrameType = FrameType.RESULT, *, failsafe_reason: str | None = None) -> int:
        """Journal a result (durable when this returns) and return its sequence number.

        ``type=FrameType.FAILSAFE`` sends a fail-safe value decided by the caller (a kiosk's
        deadline or saturation reject); ``failsafe_reason`` goes to the journal's fail-safe log."""
        seq = self.journal.append(payload, type, failsafe_reason=failsafe_reason)
        self._wake()
        return seq

    def expect(self, trigger: str, deadline_s: float | None = None) -> PendingDecision:
        """Start a fail-safe clock for ``trigger``; answer it with :meth:`decide`."""
        if self.failsafe is None:
            raise BadInput("this link has no fail-safe policy; pass failsafe=FailSafePolicy(...) to use expect()")
        return self.failsafe.begin(trigger, deadline_s)

    def decide(self, pending: PendingDecision, payload: bytes) -> int | None:
        if self.failsafe is None:
            raise BadInput("this link has no fail-safe policy; use submit()")
        return self.failsafe.decide(pending, payload)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connected.wait(timeout_s)

    def drain(self, timeout_s: float) -> bool:
        """Wait until the journal is empty (everything acknowledged). False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._progress:
            while self.journal.backlog():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._progress.wait(min(left, 0.05))
        return True

    def close(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self.transport.close()

    def __enter__(self) -> "ResultLink":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the link thread -----------------------------------------------------------

    def _wake(self) -> None:
        port = self.transport._port
        cancel = getattr(port, "cancel_read", None)
        if cancel is not None:
            try:
                cancel()  # interrupts a blocking read so new results go out now, not at the read timeout
            except Exception as exc:  # the port may be closing under us; the next loop turn handles it
                log.debug("cancel_read: %s", exc)

    def _run(self) -> None:
        backoff = self.config.backoff_initial_s
        while not self._stop.is_set():
            self._poll_failsafe()
            try:
                self.transport.open()
            except LinkDown as exc:
                self.stats.open_failures += 1
                log.info("%s; retrying in %.2f s", exc, backoff)
                self._sleep(backoff)
                backoff = min(backoff * 2, self.config.backoff_max_s)
                continue
            self.stats.connects += 1
            try:
                self._session()
                backoff = self.config.backoff_initial_s
            except LinkDown as exc:
                self.stats.disconnects += 1
                log.warning("link down: %s", exc)
                self._sleep(backoff)  # a port that opens and dies at once must not spin
                backoff = min(backoff * 2, self.config.backoff_max_s)
            except Exception:  # a bug must not end the thread: results keep waiting in the journal
                self.stats.disconnects += 1
                log.exception("link thread error; reconnecting")
                self._sleep(self.config.backoff_max_s)
            finally:
                self._connected.clear()
                self.transport.close()

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._stop.is_set() and (left := end - time.monotonic()) > 0:
            self._stop.wait(min(left, 0.02))
            self._poll_failsafe()

    def _poll_failsafe(self) -> None:
        if self.failsafe is not None:
            self.failsafe.poll()

    def _session(self) -> None:
        """One connected session: handshake, then stream until stopped or the link drops."""
        decoder = FrameDecoder(stats=self.stats.decoder)
        self._last_command_seq = 0  # a new port session may face a restarted peer, counting from 1 again
        self._rehandshake = False
        acked = self._handshake(decoder)
        self._connected.set()
        next_seq = acked + 1
        sent_hi = acked  # highest seq sent this session: no valid ACK goes above it
        sent_at: dict[int, float] = {}
        while not self._stop.is_set():
            if self._rehandshake:  # the peer lost our stream (it said HELLO) or acknowledged what we never sent
                self._rehandshake = False
                acked = self._handshake(decoder)
                next_seq = acked + 1
                sent_hi = acked
                sent_at.clear()
            self._poll_failsafe()
            # fill the window
            in_flight = next_seq - 1 - acked
            if in_flight < self.config.window:
                entries = self.journal.pending(after=next_seq - 1, limit=self.config.window - in_flight)
                if entries:
                    now = time.monotonic()
                    out = bytearray()
                    for entry in entries:
                        out += Frame(entry.seq, entry.type, entry.payload).encode()
                        if entry.seq in sent_at:
                            self.stats.resent += 1
                        sent_at[entry.seq] = now
                    self.journal.sending(entries[-1].seq)  # durable before the bytes leave (see Journal.adopt)
                    self.transport.write(bytes(out))
                    self.stats.frames_sent += len(entries)
                    next_seq = entries[-1].seq + 1
                    sent_hi = max(sent_hi, entries[-1].seq)
            # read acknowledgements
            now = time.monotonic()
            for frame in decoder.receive(self.transport.read(), now, self.config.quiet_s):
                acked, next_seq = self._on_frame(frame, acked, next_seq, sent_hi)
            for seq in [s for s in sent_at if s <= acked]:
                del sent_at[seq]
            # retransmit: the oldest in-flight frame waited too long
            oldest = sent_at.get(acked + 1)
            if next_seq - 1 > acked and oldest is not None and now - oldest > self.config.ack_timeout_s:
                log.info("no ACK for seq %d in %.0f ms; resending from there", acked + 1, (now - oldest) * 1e3)
                self.stats.rewinds += 1
                next_seq = acked + 1

    def _handshake(self, decoder: FrameDecoder) -> int:
        """HELLO until HELLO_ACK; returns the sequence the peer has applied up to (and we dropped)."""
        stream = self.journal.stream_id
        base = self.journal.first_unacked()
        sent = None
        while not self._stop.is_set():
            now = time.monotonic()
            if sent is None or now - sent > self.config.hello_timeout_s:
                base = self.journal.first_unacked()
                self.transport.write(Frame(0, FrameType.HELLO, hello_payload(stream, base)).encode())
                sent = now
            self._poll_failsafe()
            for frame in decoder.receive(self.transport.read(), now, self.config.quiet_s):
                if frame.type is FrameType.HELLO_ACK and frame.payload == stream:
                    dropped, renumbered = self.journal.adopt(frame.seq)
                    self._dropped(dropped)
                    self.stats.renumbered += renumbered
                    log.info("peer has applied up to seq %d of this stream", frame.seq)
                    return max(frame.seq, base - 1)
                if frame.type is FrameType.COMMAND:
                    self._on_command_frame(frame)
                elif frame.type is FrameType.HELLO:  # a peer that just started: its commands count from 1 again
                    self._last_command_seq = 0
                # ACKs from a previous session are stale here; HELLO_ACK carries the same news
        raise LinkDown("link stopped")

    def _on_frame(self, frame: Frame, acked: int, next_seq: int, sent_hi: int) -> tuple[int, int]:
        if frame.type in (FrameType.ACK, FrameType.NACK):
            if frame.seq > sent_hi:
                # The peer claims results it cannot have had; trusting it would delete unsent ones.
                self.stats.bad_acks += 1
                log.warning(
                    "peer sent %s %d but the highest seq sent is %d; ignoring it and handshaking again",
                    frame.type.name, frame.seq, sent_hi,
                )
                self._rehandshake = True
                return acked, next_seq
            if frame.seq > acked:
                self._acknowledge(frame.seq)
                acked = frame.seq
            next_seq = max(next_seq, acked + 1)
            if frame.type is FrameType.NACK:
                self.stats.nacks += 1
                if next_seq > acked + 1:
                    self.stats.rewinds += 1
                    next_seq = acked + 1
        elif frame.type is FrameType.COMMAND:
            self._on_command_frame(frame)
        elif frame.type is FrameType.HELLO:
            # The peer restarted: it lost our stream, and its command counter starts again
            # at 1. Reset now, not at the handshake, so commands right behind the HELLO run.
            self._last_command_seq = 0
            self._rehandshake = True
        else:
            log.debug("ignoring %s frame seq %d from the peer", frame.type.name, frame.seq)
        return acked, next_seq

    def _on_command_frame(self, frame: Frame) -> None:
        self.transport.write(Frame(frame.seq, FrameType.COMMAND_ACK).encode())
        if frame.seq > self._last_command_seq:  # a resent command is acknowledged again, run once
            self._last_command_seq = frame.seq
            self.stats.commands += 1
            if self._on_command is not None:
                self._on_command(frame.payload)

    def _acknowledge(self, upto: int) -> None:
        self._dropped(self.journal.ack(upto))

    def _dropped(self, dropped: int) -> None:
        if dropped:
            self.stats.acked += dropped
            with self._progress:
                self._progress.notify_all()
