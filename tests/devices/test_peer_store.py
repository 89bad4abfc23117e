"""The reference peer's store shared by two threads: the peer's thread commits results while another numbers the
commands it sends (ReferencePeer.send_command, the serial-peer CLI's trigger loop), on one SQLite connection."""

from __future__ import annotations

import threading

from devices.link.frame import FrameType
from devices.link.journal import Journal
from devices.link.peer import Applied, PeerStore, ReferencePeer
from devices.link.sender import LinkConfig, ResultLink


class Held(list):
    """Results whose reading (inside :meth:`PeerStore.commit`'s transaction) waits for ``go``: a transaction held
    open while another thread asks for the store."""

    def __init__(self, results: list[Applied]) -> None:
        super().__init__(results)
        self.inside, self.go = threading.Event(), threading.Event()

    def __iter__(self):
        self.inside.set()
        assert self.go.wait(10)
        return super().__iter__()


def test_a_command_number_waits_for_the_commit_in_progress_on_another_thread(tmp_path) -> None:
    # Before the store's lock the second BEGIN failed at once ("cannot start a transaction within a transaction"):
    # in the peer's thread that ended it, and the kiosk's trigger never came (test_plc's shared-link test, loaded).
    store = PeerStore(str(tmp_path / "peer.db"))
    held = Held([Applied(b"s", 1, FrameType.RESULT, b"r1")])
    errors: list[BaseException] = []
    seqs: list[int] = []
    numbered = threading.Event()

    def run(job) -> threading.Thread:
        def body() -> None:
            try:
                job()
            except BaseException as exc:  # reported to the test, not lost on a thread
                errors.append(exc)

        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        return thread

    committer = run(lambda: store.commit(b"s", 1, held))
    try:
        assert held.inside.wait(10)  # the peer's transaction is open
        numberer = run(lambda: (seqs.append(store.next_command_seq()), numbered.set()))
        assert not numbered.wait(0.2) and errors == []  # it waits for the commit, and does not fail
        held.go.set()
        committer.join(10)
        numberer.join(10)
        assert not committer.is_alive() and not numberer.is_alive()
        assert errors == [] and seqs == [1] and store.applied_upto(b"s") == 1
    finally:
        held.go.set()
        committer.join(10)  # never close the connection under a transaction
        store.close()
    reopened = PeerStore(str(tmp_path / "peer.db"))  # both transactions committed, not only cached
    try:
        assert [r.payload for r in reopened.results()] == [b"r1"] and reopened.next_command_seq() == 2
    finally:
        reopened.close()


def test_the_peer_keeps_serving_while_commands_are_sent_during_a_stream(tmp_path, make_cable) -> None:
    """End to end: results stream to the peer while the test's thread sends commands; every command arrives once
    and every result is applied once (the peer's thread survived every commit)."""
    _, a, b = make_cable()
    seen: list[bytes] = []
    all_seen = threading.Event()
    n_commands, n_results = 60, 300

    def on_command(payload: bytes) -> None:
        seen.append(payload)
        if len(seen) == n_commands:
            all_seen.set()

    with Journal(tmp_path / "j.db") as journal, ReferencePeer(b.url, str(tmp_path / "peer.db"), command_timeout_s=0.05) as peer:
        peer.start()
        with ResultLink(LinkConfig(a.url), journal, on_command=on_command) as link:
            assert link.wait_connected(20)
            for i in range(n_results):
                link.submit(b"r%d" % i)
                if i % 5 == 0:
                    peer.send_command(b"c%d" % (i // 5))
            assert all_seen.wait(60), f"{len(seen)} of {n_commands} commands arrived"
            assert link.drain(60), f"journal still holds {journal.backlog()} results"
        peer.stop()
        assert [r.payload for r in peer.store.results()] == [b"r%d" % i for i in range(n_results)]
    assert seen == [b"c%d" % i for i in range(n_commands)]
