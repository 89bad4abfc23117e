"""runtime.speech.heap: the free memory that a worker thread's glibc arena keeps goes back to the system."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from runtime.speech import heap

MiB = 1 << 20


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not heap.available(), reason="the C library has no malloc_trim (not glibc)")
def test_trim_returns_what_a_worker_threads_arena_kept() -> None:
    kept: list[np.ndarray] = []

    def work() -> None:  # 2000 blocks of 64 KiB, under glibc's mmap threshold: they come from this thread's arena
        blocks = [np.ones(64 * 1024 // 8) for _ in range(2000)]
        kept.extend(blocks[::2])  # every other one stays in use: the freed ones are holes glibc does not give back

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    before = _rss()
    assert heap.trim() is True
    assert before - _rss() >= 40 * MiB  # ~62 MiB of holes
    assert sum(b.nbytes for b in kept) == 1000 * 64 * 1024  # still there, untouched
