"""The soak: 10,000 results, both processes killed and restarted, cables pulled, noise injected; 0 lost, 0 duplicated.

Transport: two real ptys joined by the software null-modem, unpaced (ptys move
bytes as fast as the processes read them), so the soak measures the protocol's
recovery rather than 115200 baud (at 115200 the frames alone would take ~25 s;
bench/serial.py measures the paced line). The edgerun side and the PLC side
each run as their own process and are SIGKILLed at random moments; the edgerun
journal and the peer store are the only state that survives.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import time

import pytest

from devices.link.nullmodem import LineFaults
from tests.devices.conftest import REPO, PeerProcess

TOTAL = 10_000


class SenderProcess:
    def __init__(self, journal: str, url: str) -> None:
        self.journal, self.url = journal, url
        self.proc: subprocess.Popen | None = None

    def start(self) -> "SenderProcess":
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.devices.soak_sender", self.journal, self.url, str(TOTAL)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def _applied(store: str) -> list[tuple[int, bytes]]:
    db = sqlite3.connect(store)
    try:
        return [(seq, bytes(p)) for seq, p in db.execute("SELECT seq, payload FROM applied ORDER BY id")]
    except sqlite3.OperationalError:  # the peer has not created its tables yet
        return []
    finally:
        db.close()


@pytest.mark.slow
def test_soak_10000_results_no_loss_no_duplicates(tmp_path, make_cable):
    rng = random.Random(20240607)
    cable, a, b = make_cable(LineFaults(noise_rate=0.01, corrupt_rate=0.005, drop_rate=0.005, seed=7))
    journal, store = str(tmp_path / "journal.db"), str(tmp_path / "peer.db")
    peer = PeerProcess(b.url, store).start()
    sender = SenderProcess(journal, a.url).start()
    events = {"kill_peer": 0, "kill_sender": 0, "pull_a": 0, "pull_b": 0}
    schedule = ["kill_sender", "pull_a", "kill_peer", "pull_b"]  # each fault at least once, then random
    deadline = time.monotonic() + 240
    try:
        while sender.proc.poll() is None or sender.proc.returncode != 0:
            assert time.monotonic() < deadline, "soak did not finish"
            if sender.proc.poll() is not None:  # killed (or failed): restart it on the same journal
                assert sender.proc.returncode in (0, -9), sender.proc.stderr.read().decode()[-2000:]
                sender = SenderProcess(journal, a.url).start()
            time.sleep(rng.uniform(0.3, 1.2))
            if sender.proc.poll() is not None:
                continue
            event = schedule.pop(0) if schedule else rng.choice(list(events))
            events[event] += 1
            if event == "kill_peer":
                peer.kill()
                peer = PeerProcess(b.url, store).start()
            elif event == "kill_sender":
                sender.kill()
            else:
                cable.pull(a if event == "pull_a" else b, rng.uniform(0.05, 0.3))
    finally:
        sender.kill()
        peer.stop()
    applied = _applied(store)
    seqs = [seq for seq, _ in applied]
    assert len(seqs) - len(set(seqs)) == 0, "duplicated results"
    assert sorted(set(range(1, TOTAL + 1)) - set(seqs)) == [], "lost results"
    assert seqs == list(range(1, TOTAL + 1))  # and applied in order
    assert all(p == f"r{s}".encode() for s, p in applied)  # and intact
    assert events["kill_peer"] and events["kill_sender"], f"the random schedule must include both kills: {events}"
    print(f"soak events: {events}, cable: {cable.stats}")
