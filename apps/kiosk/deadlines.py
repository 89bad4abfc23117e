"""One timer thread for many deadlines: ``add(deadline, item)``; ``on_due(item)`` runs on the timer's thread once
``time.monotonic()`` reaches the item's deadline, unless ``done(item)`` says it no longer needs it by then."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any


class DeadlineTimer:
    def __init__(self, on_due: Callable[[Any], None], done: Callable[[Any], bool], name: str = "deadlines") -> None:
        self._on_due, self._done = on_due, done
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()  # ties: first added, first due; items are never compared
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"edgerun-{name}", daemon=True)
        self._thread.start()

    def add(self, deadline: float, item: Any) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._order), item))
            if self._heap[0][2] is item:  # a new earliest deadline: the thread sleeps less
                self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        """Stop; deadlines not reached yet are forgotten."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            due = []
            with self._cond:
                while not due:
                    if self._closed:
                        return
                    now = time.monotonic()
                    while self._heap and (self._heap[0][0] <= now or self._done(self._heap[0][2])):
                        _, _, item = heapq.heappop(self._heap)
                        if not self._done(item):
                            due.append(item)
                    if not due:
                        self._cond.wait(self._heap[0][0] - now if self._heap else None)
            for item in due:
                self._on_due(item)
