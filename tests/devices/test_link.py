"""The result link against the reference peer over real ptys: order, retransmission, duplicates, noise, reconnects."""

from __future__ import annotations

import threading
import time

import pytest

from devices.link.failsafe import FailSafePolicy
from devices.link.frame import FrameType
from devices.link.journal import Journal
from devices.link.nullmodem import LineFaults, TcpEnd
from devices.link.peer import ReferencePeer
from devices.link.sender import LinkConfig, ResultLink
from runtime.errors import BadInput


def _exactly_once(peer: ReferencePeer, n: int) -> None:
    got = [(r.seq, r.payload) for r in peer.store.results()]
    assert got == [(i, f"r{i}".encode()) for i in range(1, n + 1)]  # all, once each, in order, intact


def _run(tmp_path, cable_end_a, cable_end_b, n: int, *, config: dict | None = None, during=None):
    with Journal(tmp_path / "journal.db") as journal, ReferencePeer(cable_end_b.url, str(tmp_path / "peer.db")) as peer:
        peer.start()
        with ResultLink(LinkConfig(cable_end_a.url, **(config or {})), journal) as link:
            for i in range(1, n + 1):
                link.submit(f"r{i}".encode())
            if during:
                during(link)
            assert link.drain(30), f"journal still holds {journal.backlog()} results"
        peer.stop()
        _exactly_once(peer, n)
        return link.stats, peer.stats


def test_clean_line_delivers_in_order(tmp_path, make_cable):
    _, a, b = make_cable()
    stats, peer = _run(tmp_path, a, b, 300)
    assert stats.resent == 0 and peer.duplicates == 0  # nothing to repair on a clean line


def test_lost_frames_are_retransmitted_and_duplicates_applied_once(tmp_path, make_cable):
    # Dropping chunks both ways loses results (forcing resends) and ACKs (forcing duplicates).
    _, a, b = make_cable(LineFaults(drop_rate=0.05, seed=3))
    stats, peer = _run(tmp_path, a, b, 400)
    assert stats.resent > 0
    assert peer.duplicates + peer.gaps > 0


def test_noise_and_bit_flips_are_counted_and_skipped(tmp_path, make_cable):
    _, a, b = make_cable(LineFaults(noise_rate=0.3, corrupt_rate=0.05, seed=5))
    stats, _ = _run(tmp_path, a, b, 300)
    assert stats.decoder.noise_bytes + stats.decoder.rejected > 0


def test_reconnects_after_the_tty_disappears_and_returns(tmp_path, make_cable):
    cable, a, b = make_cable()

    def pull(link):
        assert link.wait_connected(5)
        cable.pull(a, 0.3)  # the USB adapter is unplugged, then plugged back in

    stats, _ = _run(tmp_path, a, b, 300, during=pull)
    assert stats.disconnects >= 1 and stats.connects >= 2


def test_socket_transport_on_loopback(tmp_path, make_cable):
    # socket:// (a serial device server) on one side, a pty on the PLC side.
    _, a, b = make_cable(a=TcpEnd("127.0.0.1"))
    assert a.url.startswith("socket://127.0.0.1:")
    _run(tmp_path, a, b, 200)


def test_peer_that_lost_its_memory_resumes_from_hello(tmp_path, make_cable):
    # A PLC without durable state reboots: the sender's HELLO says where to resume,
    # so it neither waits forever for results 1..n nor receives them again.
    _, a, b = make_cable()
    applied = []
    with Journal(tmp_path / "j.db") as journal, ResultLink(LinkConfig(a.url), journal) as link:
        with ReferencePeer(b.url, None, on_apply=lambda r: applied.append(r.seq)) as peer:
            peer.start()
            for _i in range(20):
                link.submit(b"x")
            assert link.drain(10)
        with ReferencePeer(b.url, None, on_apply=lambda r: applied.append(r.seq)) as peer:
            peer.start()
            for _i in range(20):
                link.submit(b"y")
            assert link.drain(10)
    assert applied == list(range(1, 41))


def test_failsafe_value_sent_when_the_deadline_passes(tmp_path, make_cable):
    _, a, b = make_cable()
    policy = FailSafePolicy(safe_value=b"reject", deadline_s=0.15)
    with Journal(tmp_path / "j.db") as journal, ReferencePeer(b.url, None) as peer:
        peer.start()
        with ResultLink(LinkConfig(a.url), journal, failsafe=policy) as link:
            on_time = link.expect("part-1")
            assert link.decide(on_time, b"accept") == 1  # decided in time: the real result
            late = link.expect("part-2")
            time.sleep(0.4)  # inference hangs past the deadline
            assert late.failsafe and late.seq == 2
            assert link.decide(late, b"accept") is None  # too late: the PLC already acted on reject
            assert link.drain(5)
            assert [(s, r.split("'")[1]) for s, r, _ in journal.failsafes()] == [(2, "part-2")]
        peer.stop()
        assert [(r.seq, r.type, r.payload) for r in peer.store.results()] == [
            (1, FrameType.RESULT, b"accept"),
            (2, FrameType.FAILSAFE, b"reject"),
        ]


def test_commands_from_the_peer_run_once_each(tmp_path, make_cable):
    _, a, b = make_cable(LineFaults(drop_rate=0.2, seed=11))  # lost COMMAND_ACKs make the peer resend
    seen = []
    done = threading.Event()

    def on_command(payload):
        seen.append(payload)
        if len(seen) == 5:
            done.set()

    with Journal(tmp_path / "j.db") as journal, ReferencePeer(b.url, None, command_timeout_s=0.05) as peer:
        peer.start()
        with ResultLink(LinkConfig(a.url), journal, on_command=on_command):
            for i in range(5):
                peer.send_command(f"trigger {i}".encode())
            assert done.wait(20)
            time.sleep(0.3)  # let any resend arrive: it must not run again
    assert seen == [f"trigger {i}".encode() for i in range(5)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"url": "serial0"}, "absolute path"),  # the URL is validated when the config is made
        ({"url": "loop://", "window": 0}, "window 0"),  # a window of 0 would never send
        ({"url": "loop://", "ack_timeout_s": -1}, "ack_timeout_s=-1"),  # negative timeouts
        ({"url": "loop://", "read_timeout_s": float("nan")}, "read_timeout_s=nan"),  # NaN compares false everywhere
    ],
)
def test_link_config_validation(kwargs, message):
    with pytest.raises(BadInput, match=message):
        LinkConfig(**kwargs)


def test_expect_without_policy_is_refused(tmp_path):
    with Journal(tmp_path / "j.db") as journal:
        link = ResultLink(LinkConfig("loop://"), journal)
        with pytest.raises(BadInput, match="no fail-safe policy"):
            link.expect("part")
