"""Where the kiosk's parts come from: a camera, a video file, a folder of images, optionally gated by a PLC trigger.

``open_source(spec, watch=False, trigger=None)`` takes ``camera:N``, a video ``FILE.mp4`` (.avi .mkv .mov .m4v)
or a ``DIR`` of images: this module knows every kind (a folder, a video and a trigger here, the camera in
apps.kiosk.camera). Each is a :class:`~apps.kiosk.source.Source`, a single-pass iterator of numbered
:class:`~apps.kiosk.types.Part`; that contract lives in apps.kiosk.source, which imports no kind, so the
kinds import it one way. A frame that cannot be read (a corrupt, truncated, empty or oversized file; a video
that ends before its frame count) still becomes a Part, with ``image=None`` and ``error`` saying why, so the
pipeline decides it fail-safe: a part on the line is never skipped because its picture was bad.

Ground truth (``Part.label``: ``good`` or the defect name, as scripts/make_parts.py writes them) comes from a
``labels.csv`` at the folder's root (columns ``file,label[,defect]``, file relative to the root) or a
``<video stem>.csv`` next to a video (``frame,label[,defect]``); None when there is none.

Everything read is bounded: image files by :data:`MAX_FILE_BYTES`, images and video frames by
:data:`~apps.kiosk.source.MAX_SIDE`/:data:`~apps.kiosk.source.MAX_PIXELS` (checked from the header, before
decoding), label files by :data:`MAX_LABELS_BYTES`. The camera is watched: see :class:`~apps.kiosk.camera.CameraSource`.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from apps.kiosk.camera import CameraSource
from apps.kiosk.source import MAX_PIXELS, MAX_SIDE, VALID_SPECS, Source, too_big
from apps.kiosk.types import Part
from runtime.errors import BadInput

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 << 20  # an image file larger than this is refused unread
MAX_LABELS_BYTES = 16 << 20
MAX_CAMERA = 63
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
VIDEO_EXTS = (".mp4", ".avi", ".mkv", ".mov", ".m4v")


# --- decoding, bounded -------------------------------------------------------------------------------------


def read_image(path: str | os.PathLike[str]) -> tuple[np.ndarray | None, str | None]:
    """``(HxWx3 uint8 RGB, None)``, or ``(None, reason)`` for a file that cannot be a part's picture."""
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        return None, f"unreadable: {exc.strerror}"
    if size == 0:
        return None, "empty file (0 bytes)"
    if size > MAX_FILE_BYTES:
        return None, f"file is {size} bytes, over the {MAX_FILE_BYTES}-byte cap"
    from PIL import Image

    try:
        with Image.open(path) as im:  # reads the header only
            reason = too_big(*im.size)
            if reason:
                return None, reason
            image = np.asarray(im.convert("RGB"))  # decodes fully: a truncated file raises here
    except Image.DecompressionBombError as exc:  # Pillow's own cap, hit before ours for absurd headers
        return None, f"image is over the cap ({MAX_SIDE} px a side, {MAX_PIXELS} pixels): {exc}"
    except Exception as exc:  # noqa: BLE001 -- Pillow's decoders raise many types on hostile files; all mean "corrupt"
        return None, f"corrupt image: {type(exc).__name__}: {exc}"
    return np.ascontiguousarray(image), None


def _read_labels(path: Path, key: str) -> dict[str, str]:
    """``{key: good | defect}`` from a labels CSV; {} when there is none or it is unusable (logged)."""
    try:
        if not path.is_file():
            return {}
        if path.stat().st_size > MAX_LABELS_BYTES:
            log.warning("%s is over %d bytes; ignoring its labels", path, MAX_LABELS_BYTES)
            return {}
        rows = csv.DictReader(io.StringIO(path.read_text(errors="replace")))
        out = {}
        for row in rows:
            if row.get(key) is None or not row.get("label"):
                continue
            out[row[key]] = row["label"] if row["label"] == "good" else (row.get("defect") or row["label"])
        return out
    except (OSError, csv.Error) as exc:
        log.warning("labels %s unusable: %s", path, exc)
        return {}


# --- folder ------------------------------------------------------------------------------------------------


