"""One source of parts: the contract every kind of source follows, and the bounds on the pictures it hands out.

A :class:`Source` is a single-pass iterator of :class:`~apps.kiosk.types.Part`; it numbers parts (``seq``,
from a :class:`SeqCounter`) as it hands them out, monotonically, never twice. The kinds (a folder, a video
file, a trigger in apps.kiosk.sources; a camera in apps.kiosk.camera) implement ``_frames()``; which kind a
``--source`` spec names is decided by :func:`apps.kiosk.sources.open_source`.

Every picture a source decodes, whatever its kind, is bounded by :data:`MAX_SIDE` and :data:`MAX_PIXELS`
(:func:`too_big`), checked from a header or a frame's shape before it becomes a part's image.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import numpy as np

from apps.kiosk.types import Part
from runtime.errors import BadInput

log = logging.getLogger(__name__)

MAX_SIDE = 8192  # pixels, either dimension
MAX_PIXELS = 40_000_000  # width x height
VALID_SPECS = "camera:N (N = 0..63, a V4L2 device), a video FILE (.mp4 .avi .mkv .mov .m4v), or a DIR of images"


def too_big(w: int, h: int) -> str | None:
    """Why a ``w`` x ``h`` picture is over the cap, or None when it is within it."""
    if w > MAX_SIDE or h > MAX_SIDE or w * h > MAX_PIXELS:
        return f"image is {w}x{h}, over the cap ({MAX_SIDE} px a side, {MAX_PIXELS} pixels)"
    return None


class SeqCounter:
    """Hands out part sequence numbers: monotonic, never reused (shared by a source and its trigger wrapper)."""

    def __init__(self, first: int = 1) -> None:
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise BadInput(f"first_seq {first!r} is invalid; valid: an integer >= 0")
        self._next = first
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            seq, self._next = self._next, self._next + 1
            return seq


class Source:
    """A single-pass iterator of Parts with ``health()``, ``grab()`` and ``close()`` (also a context manager).

    Subclasses implement ``_frames()``: a generator of ``(frame_id, image, error, label, t_capture)``.
    """

    kind = "source"
    live = False  # True when more frames may still come after a grab() came back empty (camera, watched folder)

    def __init__(self, name: str, *, first_seq: int = 1, seq: SeqCounter | None = None) -> None:
        self.name = name
        self.seq = seq or SeqCounter(first_seq)
        self._stop = threading.Event()
        self._gen: Iterator | None = None
        self.delivered = 0
        self.errors = 0

    def _frames(self) -> Iterator[tuple[str, np.ndarray | None, str | None, str | None, float]]:
        raise NotImplementedError

    def make_part(self, frame_id: str, image: np.ndarray | None, error: str | None = None,
                  label: str | None = None, t_capture: float | None = None) -> Part:
        part = Part(self.seq.take(), frame_id, self.name, time.monotonic() if t_capture is None else t_capture,
                    image if error is None else None, error, label)
        self.delivered += 1
        if error is not None:
            self.errors += 1
            log.warning("%s %s: %s", self.name, frame_id, error)
        return part

    def __iter__(self) -> "Source":
        return self

    def __next__(self) -> Part:
        if self._gen is None:
            self._gen = self._frames()
        if self._stop.is_set():
            raise StopIteration
        frame_id, image, error, label, t = next(self._gen)
        return self.make_part(frame_id, image, error, label, t)

    def grab(self, timeout_s: float = 1.0) -> Part | None:
        """One part now (a trigger fired); None when the source has nothing more (or nothing within ``timeout_s``)."""
        try:
            return next(self)
        except StopIteration:
            return None

    def health(self) -> dict[str, object]:
        return {"source": self.name, "kind": self.kind, "state": "closed" if self._stop.is_set() else "running",
                "parts": self.delivered, "errors": self.errors}

    def close(self) -> None:
        """Stop (also from another thread: a waiting iteration ends at its next poll)."""
        self._stop.set()

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
