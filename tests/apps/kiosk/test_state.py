"""KioskState: counts, rates, percentiles, the bounded gallery and history, and subscriptions that never block."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import tracemalloc

import cv2
import numpy as np
import pytest

from apps.kiosk import overlay
from apps.kiosk.state import MAX_PENDING, MAX_REASONS, Follower, KioskState, reason_key
from apps.kiosk.types import Decision, Part, Verdict
from runtime.errors import BadInput


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def decision(seq: int, verdict: Verdict = Verdict.PASS, *, failsafe: bool = False, reason: str = "ok",
             total: float | None = 10.0, heatmap: np.ndarray | None = None, version: str = "1") -> Decision:
    latency = {} if total is None else {"infer": total / 2, "total": total}
    return Decision(seq, f"frame-{seq}", verdict, reason, None, 0.5, 0.9, failsafe, "parts", version, latency, heatmap)


def part_image(value: int = 120) -> np.ndarray:
    image = np.full((64, 80, 3), value, np.uint8)
    image[10:30, 10:30] = (200, 40, 40)
    return image


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state(clock: Clock) -> KioskState:
    return KioskState(clock=clock, wall=lambda: 1.7e9 + clock.t, temperature=None, bucket_s=10.0, history=5,
                      gallery=3, latency_window=100)


def test_counts_rates_and_percentiles(state: KioskState, clock: Clock) -> None:
    for seq in range(100):
        verdict = Verdict.REJECT if seq % 4 == 0 else Verdict.PASS
        state.on_decision(decision(seq, verdict, total=float(seq + 1)))
        clock.t += 0.05  # 20 parts/s
    snap = state.snapshot()
    assert snap["counts"] == {"parts": 100, "pass": 75, "reject": 25, "review": 0, "failsafe": 0, "saturated": 0}
    assert snap["rates"]["reject_pct"] == 25.0 and snap["rates"]["pass_pct"] == 75.0
    assert snap["rates"]["parts_per_s"] == pytest.approx(20.0, rel=0.02)  # 100 parts in the last 5 s, window 5 s
    assert snap["latency_ms"]["p50"] == pytest.approx(np.percentile(np.arange(1, 101), 50))
    assert snap["latency_ms"]["p99"] == pytest.approx(np.percentile(np.arange(1, 101), 99))
    assert snap["latency_ms"]["stages"]["infer"]["p50"] == pytest.approx(np.percentile(np.arange(1, 101) / 2, 50))
    json.dumps(snap, allow_nan=False)


def test_rate_forgets_parts_outside_the_window(state: KioskState, clock: Clock) -> None:
    for seq in range(50):
        state.on_decision(decision(seq))
    clock.t += state.rate_window_s + 1  # a quiet line: parts/s falls to 0, the counts stay
    snap = state.snapshot()
    assert snap["rates"]["parts_per_s"] == 0.0 and snap["counts"]["parts"] == 50


def test_latency_window_is_bounded(state: KioskState) -> None:
    for seq in range(150):  # the first 50 (slow ones) leave the 100-decision window
        state.on_decision(decision(seq, total=1000.0 if seq < 50 else 5.0))
    assert state.snapshot()["latency_ms"] == {"n": 100, "p50": 5.0, "p99": 5.0, "stages": {"infer": {"p50": 2.5,
                                                                                                    "p99": 2.5}}}


def test_failsafe_reasons_are_grouped_and_capped(state: KioskState) -> None:
    state.on_decision(decision(0, Verdict.REJECT, failsafe=True, reason="deadline: no decision in 153 ms"))
    state.on_decision(decision(1, Verdict.REJECT, failsafe=True, reason="deadline: no decision in 171 ms"))
    for seq in range(2, 2 + MAX_REASONS + 5):  # a reason per part must not grow the dict without bound
        state.on_decision(decision(seq, Verdict.REJECT, failsafe=True, reason=f"odd{seq}"))
    reasons = state.snapshot()["failsafe_reasons"]
    assert reasons["deadline"] == 2
    assert len(reasons) == MAX_REASONS + 1 and reasons["other"] == 6
    assert state.snapshot()["counts"]["failsafe"] == MAX_REASONS + 7
    assert reason_key("corrupt frame: /x/y.png: cannot decode") == "corrupt frame" and reason_key(":") == "unknown"


def test_history_buckets_roll_with_gaps_and_stay_bounded(state: KioskState, clock: Clock) -> None:
    state.on_decision(decision(0, total=4.0))
    state.on_decision(decision(1, Verdict.REJECT, total=8.0))
    clock.t += 25.0  # two bucket widths and a half later: one empty bucket between
    state.on_decision(decision(2, Verdict.REVIEW))
    buckets = state.snapshot()["history"]["buckets"]
    assert [b["parts"] for b in buckets] == [2, 0, 1]
    assert buckets[0]["reject"] == 1 and buckets[0]["p50"] == 6.0 and buckets[1]["p99"] is None
    assert buckets[1]["t"] - buckets[0]["t"] == pytest.approx(10.0)
    clock.t += 1e6  # a long stop: still only the history's worth of buckets, the last one current
    state.on_decision(decision(3))
    buckets = state.snapshot()["history"]["buckets"]
    assert len(buckets) == 6 and [b["parts"] for b in buckets] == [0, 0, 0, 0, 0, 1]


def test_gallery_keeps_the_newest_rejects_with_their_pictures(state: KioskState) -> None:
    heat = np.zeros((8, 10), np.float32)
    heat[1:4, 1:4] = 1.0  # the top-left corner glows
    state.on_decision(decision(0, Verdict.REJECT, heatmap=heat), part_image())
    for seq in range(1, 5):
        state.on_decision(decision(seq, Verdict.REJECT), part_image())
    state.on_decision(decision(5, Verdict.PASS), part_image())
    state.on_decision(decision(6, Verdict.REJECT, failsafe=True, reason="corrupt frame"))  # no frame
    gallery = state.snapshot()["gallery"]
    assert [g["n"] for g in gallery] == [6, 5, 4] and [g["seq"] for g in gallery] == [6, 4, 3]
    assert gallery[0]["image"] is False and gallery[1]["image"] is True
    assert state.reject_picture(1) is None  # gone from the gallery: numbers are never reused
    assert state.reject_picture(6) is None  # had no frame
    picture = state.reject_picture(5)
    assert picture[:3] == b"\xff\xd8\xff"  # JPEG


def test_kept_frames_are_display_sized(state: KioskState) -> None:
    # a camera's 1080p frames: the gallery and the recent frames keep what the page shows, not 6 MB a reject
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seq in range(40):
            frame = np.full((1080, 1920, 3), seq, np.uint8)
            state.on_decision(decision(seq, Verdict.REJECT), frame)
            del frame
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 8 * 2**20, f"{kept / 2**20:.0f} MB kept for a 3-reject gallery and 8 recent frames"
    shown = cv2.imdecode(np.frombuffer(state.reject_picture(40), np.uint8), cv2.IMREAD_COLOR)
    assert shown.shape == (360, 640, 3) and shown[5, 5, 0] == 39


def test_heat_map_is_blended_into_the_picture() -> None:
    heat = np.zeros((8, 10), np.float32)
    heat[:4, :5] = 1.0
    plain = cv2.imdecode(np.frombuffer(overlay.encode(part_image(), None, fmt="png"), np.uint8), cv2.IMREAD_COLOR)
    hot = cv2.imdecode(np.frombuffer(overlay.encode(part_image(), heat, fmt="png"), np.uint8), cv2.IMREAD_COLOR)
    assert plain.shape == hot.shape == (64, 80, 3)
    diff = np.abs(plain.astype(int) - hot.astype(int)).sum(axis=2)
    assert diff[:28, :36].mean() > 60  # the hot quarter (upsampled from 4x5 of 8x10) is tinted
    assert diff[40:, 50:].max() == 0  # where the heat is 0 the frame is unchanged
    with pytest.raises(BadInput, match="HxW"):
        overlay.blend(part_image(), np.zeros((2, 2, 2), np.float32))
    with pytest.raises(BadInput, match="uint8"):
        overlay.blend(np.zeros((4, 4, 3), np.float32), None)


def test_large_frames_are_scaled_down_for_the_page() -> None:
    big = np.zeros((1200, 1600, 3), np.uint8)
    shown = cv2.imdecode(np.frombuffer(overlay.encode(big), np.uint8), cv2.IMREAD_COLOR)
    assert shown.shape == (480, 640, 3)


def test_frame_picture_is_the_asked_part_while_it_is_recent(state: KioskState) -> None:
    assert state.frame_picture() is None
    state.on_decision(decision(0), part_image(10))
    state.on_decision(decision(1), part_image(250))
    state.on_decision(decision(2, Verdict.REJECT, failsafe=True, reason="corrupt frame"))  # no frame: latest is #1
    assert state.frame_picture()[0] == 1
    seq, picture = state.frame_picture(0)
    dark = cv2.imdecode(np.frombuffer(picture, np.uint8), cv2.IMREAD_COLOR)
    assert seq == 0 and dark[50, 50].max() < 40
    assert state.frame_picture(12345)[0] == 1  # not among the recent ones: the latest
    assert state.snapshot()["last"]["seq"] == 2 and state.snapshot()["last"]["image"] is False


def test_saturation_turns_on_and_off(state: KioskState, clock: Clock) -> None:
    # the pipeline's stats: "saturation" counts parts the full box decided by the fail-safe, "saturated" is its flag
    state.set_pipeline({"decided": 10, "saturation": 0, "saturated": False})
    assert state.snapshot()["saturated"] is False
    state.set_pipeline({"decided": 20, "saturation": 3, "saturated": False})  # the count rose between two reads
    assert state.snapshot()["saturated"] is True
    clock.t += state.saturation_hold_s + 0.1
    state.set_pipeline({"decided": 30, "saturation": 3, "saturated": False})  # no new saturated part
    assert state.snapshot()["saturated"] is False
    state.set_pipeline({"decided": 31, "saturation": 3, "saturated": True})  # the queue is full right now
    assert state.snapshot()["saturated"] is True
    clock.t += state.saturation_hold_s + 0.1
    assert state.snapshot()["saturated"] is False
    state.on_decision(decision(0, Verdict.REJECT, failsafe=True, reason="saturated: queue full (32 parts)"))
    state.on_decision(decision(1, Verdict.REJECT, failsafe=True, reason="deadline: no decision in 150 ms"))
    state.on_decision(decision(2, Verdict.REJECT, reason="saturated: a class name"))  # a model verdict: not counted
    snap = state.snapshot()
    assert snap["saturated"] is True and snap["counts"]["saturated"] == 1
    assert snap["pipeline"] == {"decided": 31, "saturation": 3, "saturated": True}


def test_plc_state_object_is_shown_as_its_fields(state: KioskState) -> None:
    from apps.kiosk.plc import PlcState

    state.set_plc(PlcState("frames", "/dev/pts/3", False, 4, 1.5, 10, 12, 14))
    plc = state.snapshot()["plc"]
    assert plc["connected"] is False and plc["backlog"] == 4 and plc["last_acked_part"] == 12
    state.set_plc(None)
    assert state.snapshot()["plc"] is None


def test_snapshot_is_json_for_whatever_the_app_hands_in(state: KioskState) -> None:
    state.set_plc({"connected": np.bool_(True), "backlog": np.int64(2), "last_ack": None, "rtt_ms": float("nan"),
                   "verdict": Verdict.PASS, "port": object()})
    state.set_source({"frames": np.int32(7), "restarts": [1, 2]})
    snap = json.loads(json.dumps(state.snapshot(), allow_nan=False))
    assert snap["plc"]["connected"] is True and snap["plc"]["backlog"] == 2 and snap["plc"]["rtt_ms"] is None
    assert snap["plc"]["verdict"] == "pass" and isinstance(snap["plc"]["port"], str)
    assert snap["source"] == {"frames": 7, "restarts": [1, 2]}


def test_model_follows_the_decisions(state: KioskState) -> None:
    state.set_model("parts", "1")
    state.on_decision(decision(0, version="2"))  # a swap shows as soon as the new version decides
    assert state.snapshot()["model"] == {"name": "parts", "version": "2"}


def test_temperature_is_read_seldom_and_never_invented(clock: Clock) -> None:
    reads = []

    def sensor() -> float | None:
        reads.append(clock.t)
        return 51.26

    state = KioskState(clock=clock, temperature=sensor)
    assert state.snapshot()["temperature_c"] == 51.3
    state.snapshot()
    assert len(reads) == 1
    clock.t += 10
    state.snapshot()
    assert len(reads) == 2
    assert KioskState(clock=clock, temperature=lambda: None).snapshot()["temperature_c"] is None

    def broken() -> float:
        raise OSError("EIO")

    assert KioskState(clock=clock, temperature=broken).snapshot()["temperature_c"] is None


def test_slow_subscriber_never_blocks_the_writer(state: KioskState) -> None:
    slow = state.subscribe(maxsize=4)  # never read until the end
    started = time.monotonic()
    for seq in range(2000):
        state.on_decision(decision(seq))
    assert time.monotonic() - started < 5.0
    notes = slow.get(timeout=0)
    assert len(notes) == 4 and slow.dropped == 1996
    assert [n["seq"] for n in notes] == [1996, 1997, 1998, 1999]  # the newest kept
    slow.close()
    assert state.subscribers == 0
    state.on_decision(decision(9999))  # a closed subscription gets nothing and costs nothing
    assert slow.get(timeout=0) == []


def test_thread_reader_is_woken(state: KioskState) -> None:
    sub = state.subscribe()
    got = []
    reader = threading.Thread(target=lambda: got.extend(sub.get(timeout=10)))
    reader.start()
    time.sleep(0.05)
    state.set_plc({"connected": False})
    reader.join(10)
    assert got == [{"kind": "plc"}]


def test_asyncio_reader_is_woken_from_another_thread(state: KioskState) -> None:
    async def main() -> list:
        sub = state.subscribe(loop=asyncio.get_running_loop())
        threading.Timer(0.05, lambda: state.on_decision(decision(7, Verdict.REJECT))).start()
        notes = await sub.next(timeout=10)
        assert await sub.next(timeout=0.01) == []  # nothing more: a timeout, not an error
        sub.close()
        assert await sub.next(timeout=10) == []  # closed: returns at once
        return notes

    started = time.monotonic()
    assert asyncio.run(main()) == [{"kind": "decision", "seq": 7, "verdict": "reject"}]
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("kwargs, match", [
    ({"gallery": 0}, "gallery"),  # a gallery of nothing would hide every reject
    ({"history": -1}, "history"),
    ({"latency_window": 1.5}, "latency_window"),
    ({"bucket_s": 0}, "bucket_s"),  # zero-width buckets would never roll
    ({"rate_window_s": -1}, "rate_window_s"),
])
def test_bad_settings_are_one_line(kwargs: dict, match: str) -> None:
    with pytest.raises(BadInput, match=match):
        KioskState(**kwargs)


def test_on_part_gives_the_decision_its_frame(state: KioskState) -> None:
    # the pipeline's on_decision gets only the Decision: the frame comes from the part seen on capture
    state.on_part(Part(5, "frame-5", "dir", 0.0, part_image(250)))
    state.on_part(Part(6, "frame-6", "dir", 0.0, None, error="cannot decode"))
    state.on_decision(decision(5, Verdict.REJECT))
    state.on_decision(decision(6, Verdict.REJECT, failsafe=True, reason="corrupt_frame: cannot decode"))
    gallery = state.snapshot()["gallery"]
    assert [(g["seq"], g["image"]) for g in gallery] == [(6, False), (5, True)]
    bright = cv2.imdecode(np.frombuffer(state.reject_picture(1), np.uint8), cv2.IMREAD_COLOR)
    assert bright[50, 60].min() > 200
    assert state._pending == {}  # decided parts are forgotten
    for seq in range(MAX_PENDING + 10):  # parts never decided (cannot happen) still cannot grow it without bound
        state.on_part(Part(100 + seq, "f", "dir", 0.0, part_image()))
    assert len(state._pending) == MAX_PENDING


def test_an_unchanged_state_wakes_no_reader(state: KioskState) -> None:
    sub = state.subscribe()
    for _ in range(3):
        state.set_plc({"connected": True, "backlog": 0})
        state.set_source({"state": "running"})
    state.set_plc({"connected": True, "backlog": 1})
    assert sub.get(timeout=0) == [{"kind": "plc"}, {"kind": "source"}, {"kind": "plc"}]


def test_follower_copies_pull_states_and_survives_a_failing_reader(state: KioskState) -> None:
    calls = {"stats": 0, "plc": 0}

    def stats() -> dict:
        calls["stats"] += 1
        return {"decided": calls["stats"], "saturation": 0, "saturated": False}

    def plc() -> dict:
        calls["plc"] += 1
        if calls["plc"] == 2:
            raise OSError("port gone")  # one bad read: logged, the next poll goes on
        return {"connected": calls["plc"] > 2, "backlog": 0}

    with Follower(state, stats=stats, plc=plc, every_s=0.02) as follower:
        assert state.snapshot()["pipeline"]["decided"] == 1  # the first read happens before the thread starts
        deadline = time.monotonic() + 10
        while calls["plc"] < 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    snap = state.snapshot()
    assert snap["plc"] == {"connected": True, "backlog": 0} and snap["pipeline"]["decided"] >= 4
    assert not follower._thread.is_alive()
    with pytest.raises(BadInput, match="refresh period"):
        Follower(state, every_s=0)


def test_missing_opencv_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.errors import MissingDependency

    monkeypatch.setitem(sys.modules, "cv2", None)
    with pytest.raises(MissingDependency, match=r"edgerun\[kiosk\]"):
        overlay.encode(part_image())