class FolderSource(Source):
    """The image files under ``root`` (recursively, hidden entries skipped), in sorted relative-path order.

    ``watch=True``: after the files present, keep polling every ``poll_s`` for new ones (a file is taken once
    its modification time is ``settle_s`` old, so a half-written file is not read); stops on ``close()`` or
    after ``idle_s`` without a new file (None: never).
    """

    kind = "folder"

    def __init__(self, root: str | os.PathLike[str], *, watch: bool = False, poll_s: float = 0.2,
                 settle_s: float = 0.2, idle_s: float | None = None, name: str | None = None, **kw) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise BadInput(f"source {str(root)!r} is not a folder; valid: {VALID_SPECS}")
        if not 0.01 <= poll_s <= 60:
            raise BadInput(f"poll_s {poll_s!r} is outside 0.01..60 seconds")
        super().__init__(name or str(root), **kw)
        self.watch, self.poll_s, self.settle_s, self.idle_s = watch, poll_s, settle_s, idle_s
        self.live = watch
        self.labels = _read_labels(self.root / "labels.csv", "file")
        self._seen: set[str] = set()

    def _list(self) -> list[str]:
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            rel = Path(dirpath).relative_to(self.root)
            found += [(rel / f).as_posix() for f in filenames
                      if not f.startswith(".") and f.lower().endswith(IMAGE_EXTS)]
        return sorted(found)

    def _settled(self, rel: str) -> bool:
        try:
            return time.time() - (self.root / rel).stat().st_mtime >= self.settle_s
        except OSError:
            return True  # vanished or unreadable: read_image reports it as this part's error

    def _frames(self):
        last_new = time.monotonic()
        while not self._stop.is_set():
            fresh = [r for r in self._list() if r not in self._seen]
            if self.watch:
                fresh = [r for r in fresh if self._settled(r)]
            for rel in fresh:
                if self._stop.is_set():
                    return
                self._seen.add(rel)
                t = time.monotonic()
                image, error = read_image(self.root / rel)
                yield rel, image, error, self.labels.get(rel), t
            if not self.watch:
                return
            if fresh:
                last_new = time.monotonic()
            elif self.idle_s is not None and time.monotonic() - last_new >= self.idle_s:
                return
            self._stop.wait(self.poll_s)

    def grab(self, timeout_s: float = 1.0) -> Part | None:
        if not self.watch:
            return super().grab(timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            fresh = sorted(r for r in self._list() if r not in self._seen and self._settled(r))
            if fresh:
                rel = fresh[0]
                self._seen.add(rel)
                image, error = read_image(self.root / rel)
                return self.make_part(rel, image, error, self.labels.get(rel))
            self._stop.wait(min(self.poll_s, max(0.0, deadline - time.monotonic())))
        return None


# --- video file --------------------------------------------------------------------------------------------


class VideoSource(Source):
    """The frames of a video file; frame ids ``name#index``. A video that stops decoding before the frame
    count its container declares yields one more Part with ``error`` (a truncated or corrupt file)."""

    kind = "video"

    def __init__(self, path: str | os.PathLike[str], *, capture_factory: Callable | None = None, **kw) -> None:
        import cv2

        self.path = Path(path)
        if not self.path.is_file():
            raise BadInput(f"source {str(path)!r}: no such video file; valid: {VALID_SPECS}")
        super().__init__(kw.pop("name", None) or str(path), **kw)
        self._cap = (capture_factory or cv2.VideoCapture)(str(self.path))
        if not self._cap.isOpened():
            raise BadInput(f"source {str(path)!r}: OpenCV cannot decode this video; valid: {VALID_SPECS}")
        w, h = int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        reason = too_big(w, h)
        if reason:
            self._cap.release()
            raise BadInput(f"source {str(path)!r}: video {reason}")
        self.frame_count = max(0, int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT)))
        self.labels = _read_labels(self.path.with_suffix(".csv"), "frame")

    def _frames(self):
        index = 0
        try:
            while not self._stop.is_set():
                t = time.monotonic()
                ok, frame = self._cap.read()
                if not ok or frame is None:
                    break
                fid = f"{self.path.name}#{index}"
                reason = too_big(frame.shape[1], frame.shape[0]) if frame.ndim >= 2 else "frame has no pixels"
                image = None if reason else np.ascontiguousarray(frame[..., ::-1] if frame.ndim == 3 else np.dstack([frame] * 3))
                yield fid, image, reason, self.labels.get(str(index)), t
                index += 1
            if not self._stop.is_set() and index < self.frame_count:
                yield (f"{self.path.name}#{index}", None,
                       f"video stopped decoding at frame {index} of {self.frame_count} (truncated or corrupt)",
                       self.labels.get(str(index)), time.monotonic())
        finally:
            self._cap.release()

    def close(self) -> None:
        super().close()
        if self._gen is None:
            self._cap.release()
            return
        try:
            self._gen.close()  # runs its finally: the capture is released now, not at garbage collection
        except ValueError:
            pass  # iterating in another thread right now: it sees the stop flag at the next frame and releases


