"""The result link against peers that restart, lie or outlive the sender's journal, over real ptys.

Each test is a fault the link must survive without losing, duplicating or
refusing anything: a PLC that reboots with its command counter back at 1, a peer
that acknowledges results it was never sent, and a journal file restored from a
backup older than what the peer has already applied.
"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from devices.link.frame import Frame, FrameType
from devices.link.journal import Journal
from devices.link.peer import ReferencePeer
from devices.link.sender import LinkConfig, ResultLink


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class LegacyPeer(ReferencePeer):
    """A PLC written to the older contract: it sends commands as soon as it starts, never saying HELLO first."""

    def _send_commands(self) -> None:
        with self._lock:
            if not self._commands or time.monotonic() - self._command_sent_at < self._command_timeout_s:
                return
            seq, payload = self._commands[0]
            self._command_sent_at = time.monotonic()
        self.transport.write(Frame(seq, FrameType.COMMAND, payload).encode())


class LyingPeer(ReferencePeer):
    """A correct peer that, once, acknowledges ``claim`` before the first results it receives."""

    def __init__(self, *args, claim: int, kind: FrameType, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.claim, self.kind, self.lied = claim, kind, False

    def _handle(self, frames: list[Frame]) -> None:
        if not self.lied and any(f.type is FrameType.RESULT for f in frames):
            self.lied = True
            self.transport.write(Frame(self.claim, self.kind).encode())
        super()._handle(frames)


def test_restarted_peer_counting_from_one_gets_its_commands_run(tmp_path, make_cable):
    # The PLC reboots on a live line (no results pending, as in trigger mode): its
    # counter is back at 1, below the 3 the link has run, so the old link took its
    # commands for resends, acknowledged them and never ran them.
    _, a, b = make_cable()
    seen: list[bytes] = []
    with Journal(tmp_path / "j.db") as journal, ResultLink(LinkConfig(a.url), journal, on_command=seen.append):
        with ReferencePeer(b.url, None, command_timeout_s=0.05) as peer:
            peer.start()
            for i in range(3):
                peer.send_command(f"before {i}".encode())
            assert _wait_for(lambda: len(seen) == 3, 10), seen
        with ReferencePeer(b.url, None, command_timeout_s=0.05) as peer:  # rebooted, no memory
            peer.start()
            assert [peer.send_command(f"after {i}".encode()) for i in range(2)] == [1, 2]
            assert _wait_for(lambda: len(seen) == 5, 10), seen
            time.sleep(0.3)  # resends (lost COMMAND_ACKs) must not run again within the session
    assert seen == [b"before 0", b"before 1", b"before 2", b"after 0", b"after 1"]


def test_peer_restarted_during_a_cable_pull_gets_its_commands_run(tmp_path, make_cable):
    # A PLC that never says HELLO (the older contract) reboots while the cable is out:
    # the reconnect starts a new command session, so its command 1 runs.
    cable, a, b = make_cable()
    seen: list[bytes] = []
    with Journal(tmp_path / "j.db") as journal, ResultLink(LinkConfig(a.url), journal, on_command=seen.append) as link:
        with LegacyPeer(b.url, None, command_timeout_s=0.05) as peer:
            peer.start()
            peer.send_command(b"before")
            assert _wait_for(lambda: len(seen) == 1, 10), seen
            time.sleep(0.2)  # its COMMAND_ACK arrives; no resend is left in flight
        pull = threading.Thread(target=cable.pull, args=(a, 0.5))
        pull.start()
        try:
            time.sleep(0.1)
            with LegacyPeer(b.url, None, command_timeout_s=0.05) as peer:
                peer.start()
                assert peer.send_command(b"after") == 1
                assert _wait_for(lambda: len(seen) == 2, 10), seen
                time.sleep(0.3)
        finally:
            pull.join(5)
        assert link.stats.disconnects >= 1
    assert seen == [b"before", b"after"]


@pytest.mark.parametrize("kind", [FrameType.ACK, FrameType.NACK])  # a NACK n also says "applied up to n"
def test_ack_above_anything_sent_deletes_nothing_and_the_session_recovers(tmp_path, make_cable, kind):
    # 50 results wait, at most 8 (the window) are in flight when the peer claims 40:
    # trusting it deleted 9..40 unsent, and the session then wedged resending 41..48
    # to a peer that wants 9.
    _, a, b = make_cable()
    n = 50
    with Journal(tmp_path / "j.db") as journal:
        for i in range(1, n + 1):
            journal.append(f"r{i}".encode())
        with LyingPeer(b.url, str(tmp_path / "peer.db"), claim=40, kind=kind) as peer:
            peer.start()
            with ResultLink(LinkConfig(a.url), journal) as link:
                assert link.drain(15), f"journal still holds {journal.backlog()} results"
            peer.stop()
            assert peer.lied
            assert [(r.seq, r.payload) for r in peer.store.results()] == [(i, f"r{i}".encode()) for i in range(1, n + 1)]
    assert link.stats.bad_acks == 1


def _copy_db(src, dst) -> None:
    """SQLite's online backup, the way an operator would take (and restore) one."""
    with sqlite3.connect(src) as s, sqlite3.connect(dst) as d:
        s.backup(d)
    s.close()
    d.close()


def test_journal_restored_from_a_backup_keeps_every_result_and_reuses_no_number(tmp_path, make_cable):
    _, a, b = make_cable()
    path, backup = tmp_path / "j.db", tmp_path / "backup.db"
    with ReferencePeer(b.url, str(tmp_path / "peer.db")) as peer:
        peer.start()
        with Journal(path) as journal:
            with ResultLink(LinkConfig(a.url), journal) as link:
                for i in range(1, 4):
                    link.submit(f"r{i}".encode())
                assert link.drain(10)
            journal.append(b"r4")  # journaled while the PLC was away: never sent
            journal.append(b"r5")
        _copy_db(path, backup)  # the backup: 1..3 delivered, 4..5 waiting
        with Journal(path) as journal, ResultLink(LinkConfig(a.url), journal) as link:
            for i in range(6, 11):
                link.submit(f"r{i}".encode())
            assert link.drain(10)  # the peer has applied 1..10
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / f"j.db{suffix}").unlink(missing_ok=True)
        _copy_db(backup, path)  # the disk is restored: the journal is back at 4..5, next seq 6
        with Journal(path) as journal:
            assert [e.seq for e in journal.pending()] == [4, 5]
            new = [journal.append(f"n{i}".encode()) for i in range(1, 3)]
            assert new == [6, 7]  # numbers the peer has already applied, for other results
            with ResultLink(LinkConfig(a.url), journal) as link:
                assert link.wait_connected(10)
                assert link.drain(10), f"journal still holds {journal.backlog()} results"
                assert link.submit(b"n3") == 15  # past the peer's 10 and the renumbered 11..14
                assert link.drain(10)
        peer.stop()
        got = [(r.seq, r.payload) for r in peer.store.results()]
    # r4 and r5 come again under new numbers (the backup cannot know they were sent
    # later); r1..r3 do not (acknowledged before the backup); n1..n3 all arrive, after
    # the peer's 10 with no gap and no number reused.
    assert got == [(i, f"r{i}".encode()) for i in range(1, 11)] + [
        (11, b"r4"), (12, b"r5"), (13, b"n1"), (14, b"n2"), (15, b"n3"),
    ]
    assert link.stats.renumbered == 4
