"""The outgoing journal: durable, ordered, sequence numbers never reused."""

from __future__ import annotations

import sqlite3

import pytest

from devices.link.frame import FrameType
from devices.link.journal import Journal
from runtime.errors import BadInput


def test_entries_survive_reopen_and_ack_removes_them(tmp_path):
    path = tmp_path / "j.db"
    with Journal(path) as j:
        stream = j.stream_id
        seqs = [j.append(f"r{i}".encode()) for i in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    with Journal(path) as j:  # a restarted process sees the same stream and backlog
        assert j.stream_id == stream
        assert [e.payload for e in j.pending()] == [b"r0", b"r1", b"r2", b"r3", b"r4"]
        assert j.ack(3) == 3
        assert [e.seq for e in j.pending()] == [4, 5]
        assert j.first_unacked() == 4


def test_sequence_numbers_are_not_reused_after_everything_is_acked(tmp_path):
    # The peer remembers "applied up to n"; reusing n after a restart would make it drop new results.
    path = tmp_path / "j.db"
    with Journal(path) as j:
        j.append(b"a")
        j.append(b"b")
        j.ack(2)
        assert j.first_unacked() == 3
    with Journal(path) as j:
        assert j.append(b"c") == 3


def test_journal_uses_wal_mode(tmp_path):
    with Journal(tmp_path / "j.db"):
        pass
    mode = sqlite3.connect(tmp_path / "j.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_failsafe_entries_are_logged_with_reason(tmp_path):
    with Journal(tmp_path / "j.db") as j:
        seq = j.append(b"reject", FrameType.FAILSAFE, failsafe_reason="no decision in 0.2 s")
        j.ack(seq)
        assert j.failsafes()[0][:2] == (seq, "no decision in 0.2 s")  # the record outlives the ACK


@pytest.mark.parametrize(
    "payload, ftype, message",
    [
        (b"x" * 1025, FrameType.RESULT, "exceeds the frame maximum"),  # would not fit a frame: refused before it is journaled
        (b"x", FrameType.ACK, "holds RESULT and FAILSAFE"),  # control frames are never journaled
    ],
)
def test_append_rejects_what_cannot_be_sent(tmp_path, payload, ftype, message):
    with Journal(tmp_path / "j.db") as j, pytest.raises(BadInput, match=message):
        j.append(payload, ftype)


def test_not_a_database_is_bad_input(tmp_path):
    path = tmp_path / "j.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(BadInput, match="not a usable SQLite database"):
        Journal(path)


def test_bad_durability_lists_choices(tmp_path):
    with pytest.raises(BadInput, match="valid: \\['full', 'normal'\\]"):
        Journal(tmp_path / "j.db", durability="sometimes")
