"""Process measurements: resident memory now and at peak."""

from __future__ import annotations

import os

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")  # pragma: no cover - Linux always has it


def peak_rss_bytes() -> int:
    """Peak resident set size of this process image (VmHWM).

    Not ``getrusage().ru_maxrss``: Linux carries that across ``execve``, so a
    child started from a big parent (a test runner with models loaded) would
    report the parent's peak instead of its own.
    """
    return _status_kib("VmHWM:") * 1024


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE
