"""Shared pieces for the serial tests: a software null-modem between two real ptys, and the peer as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from devices.link.nullmodem import LineFaults, NullModem, PtyEnd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


@pytest.fixture
def make_cable(tmp_path):
    """make_cable(faults=..., baud=...) -> (NullModem, end a, end b); closed after the test."""
    made = []

    def make(faults: LineFaults | None = None, baud: int | None = None, a=None, b=None):
        faults = LineFaults() if faults is None else faults
        a = a or PtyEnd(str(tmp_path / "tty-edgerun"))
        b = b or PtyEnd(str(tmp_path / "tty-plc"))
        cable = NullModem(a, b, faults=faults, baud=baud).start()
        made.append(cable)
        return cable, a, b

    yield make
    for cable in made:
        cable.close()


class PeerProcess:
    """``edgerun serial-peer`` as a real process, so tests can SIGKILL it."""

    def __init__(self, url: str, store: str) -> None:
        self.url, self.store = url, store
        self.proc: subprocess.Popen | None = None

    def start(self) -> "PeerProcess":
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "apps", "serial-peer", self.url, "--store", self.store, "--quiet"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
