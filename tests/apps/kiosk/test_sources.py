"""apps/kiosk/sources.py, camera.py, triggers.py: parts from folders, videos, a watched camera and PLC triggers.

No camera exists here, so the watchdog is driven by injected fake captures; the triggers run against the real
Modbus simulator and the real frame-link peer over a pty null-modem.
"""

from __future__ import annotations

import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from apps.kiosk import sources
from apps.kiosk.camera import CameraSource
from apps.kiosk.sources import FolderSource, TriggerSource, VideoSource, open_source, read_image
from apps.kiosk.triggers import TRIGGER_COMMAND, CommandTrigger, ModbusTrigger
from runtime.errors import BadInput
from scripts import make_parts as mp


def _png(path: Path, image: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _huge_png_header(w: int, h: int) -> bytes:
    """A valid PNG signature and IHDR claiming w x h, with one tiny IDAT: 100 bytes that would decode to gigabytes."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b"")


# --- folder ------------------------------------------------------------------------------------------------


def test_folder_parts_sorted_numbered_and_labelled(tmp_path):
    mp.write_dataset(tmp_path, seed=1, size=40, n_good=2, n_bad=1, teach_fraction=0.0, video_parts=0)
    src = open_source(str(tmp_path / "test"), first_seq=41)
    parts = list(src)
    ids = [p.frame_id for p in parts]
    assert ids == sorted(ids) and len(ids) == 2 + len(mp.DEFECTS)
    assert [p.seq for p in parts] == list(range(41, 41 + len(parts)))
    assert {p.label for p in parts} == {"good", *mp.DEFECTS}  # good, or the defect name
    assert all(p.label == (p.frame_id.split("/")[1] if p.frame_id.startswith("bad/") else "good") for p in parts)
    first = next(p for p in parts if p.frame_id == "good/good_0000.png")
    assert np.array_equal(first.image, mp.render(1, None, 0, 40))  # RGB, not OpenCV's BGR
    assert all(p.error is None and p.source == str(tmp_path / "test") for p in parts)
    assert src.health()["parts"] == len(parts)


# Each hostile file must become a Part with its reason; the good images around it are still read.
HOSTILE = [
    ("b_empty.png", b"", "empty file (0 bytes)"),
    ("c_truncated.png", None, "corrupt image"),  # a real PNG cut in half (filled in below)
    ("d_garbage.jpg", b"\xff\xd8\xff\xe0 not really a jpeg" * 10, "corrupt image"),
    ("e_huge.png", _huge_png_header(100_000, 100_000), "over the cap"),  # Pillow's own bomb check answers first
    ("f_wide.png", _huge_png_header(9000, 4), "image is 9000x4, over the cap"),  # our per-side cap
]


def test_corrupt_and_oversized_files_become_parts_with_an_error(tmp_path):
    good = mp.render(0, None, 0, 40)
    _png(tmp_path / "a_good.png", good)
    full = (tmp_path / "a_good.png").read_bytes()
    for name, data, _ in HOSTILE:
        (tmp_path / name).write_bytes(full[: len(full) // 2] if data is None else data)
    _png(tmp_path / "g_good.png", good)
    (tmp_path / "notes.txt").write_text("not an image: skipped")
    parts = list(FolderSource(tmp_path))
    assert [p.frame_id for p in parts] == ["a_good.png", *(h[0] for h in HOSTILE), "g_good.png"]
    assert parts[0].error is None and parts[-1].error is None and np.array_equal(parts[-1].image, good)
    for part, (_, _, reason) in zip(parts[1:-1], HOSTILE, strict=True):
        assert part.image is None and reason in part.error, part.error
        assert "\n" not in part.error


def test_file_size_cap_is_checked_before_reading(tmp_path, monkeypatch):
    _png(tmp_path / "x.png", mp.render(0, None, 0, 40))
    monkeypatch.setattr(sources, "MAX_FILE_BYTES", 100)
    image, error = read_image(tmp_path / "x.png")
    assert image is None and "over the 100-byte cap" in error


def test_watched_folder_picks_up_new_files_once_settled(tmp_path):
    _png(tmp_path / "000.png", mp.render(0, None, 0, 32))
    src = FolderSource(tmp_path, watch=True, poll_s=0.02, settle_s=0.6, idle_s=1.0)
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(src))
    reader.start()
    end = time.monotonic() + 10
    while not got and time.monotonic() < end:  # a loaded box may take longer than any fixed sleep
        time.sleep(0.01)
    assert [p.frame_id for p in got] == ["000.png"]
    _png(tmp_path / "sub" / "001.png", mp.render(0, "spot", 0, 32))
    time.sleep(0.05)
    assert len(got) == 1  # too fresh: a camera may still be writing it (0.55 s of slack for a loaded box)
    while len(got) < 2 and time.monotonic() < end + 10:
        time.sleep(0.01)
    _png(tmp_path / "002.png", mp.render(0, None, 1, 32))
    reader.join(5.0)  # ends itself after idle_s without a new file
    assert not reader.is_alive()
    assert [p.frame_id for p in got] == ["000.png", "sub/001.png", "002.png"]
    assert [p.seq for p in got] == [1, 2, 3] and all(p.error is None for p in got)


def test_close_stops_a_watching_iteration(tmp_path):
    src = FolderSource(tmp_path, watch=True, poll_s=0.02)
    reader = threading.Thread(target=lambda: list(src))
    reader.start()
    time.sleep(0.1)
    src.close()
    reader.join(2.0)
    assert not reader.is_alive()


# --- video -------------------------------------------------------------------------------------------------


def test_video_frames_ids_and_labels(tmp_path):
    mp.write_video(tmp_path / "belt.mp4", seed=4, size=48, n_parts=3, frames_per_part=4)
    src = open_source(str(tmp_path / "belt.mp4"))
    assert isinstance(src, VideoSource)
    parts = list(src)
    assert [p.frame_id for p in parts] == [f"belt.mp4#{i}" for i in range(12)]
    defects = mp.belt_parts(4, 3)
    assert [p.label for p in parts] == [d or "good" for d in defects for _ in range(4)]
    expected = [img for *_, img in mp.belt_frames(4, 48, 3, 4)]
    assert all(np.abs(p.image.astype(int) - e).mean() < 12 for p, e in zip(parts, expected, strict=True))


class _ShortVideo:
    """A capture whose container says 5 frames but whose decoder gives up after 3 (a damaged file)."""

    def __init__(self, path):
        self.n = 0

    def isOpened(self):
        return True

    def get(self, prop):
        import cv2

        return {cv2.CAP_PROP_FRAME_WIDTH: 16, cv2.CAP_PROP_FRAME_HEIGHT: 8, cv2.CAP_PROP_FRAME_COUNT: 5}.get(prop, 0)

    def read(self):
        self.n += 1
        return (True, np.full((8, 16, 3), self.n, np.uint8)) if self.n <= 3 else (False, None)

    def release(self):
        pass


def test_video_that_stops_early_yields_one_error_part(tmp_path):
    (tmp_path / "v.mp4").write_bytes(b"stand-in")
    parts = list(VideoSource(tmp_path / "v.mp4", capture_factory=_ShortVideo))
    assert [p.error is None for p in parts] == [True, True, True, False]
    assert "stopped decoding at frame 3 of 5" in parts[3].error and parts[3].frame_id == "v.mp4#3"


def test_unreadable_video_is_bad_input(tmp_path):
    mp.write_video(tmp_path / "belt.mp4", seed=0, size=32, n_parts=1, frames_per_part=2)
    data = (tmp_path / "belt.mp4").read_bytes()
    (tmp_path / "cut.mp4").write_bytes(data[: len(data) // 3])  # mp4v's index is at the end: cut, it cannot open
    with pytest.raises(BadInput, match="OpenCV cannot decode this video"):
        open_source(str(tmp_path / "cut.mp4"))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "is empty"),
        ("camera:", "is not a camera index"),
        ("camera:-1", "is not a camera index"),
        ("camera:64", "is not a camera index"),  # beyond /dev/video63
        ("camera:0x1", "is not a camera index"),
        ("/no/such/place", "does not exist"),
        ("labels.csv", "neither a folder nor a video file"),  # exists, but is not a source
    ],
)
def test_bad_specs_name_the_valid_forms(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "labels.csv").write_text("file,label\n")
    with pytest.raises(BadInput, match=message) as exc:
        open_source(spec)
    assert "valid: camera:N" in str(exc.value) and "\n" not in str(exc.value)


def test_watch_applies_to_folders_only(tmp_path):
    mp.write_video(tmp_path / "belt.mp4", seed=0, size=32, n_parts=1, frames_per_part=1)
    with pytest.raises(BadInput, match="watch applies to a DIR source only"):
        open_source(str(tmp_path / "belt.mp4"), watch=True)


# --- camera (fake captures: there is no camera here) ---------------------------------------------------------


class FakeCamera:
    """A capture that delivers ``good`` frames, then fails reads (``mode="fail"``) or blocks in read (``"hang"``)."""

    def __init__(self, good: int, mode: str = "fail", period_s: float = 0.005):
        self.good, self.mode, self.period_s = good, mode, period_s
        self.reads = 0
        self.released = threading.Event()
        self.unblock = threading.Event()

    def isOpened(self):
        return True

    def read(self):
        time.sleep(self.period_s)
        if self.reads < self.good:
            self.reads += 1
            return True, np.full((6, 8, 3), (10, 20, 30), np.uint8)  # BGR
        if self.mode == "hang":
            self.unblock.wait(10.0)  # a V4L2 read that never returns (until the test ends)
        return False, None

    def release(self):
        self.released.set()


class Factory:
    def __init__(self, *cameras):
        self.cameras = list(cameras)
        self.opened: list = []

    def __call__(self, index):
        cam = self.cameras.pop(0) if self.cameras else FakeCamera(10**9)
        self.opened.append(cam)
        return cam


def _take(src, n, timeout_s=5.0):
    """Up to n parts; a camera that never delivers them is closed after timeout_s, ending the iteration."""
    out = []
    guard = threading.Timer(timeout_s, src.close)
    guard.start()
    try:
        for part in src:
            out.append(part)
            if len(out) == n:
                break
    finally:
        guard.cancel()
    return out


def test_watchdog_reopens_a_camera_whose_reads_fail():
    factory = Factory(FakeCamera(5, "fail"))
    with CameraSource(0, capture_factory=factory, stall_s=0.5, backoff_s=(0.01, 0.05)).open() as cam:
        parts = _take(cam, 12)
        h = cam.health()
    assert len(parts) == 12 and [p.seq for p in parts] == list(range(1, 13))
    assert len(factory.opened) >= 2 and factory.opened[0].released.is_set()
    assert h["restarts"] >= 1 and h["state"] == "running" and "reads in a row" in h["last_error"]
    assert parts[0].image[0, 0].tolist() == [30, 20, 10]  # BGR from the driver, RGB in the Part
    assert parts[0].frame_id == "camera:0#0" and parts[-1].frame_id.startswith("camera:0#")


def test_watchdog_abandons_a_camera_stuck_in_read():
    stuck = FakeCamera(3, "hang")
    factory = Factory(stuck)
    with CameraSource(2, capture_factory=factory, stall_s=0.2, backoff_s=(0.01, 0.05)).open() as cam:
        parts = _take(cam, 8)
        h = cam.health()
        assert h["restarts"] == 1 and "no frame for" in h["last_error"]
        assert h["last_frame_age_s"] is not None and h["last_frame_age_s"] < 0.2
        stuck.unblock.set()  # the driver call finally returns: the abandoned reader releases its own capture
        assert stuck.released.wait(2.0)
    assert len(parts) == 8 and len(factory.opened) == 2


def test_camera_that_will_not_reopen_reports_reconnecting_then_recovers():
    class Unplugged:
        def isOpened(self):
            return False

        def release(self):
            pass

    replugged = threading.Event()

    def factory(index):
        if factory.calls == 0:
            factory.calls += 1
            return FakeCamera(2, "fail")
        return FakeCamera(10**9) if replugged.is_set() else Unplugged()

    factory.calls = 0
    with CameraSource(1, capture_factory=factory, stall_s=0.2, backoff_s=(0.01, 0.02)).open() as cam:
        assert len(_take(cam, 2)) == 2
        deadline = time.monotonic() + 3
        while cam.health()["reopen_failures"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        h = cam.health()
        assert h["state"] == "reconnecting" and h["reopen_failures"] >= 2 and "cannot open /dev/video1" in h["last_error"]
        replugged.set()
        assert len(_take(cam, 3)) == 3
        assert cam.health()["state"] == "running"


def test_camera_without_a_device_is_one_line_bad_input():
    # the real V4L2 capture: this machine has no /dev/video63
    with pytest.raises(BadInput, match=r"^camera:63: cannot open /dev/video63 .*valid: camera:N") as exc:
        open_source("camera:63")
    assert "\n" not in str(exc.value)


def test_close_ends_a_waiting_camera_iteration():
    cam = CameraSource(0, capture_factory=Factory(FakeCamera(0, "hang")), stall_s=5.0).open()
    reader = threading.Thread(target=lambda: list(cam))
    reader.start()
    time.sleep(0.1)
    cam.close()
    reader.join(2.0)
    assert not reader.is_alive() and cam.health()["state"] == "closed"
    cam._factory.opened[0].unblock.set()


def test_camera_grab_takes_a_frame_newer_than_the_trigger():
    cam = CameraSource(0, capture_factory=Factory(FakeCamera(10**9, period_s=0.02)), buffer=4).open()
    try:
        time.sleep(0.2)  # the buffer fills with frames older than the trigger
        t0 = time.monotonic()
        part = cam.grab(1.0)
        assert part is not None and part.t_capture >= t0 and cam.health()["dropped"] > 0
    finally:
        cam.close()


# --- triggers ----------------------------------------------------------------------------------------------


def _folder(tmp_path, n):
    for i in range(n):
        _png(tmp_path / "parts" / f"{i:03d}.png", mp.render(0, None, i, 32))
    return str(tmp_path / "parts")


def test_trigger_source_one_part_per_trigger_and_an_error_part_when_frames_run_out(tmp_path):
    trig = CommandTrigger()
    src = open_source(_folder(tmp_path, 2), trigger=trig)
    assert isinstance(src, TriggerSource)
    for _ in range(3):
        trig.fire()
    parts = list(src)  # ends: the folder is exhausted
    assert [p.seq for p in parts] == [1, 2, 3]
    assert [p.error is None for p in parts] == [True, True, False]
    assert "gave no frame" in parts[2].error
    assert src.health()["triggers"] == 3 and src.health()["trigger"]["fired"] == 3


def test_serial_trigger_commands_over_the_frame_link(tmp_path):
    from devices.link.journal import Journal
    from devices.link.nullmodem import NullModem, PtyEnd
    from devices.link.peer import ReferencePeer
    from devices.link.sender import LinkConfig, ResultLink

    trig = CommandTrigger()
    a, b = PtyEnd(str(tmp_path / "tty-edgerun")), PtyEnd(str(tmp_path / "tty-plc"))
    with NullModem(a, b):
        link = ResultLink(LinkConfig(a.url), Journal(tmp_path / "journal.db"), on_command=trig.on_command).start()
        peer = ReferencePeer(b.url, str(tmp_path / "peer.db")).start()
        try:
            src = TriggerSource(FolderSource(_folder(tmp_path, 5)), trig, poll_s=0.05)
            peer.send_command(b"SOMETHING ELSE")  # not a trigger: acknowledged, ignored
            for _ in range(3):
                peer.send_command(TRIGGER_COMMAND)
            it = iter(src)
            parts = [next(it) for _ in range(3)]
            assert [p.frame_id for p in parts] == ["000.png", "001.png", "002.png"]
            assert trig.health() == {"kind": "command", "fired": 3, "pending": 0, "overflow": 0, "ignored": 1}
            assert not trig.wait(0.3)  # exactly one part per command, even if the link resent one
        finally:
            peer.close()
            link.close()


def test_modbus_trigger_fires_once_per_rising_edge(tmp_path):
    from devices.link.modbus import ModbusDecisionLink, ModbusMap, PlcSimulator
    from devices.link.nullmodem import NullModem, PtyEnd

    a, b = PtyEnd(str(tmp_path / "tty-edgerun")), PtyEnd(str(tmp_path / "tty-plc"))
    mapping = ModbusMap(trigger_input=3)
    with NullModem(a, b):
        with PlcSimulator(b.url + "?baud=115200", mapping) as plc, ModbusDecisionLink(a.url + "?baud=115200", mapping) as link:
            trig = ModbusTrigger(link, poll_s=0.005, lock=threading.Lock())
            src = TriggerSource(FolderSource(_folder(tmp_path, 4)), trig, poll_s=0.05)
            assert not trig.wait(0.05)  # input low: no part
            got = []
            for _ in range(2):
                plc.trigger = True
                got.append(next(iter(src)))
                assert not trig.wait(0.05)  # still high: the same part, not a new one
                plc.trigger = False
                assert not trig.wait(0.05)
            assert [p.frame_id for p in got] == ["000.png", "001.png"]
            assert trig.health()["fired"] == 2 and trig.health()["read_errors"] == 0


def test_closing_a_video_midway_releases_its_capture(tmp_path):
    released = []

    class Tracked(_ShortVideo):
        def release(self):
            released.append(True)

    (tmp_path / "v.mp4").write_bytes(b"stand-in")
    src = VideoSource(tmp_path / "v.mp4", capture_factory=Tracked)
    next(src)
    src.close()
    assert released and list(src) == []
