"""A V4L2 camera (OpenCV ``VideoCapture``) with a watchdog that reopens it when it stops delivering.

A reader thread owns each capture and fills a small buffer (oldest frames dropped and counted when the
consumer is slower than the camera: a dropped frame never became a part, so no part is lost). A watchdog
thread restarts the camera when the reader died (``fail_reads`` failed reads in a row, or an OpenCV error)
or when no frame arrived for ``stall_s``. A reader stuck inside ``read()`` is abandoned, not released from
another thread: it releases its own capture when the call returns. ``health()`` reports the state
(``running``, ``reconnecting``, ``closed``), restarts, the last frame's age and the last error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from apps.kiosk.source import VALID_SPECS, Source, too_big
from apps.kiosk.types import Part
from runtime.errors import BadInput

log = logging.getLogger(__name__)


def v4l2_capture(index: int):
    """The real camera: ``cv2.VideoCapture(index, CAP_V4L2)``, with OpenCV's own warnings kept off stderr."""
    import cv2

    level = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    try:
        return cv2.VideoCapture(index, cv2.CAP_V4L2)
    finally:
        cv2.utils.logging.setLogLevel(level)


class CameraSource(Source):
    """``camera:N``. ``capture_factory(index)`` returns an object with ``isOpened()``, ``read() -> (ok, BGR)``
    and ``release()`` (default :func:`v4l2_capture`; tests inject a fake one)."""

    kind = "camera"
    live = True

    def __init__(self, index: int, *, capture_factory: Callable | None = None, stall_s: float = 2.0,
                 fail_reads: int = 3, backoff_s: tuple[float, float] = (0.2, 5.0), buffer: int = 4, **kw) -> None:
        if not 0.05 <= stall_s <= 60:
            raise BadInput(f"camera stall_s {stall_s!r} is outside 0.05..60 seconds")
        if not 1 <= buffer <= 64:
            raise BadInput(f"camera buffer {buffer!r} is outside 1..64 frames")
        super().__init__(kw.pop("name", None) or f"camera:{index}", **kw)
        self.index = index
        self._factory = capture_factory or v4l2_capture
        self.stall_s, self.fail_reads, self.backoff_s = stall_s, fail_reads, backoff_s
        self._buf: deque[tuple[float, int, np.ndarray]] = deque(maxlen=buffer)
        self._cond = threading.Condition()
        self._generation = 0
        self._reader: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self.state = "new"
        self.restarts = 0  # times the watchdog found the camera stopped and reopened (or is reopening) it
        self.reopen_failures = 0
        self.frames = 0
        self.dropped = 0
        self.last_error: str | None = None
        self._last_frame_t: float | None = None
        self._started_t = 0.0

    # --- capture threads -----------------------------------------------------------------------------

    def _try_open(self) -> bool:
        try:
            cap = self._factory(self.index)
            opened = bool(cap.isOpened())
        except Exception as exc:  # noqa: BLE001 -- a driver/OpenCV failure is a state to report, not a crash
            self.last_error = f"cannot open: {type(exc).__name__}: {exc}"
            return False
        if not opened:
            cap.release()
            self.last_error = f"cannot open /dev/video{self.index} (no such camera, or it is busy)"
            return False
        with self._cond:
            self._generation += 1
            gen = self._generation
            self._started_t = time.monotonic()
            self.state = "running"
        self._reader = threading.Thread(target=self._read_loop, args=(gen, cap), name=f"{self.name} reader", daemon=True)
        self._reader.start()
        return True

    def _read_loop(self, gen: int, cap) -> None:
        fails = 0
        try:
            while not self._stop.is_set() and gen == self._generation:
                ok, frame = cap.read()
                if gen != self._generation:
                    break  # abandoned by the watchdog while blocked in read()
                if not ok or frame is None:
                    fails += 1
                    if fails >= self.fail_reads:
                        self.last_error = f"{fails} reads in a row returned no frame"
                        break
                    continue
                fails = 0
                with self._cond:
                    if len(self._buf) == self._buf.maxlen:
                        self.dropped += 1
                    self._last_frame_t = time.monotonic()
                    self._buf.append((self._last_frame_t, self.frames, frame))
                    self.frames += 1
                    self._cond.notify_all()
        except Exception as exc:  # noqa: BLE001 -- cv2.error and driver errors end this reader; the watchdog reopens
            self.last_error = f"read failed: {type(exc).__name__}: {exc}"
        finally:
            try:
                cap.release()
            except Exception as exc:  # noqa: BLE001 -- releasing a broken device must not hide the original failure
                log.debug("%s: release failed: %s", self.name, exc)

    def _watch(self) -> None:
        backoff = self.backoff_s[0]
        while not self._stop.wait(min(0.25, self.stall_s / 4)):
            now = time.monotonic()
            reader_alive = self._reader is not None and self._reader.is_alive()
            progress = max(self._last_frame_t or 0.0, self._started_t)
            if self.state == "running" and reader_alive and now - progress < self.stall_s:
                backoff = self.backoff_s[0]
                continue
            if self.state == "running":
                reason = self.last_error if not reader_alive else f"no frame for {now - progress:.1f} s"
                log.warning("%s stopped delivering (%s); reopening", self.name, reason)
                self.last_error = reason
                with self._cond:
                    self._generation += 1  # the old reader, if stuck in read(), releases its capture when it returns
                    self.state = "reconnecting"
                self.restarts += 1
            if self._try_open():
                log.info("%s reopened (restart %d)", self.name, self.restarts)
                continue
            self.reopen_failures += 1
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.backoff_s[1])

    # --- public --------------------------------------------------------------------------------------

    def open(self) -> "CameraSource":
        """Open the camera and start the watchdog; BadInput (one line) when there is no such camera."""
        if not self._try_open():
            raise BadInput(f"camera:{self.index}: {self.last_error}; valid: {VALID_SPECS}")
        self._watchdog = threading.Thread(target=self._watch, name=f"{self.name} watchdog", daemon=True)
        self._watchdog.start()
        return self

    def _take(self, timeout_s: float | None, newer_than: float = 0.0) -> tuple[float, int, np.ndarray] | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while not self._stop.is_set():
                while self._buf and self._buf[0][0] < newer_than:
                    self._buf.popleft()
                if self._buf:
                    return self._buf.popleft()
                left = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
                if left <= 0:
                    return None
                self._cond.wait(left)
        return None

    def _to_part(self, item: tuple[float, int, np.ndarray]) -> Part:
        t, n, frame = item
        fid = f"{self.name}#{n}"
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            return self.make_part(fid, None, f"camera frame {frame.shape} {frame.dtype} is not 8-bit BGR", None, t)
        reason = too_big(frame.shape[1], frame.shape[0])
        return self.make_part(fid, None if reason else np.ascontiguousarray(frame[..., ::-1]), reason, None, t)

    def _frames(self):  # unused: __next__ is overridden
        return iter(())

    def __next__(self) -> Part:
        item = self._take(None)
        if item is None:
            raise StopIteration
        return self._to_part(item)

    def grab(self, timeout_s: float = 1.0) -> Part | None:
        """The first frame captured after this call (a trigger wants the part in front of the camera now)."""
        item = self._take(timeout_s, newer_than=time.monotonic())
        return None if item is None else self._to_part(item)

    def health(self) -> dict[str, object]:
        age = None if self._last_frame_t is None else round(time.monotonic() - self._last_frame_t, 3)
        return {"source": self.name, "kind": self.kind, "state": "closed" if self._stop.is_set() else self.state,
                "restarts": self.restarts, "reopen_failures": self.reopen_failures, "last_frame_age_s": age,
                "frames": self.frames, "dropped": self.dropped, "parts": self.delivered, "errors": self.errors,
                "last_error": self.last_error}

    def close(self) -> None:
        super().close()
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
        for thread in (self._watchdog, self._reader):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=1.0)
