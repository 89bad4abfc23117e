"""The journal's sent mark and Journal.adopt: a peer ahead of the journal (a file restored from a backup)
costs no result, reuses no sequence number and leaves no gap the peer would wait on forever; in normal
operation (the peer never ahead of what was sent) it is a plain ack."""

from __future__ import annotations

import sqlite3

import pytest

from devices.link.frame import MAX_SEQ, FrameType
from devices.link.journal import Journal
from runtime.errors import BadInput


def _append(j: Journal, *payloads: bytes) -> list[int]:
    out = []
    for p in payloads:
        fs = p.startswith(b"fs")
        out.append(j.append(p, FrameType.FAILSAFE if fs else FrameType.RESULT, failsafe_reason="deadline" if fs else None))
    return out


def test_sending_raises_the_mark_over_the_whole_burst_durably(tmp_path):
    with Journal(tmp_path / "j.db") as j:
        assert j.sent_mark == 0  # a new journal has sent nothing
        _append(j, b"a", b"b", b"c")
        j.sending(1)
        assert j.sent_mark == 3  # one commit covers everything assigned so far, not one per frame
        _append(j, b"d")
        j.sending(3)  # already covered: nothing written
        assert j.sent_mark == 3
    with Journal(tmp_path / "j.db") as j:
        assert j.sent_mark == 3


def test_adopt_within_the_mark_is_an_ack(tmp_path):
    with Journal(tmp_path / "j.db") as j:
        _append(j, b"a", b"b", b"c")
        j.sending(3)
        assert j.adopt(2) == (2, 0)
        assert [e.seq for e in j.pending()] == [3]
        assert j.next_seq() == 4


def test_adopt_above_the_mark_renumbers_the_held_entries_right_after_the_peer(tmp_path):
    # 1..2 were sent; 3..5 (one a fail-safe) never were. The peer has applied up to 9: the file is a backup.
    with Journal(tmp_path / "j.db") as j:
        _append(j, b"a", b"b")
        j.sending(2)
        _append(j, b"c", b"fs-d", b"e")
        assert j.adopt(9) == (2, 3)
        assert [(e.seq, e.type, e.payload) for e in j.pending()] == [
            (10, FrameType.RESULT, b"c"), (11, FrameType.FAILSAFE, b"fs-d"), (12, FrameType.RESULT, b"e"),
        ]
        assert [(seq, reason) for seq, reason, _ in j.failsafes()] == [(11, "deadline")]  # the audit row moves with it
        assert j.adopt(9) == (0, 0)  # the same HELLO_ACK again (a second handshake) moves nothing
    with Journal(tmp_path / "j.db") as j:  # all of it was one committed transaction
        assert [e.seq for e in j.pending()] == [10, 11, 12]
        assert j.append(b"f") == 13


def test_an_acknowledged_failsafe_record_is_not_renumbered(tmp_path):
    with Journal(tmp_path / "j.db") as j:
        _append(j, b"fs-a")
        j.sending(1)
        j.ack(1)
        _append(j, b"fs-b")
        assert j.adopt(5) == (0, 1)
        assert [seq for seq, _, _ in j.failsafes()] == [1, 6]  # what was sent keeps its number in the audit trail


def test_adopt_above_the_mark_with_nothing_held_skips_the_peers_numbers(tmp_path):
    with Journal(tmp_path / "j.db") as j:
        _append(j, b"a")
        j.sending(1)
        j.ack(1)
        assert j.adopt(7) == (0, 0)
        assert j.append(b"b") == 8  # 2..7 are the peer's already


def test_a_journal_from_before_the_mark_trusts_its_numbers(tmp_path):
    path = tmp_path / "j.db"
    with Journal(path) as j:
        _append(j, b"a", b"b", b"c")
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM meta WHERE key = 'sent_mark'")  # as an older edgerun wrote it
    db.close()
    with Journal(path) as j:
        assert j.sent_mark == 3
        assert j.adopt(3) == (3, 0)  # the old behaviour: a peer within what was assigned is an ack


def test_renumbering_past_the_last_sequence_is_refused_and_changes_nothing(tmp_path):
    path = tmp_path / "j.db"
    Journal(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'next_seq'", (MAX_SEQ - 2,))
        db.execute("UPDATE meta SET value = ? WHERE key = 'sent_mark'", (MAX_SEQ - 3,))
    db.close()
    with Journal(path) as j:
        _append(j, b"a", b"b")
        with pytest.raises(BadInput, match="cannot renumber past the peer's seq"):
            j.adopt(MAX_SEQ - 1)
        assert [e.seq for e in j.pending()] == [MAX_SEQ - 2, MAX_SEQ - 1]
        assert j.sent_mark == MAX_SEQ - 3
