"""Peak RSS is the process's own, not inherited from the parent that started it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runtime.metrics import peak_rss_bytes, rss_bytes


def test_child_peak_is_its_own() -> None:
    ballast = bytearray(300 << 20)  # touched: 300 MB resident in this (parent) process
    ballast[:: 4096] = b"x" * len(ballast[:: 4096])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", "from runtime.metrics import peak_rss_bytes; print(peak_rss_bytes())"],
                         capture_output=True, text=True, check=True, env=env)
    assert int(out.stdout) < 100 << 20  # ru_maxrss would report >= 300 MB here
    assert peak_rss_bytes() >= rss_bytes() >= 300 << 20
    del ballast
