"""A real small file system for the kiosk's disk-full tests: a tmpfs of a few MiB, mounted for one test.

Mounting needs root (or CAP_SYS_ADMIN); where it cannot be had, the test that needs the real full disk is skipped
with the reason, and its twin with a refused write still runs. ``fill`` writes a filler file until the kernel says
ENOSPC, then gives ``leave`` bytes back, so the next write past them fails the way a full SD card does.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

MOUNT_S = 10  # seconds a mount or an unmount may take


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. "4m") at ``path``, unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                              capture_output=True, text=True, timeout=MOUNT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs for a real full disk here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a real full disk here (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=MOUNT_S)


def free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` with one file until ENOSPC, then give back ``leave`` bytes (rounded to pages). The file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            block = b"\xa5" * chunk
            while True:
                try:
                    os.write(fd, block)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
        if leave:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    assert free(disk) <= leave + 4096
    return filler
