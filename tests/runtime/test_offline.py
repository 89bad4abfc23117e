"""Offline is a guarantee: loading and generating makes no network call, not even a DNS lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).with_name("offline_probe.py")


def test_load_and_generate_open_no_connection(smollm) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, str(PROBE), "default"], capture_output=True, text=True, env=env, timeout=120, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["text"] and report["chat"]  # it really ran
    assert report["events"] == []
    assert report["hub_modules"] == []


def test_the_probe_would_see_a_connection(tmp_path: Path) -> None:
    """The audit hook is live: a deliberate loopback connect is recorded (so [] above means something)."""
    script = tmp_path / "p.py"
    script.write_text(
        "import sys, socket\nE=[]\nsys.addaudithook(lambda e,a: E.append(e) if e=='socket.connect' else None)\n"
        "s=socket.socket()\ntry:\n    s.connect(('127.0.0.1', 9))\nexcept OSError:\n    pass\nprint(E)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=True)
    assert "socket.connect" in out.stdout
