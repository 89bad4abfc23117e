"""A progress bar per stage on a terminal; silent otherwise (logs still go to the logger)."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

log = logging.getLogger(__name__)


class Progress:
    """``with Progress("tensors", total) as p: p.advance()``; draws only on a TTY."""

    def __init__(self, stage: str, total: int, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stage, self.total, self.done = stage, max(int(total), 1), 0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._t0 = time.monotonic()
        self._last = 0.0

    def __enter__(self) -> Progress:
        log.info("%s: started", self.stage)
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.done = self.total
            self._draw(force=True)
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
        log.info("%s: %s in %.1f s", self.stage, "done" if exc_type is None else "failed", time.monotonic() - self._t0)

    def advance(self, n: int = 1) -> None:
        self.set(self.done + n)

    def set(self, done: int) -> None:
        self.done = min(done, self.total)
        self._draw()

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        frac = self.done / self.total
        bar = "#" * int(30 * frac)
        self.stream.write(f"\r{self.stage:<12} [{bar:<30}] {100 * frac:5.1f}%  {now - self._t0:6.1f}s")
        self.stream.flush()