# --- spec --------------------------------------------------------------------------------------------------


def open_source(spec: str, *, watch: bool = False, trigger=None, first_seq: int = 1, **options) -> Source:
    """``camera:N`` | ``FILE.mp4`` | ``DIR`` -> an open Source; BadInput (one line naming the valid forms)
    for anything else. ``trigger`` (an object with ``wait(timeout_s) -> bool``, see apps.kiosk.triggers)
    wraps it in a :class:`TriggerSource`: one part per trigger. ``options`` go to the source's class."""
    if not isinstance(spec, str) or not spec.strip():
        raise BadInput(f"source {spec!r} is empty; valid: {VALID_SPECS}")
    m = re.fullmatch(r"camera:([0-9]{1,3})", spec.strip())
    if spec.startswith("camera:") and not (m and int(m.group(1)) <= MAX_CAMERA):
        raise BadInput(f"source {spec!r} is not a camera index; valid: {VALID_SPECS}")
    if m:
        source: Source = CameraSource(int(m.group(1)), first_seq=first_seq, **options).open()
    elif os.path.isdir(spec):
        source = FolderSource(spec, watch=watch, first_seq=first_seq, **options)
    elif os.path.isfile(spec) and spec.lower().endswith(VIDEO_EXTS):
        source = VideoSource(spec, first_seq=first_seq, **options)
    elif os.path.exists(spec):
        raise BadInput(f"source {spec!r} is neither a folder nor a video file; valid: {VALID_SPECS}")
    else:
        raise BadInput(f"source {spec!r} does not exist; valid: {VALID_SPECS}")
    if watch and not isinstance(source, FolderSource):
        source.close()
        raise BadInput(f"watch applies to a DIR source only, not {spec!r}")
    return source if trigger is None else TriggerSource(source, trigger)


class TriggerSource(Source):
    """One part per trigger: waits on ``trigger.wait(poll_s)``, then grabs one frame from ``source``.

    A trigger the source cannot answer (no frame within ``grab_timeout_s``, or the source is exhausted)
    still becomes a Part with ``error``: the PLC said a part is there, so it gets a (fail-safe) decision.
    Ends when the inner source is exhausted or on ``close()``.
    """

    kind = "trigger"

    def __init__(self, source: Source, trigger, *, poll_s: float = 0.1, grab_timeout_s: float = 1.0) -> None:
        if not callable(getattr(trigger, "wait", None)):
            raise BadInput(f"trigger {trigger!r} has no wait(timeout_s) -> bool method")
        super().__init__(source.name, seq=source.seq)
        self.source, self.trigger = source, trigger
        self.poll_s, self.grab_timeout_s = poll_s, grab_timeout_s
        self.triggers = 0

    def _frames(self):
        while not self._stop.is_set():
            if not self.trigger.wait(self.poll_s):
                continue
            self.triggers += 1
            t = time.monotonic()
            part = self.source.grab(self.grab_timeout_s)
            if part is not None:
                yield part
                continue
            yield (f"{self.name}@trigger{self.triggers}", None,
                   f"trigger {self.triggers}: the source gave no frame within {self.grab_timeout_s:g} s", None, t)
            if not self.source.live:  # a finished file or folder will not produce another frame
                return

    def __next__(self) -> Part:
        if self._gen is None:
            self._gen = self._frames()
        if self._stop.is_set():
            raise StopIteration
        item = next(self._gen)
        if isinstance(item, Part):
            self.delivered += 1
            self.errors += item.error is not None
            return item
        return self.make_part(*item)

    def health(self) -> dict[str, object]:
        return {**self.source.health(), "triggers": self.triggers, "trigger": getattr(self.trigger, "health", dict)()}

    def close(self) -> None:
        super().close()
        self.source.close()
