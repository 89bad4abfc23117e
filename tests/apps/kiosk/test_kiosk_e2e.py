"""The kiosk end to end: a generated image folder and belt video (scripts/make_parts.py) through a real ORT bundle,
the real pipeline, the PLC frame link over real ptys to the reference peer, the SQLite audit trail and the
dashboard state. Every part decided exactly once (seq 1..N, no gap, no duplicate) in the audit trail AND at the
PLC peer, every decision acknowledged; and the fault cases: the PLC cable pulled for a while, corrupt and
unreadable images, a camera that stops delivering, an overloaded box, a shutdown with parts in flight, a model
update on a running kiosk."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from apps.kiosk.app import Kiosk
from apps.kiosk.config import KioskConfig, read_config
from apps.kiosk.plc import decode
from apps.kiosk.types import Verdict
from devices.link.nullmodem import NullModem, PtyEnd
from devices.link.peer import PeerStore, ReferencePeer
from runtime.errors import BadInput
from tests.apps.kiosk import kiosk_e2e_data as data
from tests.apps.kiosk.kiosk_models import TimedLoader

FOLDER_FLOOR = 0.75  # measured here: 0.836 on the 55 held-out images (20 unseen-type defects), 0.861 on the video
VIDEO_FLOOR = 0.75


@pytest.fixture(scope="session")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return data.make_data(tmp_path_factory.mktemp("kiosk-parts") / "parts")


@pytest.fixture(scope="session")
def bundle(parts: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return data.teach_bundle(parts, tmp_path_factory.mktemp("kiosk-bundle") / "v1", "1")


@pytest.fixture(scope="session")
def bundle2(parts: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return data.teach_bundle(parts, tmp_path_factory.mktemp("kiosk-bundle") / "v2", "2")


@pytest.fixture(scope="session")
def anomaly(parts: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``edgerun kiosk teach`` (INT8 EfficientNet-Lite0 PatchCore): ~1-2 min on this 2-core box."""
    return data.teach_anomaly(parts, tmp_path_factory.mktemp("kiosk-anomaly") / "anomaly")


class Line:
    """A pty null-modem with the reference PLC peer on one end; the kiosk gets the other end's path."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.a, self.b = PtyEnd(str(tmp / "tty-kiosk")), PtyEnd(str(tmp / "tty-plc"))
        self.cable = NullModem(self.a, self.b).start()
        self.store = str(tmp / "peer.db")
        self.peer = ReferencePeer(self.b.url, self.store)
        self.peer.start()

    def applied(self) -> list[tuple[int, object]]:
        """(frame seq, decoded message) in the order the peer applied them, duplicates included."""
        store = PeerStore(self.store)
        try:
            return [(r.seq, decode(r.payload)) for r in store.results()]
        finally:
            store.close()

    def close(self) -> None:
        self.peer.stop()
        self.cable.close()


@pytest.fixture
def line(tmp_path: Path):
    ln = Line(tmp_path)
    yield ln
    ln.close()


def config(tmp: Path, line: Line, source: Path | str, model: Path, **kw) -> KioskConfig:
    base = KioskConfig(source=str(source), model=str(model), plc=line.a.url, plc_journal=tmp / "journal.db",
                       audit_db=tmp / "audit.db", dashboard=False, deadline_ms=2000, rate=50, threads=1)
    return replace(base, **kw)


def audit_rows(tmp: Path) -> list[dict]:
    db = sqlite3.connect(tmp / "audit.db")
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute("SELECT * FROM parts ORDER BY id")]
    finally:
        db.close()


def exactly_once(summary: dict, rows: list[dict], line: Line, n: int) -> None:
    """Seq 1..n decided once each, in the audit trail and at the PLC (in order), every result acknowledged."""
    assert (summary["parts"], summary["decided"], summary["undecided"], summary["twice"]) == (n, n, 0, [])
    assert sorted(r["seq"] for r in rows) == list(range(1, n + 1))
    assert {r["model"] for r in rows} == {summary["model"]}  # fail-safe rows name the deciding bundle too
    got = line.applied()
    assert [s for s, _ in got] == list(range(1, n + 1)), "a frame lost, repeated or out of order at the PLC"
    # each part once; in decision order (a corrupt frame's fail-safe is decided before the parts queued ahead of it)
    assert sorted(m.seq for _, m in got) == list(range(1, n + 1))
    assert [m.seq for _, m in got] == [r["seq"] for r in rows]  # the PLC got them in the order the trail recorded
    by_seq = {r["seq"]: r for r in rows}
    assert all(Verdict(by_seq[m.seq]["verdict"]) is m.verdict and bool(by_seq[m.seq]["failsafe"]) == m.failsafe
               for _, m in got), "the PLC and the audit trail disagree on a decision"
    plc = summary["plc"]
    assert (plc["backlog"], plc["last_acked_part"], plc["sent"]) == (0, rows[-1]["seq"], n)  # every result acknowledged


def labels_of(folder: Path) -> dict[str, str]:
    with open(folder / "labels.csv", newline="") as f:
        return {r["file"]: r["label"] for r in csv.DictReader(f)}


def accuracy(rows: list[dict], truth: dict[int, str]) -> float:
    right = sum((r["verdict"] == "pass") == (truth[r["seq"]] == "good") for r in rows)
    return right / len(rows)


# --- end to end --------------------------------------------------------------------------------------------------


def test_folder_end_to_end(tmp_path: Path, line: Line, parts: Path, bundle: Path) -> None:
    folder = parts / "test"
    with Kiosk(config(tmp_path, line, folder, bundle)) as kiosk:
        summary = kiosk.run()
    rows = audit_rows(tmp_path)
    n = len(labels_of(folder))
    exactly_once(summary, rows, line, n)
    assert summary["failsafe"] == 0 and all(r["failsafe"] == 0 for r in rows)
    assert sorted(r["frame_id"] for r in rows) == sorted(labels_of(folder))  # every file, once
    rejects = [r for r in rows if r["verdict"] == "reject"]
    assert rejects and all(r["image"] for r in rejects), "a reject without its picture"
    images = tmp_path / "audit-images"
    assert all((images / r["image"]).is_file() for r in rejects)
    assert summary["reject"] == len(rejects) and summary["pass"] + summary["reject"] + summary["review"] == n
    assert summary["latency_ms"]["p50"] is not None and summary["latency_ms"]["p99"] < 2000


def test_video_end_to_end(tmp_path: Path, line: Line, parts: Path, bundle: Path) -> None:
    with Kiosk(config(tmp_path, line, parts / "belt.mp4", bundle)) as kiosk:
        summary = kiosk.run()
    rows = audit_rows(tmp_path)
    with open(parts / "belt.csv", newline="") as f:
        frames = list(csv.DictReader(f))
    exactly_once(summary, rows, line, len(frames))
    assert [r["frame_id"] for r in rows] == [f"belt.mp4#{f['frame']}" for f in frames]
    assert summary["failsafe"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("source, floor", [("test", FOLDER_FLOOR), ("belt.mp4", VIDEO_FLOOR)])
def test_taught_anomaly_bundle_decides_held_out_parts(tmp_path: Path, line: Line, parts: Path, anomaly: Path,
                                                      source: str, floor: float) -> None:
    """The anomaly bundle `kiosk teach` built from good parts only (bad ones tune its threshold) decides held-out
    parts, including defect types it never saw, and the belt video of a seed it never saw."""
    cfg = config(tmp_path, line, parts / source, anomaly, rate=10, deadline_ms=10_000)
    with Kiosk(cfg) as kiosk:
        summary = kiosk.run()
    rows = audit_rows(tmp_path)
    exactly_once(summary, rows, line, len(rows))
    if source == "test":
        truth = {r["seq"]: labels_of(parts / "test")[r["frame_id"]] for r in rows}
    else:
        with open(parts / "belt.csv", newline="") as f:
            truth = {i + 1: r["label"] for i, r in enumerate(csv.DictReader(f))}
    assert len(rows) == len(truth) and summary["failsafe"] == 0
    acc = accuracy(rows, truth)
    print(f"kiosk e2e {source}: accuracy {acc:.3f} over {len(rows)} parts; {summary['latency_ms']}")
    assert acc >= floor, f"accuracy {acc:.3f} below the measured floor {floor}"
    rejects = [r for r in rows if r["verdict"] == "reject"]
    assert rejects and all(r["image"] and r["heatmap"] for r in rejects), "a reject without its picture and heat map"
    assert all(r["score"] > 0 for r in rows)  # anomaly scores


# --- fault cases -------------------------------------------------------------------------------------------------


def test_plc_link_down_for_a_while(tmp_path: Path, line: Line, parts: Path, bundle: Path) -> None:
    """The cable is pulled while parts are decided: decisions wait in the journal and reach the PLC in order."""
    kiosk = Kiosk(config(tmp_path, line, parts / "test", bundle, rate=40), plc_drain_s=15)
    kiosk.start()
    time.sleep(0.3)
    line.cable.pull(line.a, 1.0)  # parts keep coming while the cable is out
    down_backlog = kiosk.plc.state().backlog
    kiosk.wait()
    kiosk.close()
    summary = kiosk.summary()
    n = summary["parts"]
    assert n == len(labels_of(parts / "test"))
    assert down_backlog > 0  # decisions were journaled while the link was down
    exactly_once(summary, audit_rows(tmp_path), line, n)


def test_corrupt_and_unreadable_images_are_decided_fail_safe(tmp_path: Path, line: Line, parts: Path, bundle: Path) -> None:
    folder = tmp_path / "mixed"
    shutil.copytree(parts / "test" / "good", folder)
    names = sorted(p.name for p in folder.iterdir())
    (folder / names[2]).write_bytes((folder / names[2]).read_bytes()[:60])  # truncated PNG
    (folder / "garbage.png").write_bytes(b"not an image at all" * 10)
    (folder / "empty.jpg").write_bytes(b"")
    with Kiosk(config(tmp_path, line, folder, bundle)) as kiosk:
        summary = kiosk.run()
    rows = audit_rows(tmp_path)
    exactly_once(summary, rows, line, len(names) + 2)
    bad = {r["frame_id"]: r for r in rows if r["failsafe"]}
    assert set(bad) == {names[2], "garbage.png", "empty.jpg"}
    assert all(r["verdict"] == "reject" and r["reason"].startswith("corrupt_frame: ") for r in bad.values())
    assert summary["failsafe"] == 3 and summary["failsafe_by_reason"]["corrupt_frame"] == 3


class StallingCamera:
    """A fake V4L2 capture: frames from ``images``; the first capture stalls (read() blocks) after ``stall_after``
    frames, as an unplugged USB camera does; a reopened one delivers again."""

    opened: list[StallingCamera] = []

    def __init__(self, images: list[np.ndarray], stall_after: int) -> None:
        self.images, self.stall_after = images, stall_after
        self.n = 0
        self.released = threading.Event()
        self.generation = len(StallingCamera.opened)
        StallingCamera.opened.append(self)

    def isOpened(self) -> bool:  # noqa: N802 -- OpenCV's name
        return True

    def read(self):
        if self.generation == 0 and self.n >= self.stall_after:
            self.released.wait(5.0)  # stuck until abandoned (the watchdog opens another capture meanwhile)
            return False, None
        time.sleep(0.03)  # ~30 frames/s
        frame = self.images[self.n % len(self.images)][..., ::-1].copy()
        self.n += 1
        return True, frame

    def release(self) -> None:
        self.released.set()


def test_camera_that_stops_delivering_is_restarted_and_the_dashboard_shows_it(tmp_path: Path, line: Line,
                                                                             parts: Path, bundle: Path) -> None:
    images, _ = data.labelled_images(parts / "test")
    StallingCamera.opened = []
    cfg = config(tmp_path, line, "camera:0", bundle, max_parts=30, dashboard=True, port=0)
    kiosk = Kiosk(cfg, capture_factory=lambda index: StallingCamera(images, stall_after=8))
    from apps.kiosk import camera

    kiosk.start()
    assert isinstance(kiosk.source, camera.CameraSource)
    kiosk.source.stall_s = 0.5  # the watchdog's patience, shortened for the test
    try:
        assert kiosk.wait(60)
        kiosk.follower.poll()
        with urllib.request.urlopen(kiosk.dashboard.url + "api/state", timeout=10) as r:
            shown = json.loads(r.read())
    finally:
        kiosk.close()
    summary = kiosk.summary()
    assert len(StallingCamera.opened) >= 2  # reopened
    health = summary["source_health"]
    assert health["restarts"] >= 1 and "no frame" in (health["last_error"] or "")
    assert shown["source"]["kind"] == "camera" and shown["source"]["restarts"] >= 1, shown["source"]  # on the page
    assert shown["counts"]["parts"] > 0 and shown["model"] == {"name": "parts", "version": "1"}
    exactly_once(summary, audit_rows(tmp_path), line, 30)


def test_overloaded_box_decides_fail_safe_and_counts(tmp_path: Path, line: Line, parts: Path, bundle: Path) -> None:
    """Parts come faster than the (slowed, real) model decides them: the rest are fail-safe rejects, counted, and
    still exactly one decision per part."""
    loader = TimedLoader()
    loader.infer_s = 0.05  # 40 parts/s at most, fed at whatever rate the folder is read
    cfg = config(tmp_path, line, parts / "test", bundle, rate=0, deadline_ms=150, max_queue=4, batch=2)
    with Kiosk(cfg, loaders={"vision": loader}) as kiosk:
        summary = kiosk.run()
    rows = audit_rows(tmp_path)
    n = len(labels_of(parts / "test"))
    exactly_once(summary, rows, line, n)
    by_reason = summary["failsafe_by_reason"]
    assert by_reason["saturated"] > 0  # the overloaded line says it is saturated
    assert summary["failsafe"] == sum(r["failsafe"] for r in rows) == sum(by_reason.values())
    assert summary["failsafe"] < n  # the model still decided some
    assert all(r["verdict"] == "reject" for r in rows if r["failsafe"])


def test_shutdown_decides_the_parts_in_flight(tmp_path: Path, line: Line, parts: Path, bundle: Path) -> None:
    loader = TimedLoader()
    loader.infer_s = 0.4
    cfg = config(tmp_path, line, parts / "test", bundle, rate=0, deadline_ms=60_000, max_queue=64, batch=2)
    kiosk = Kiosk(cfg, loaders={"vision": loader})
    kiosk.start()
    time.sleep(0.5)  # some parts decided, most still queued
    kiosk.close()
    summary = kiosk.summary()
    rows = audit_rows(tmp_path)
    n = summary["parts"]
    assert n > 0
    exactly_once(summary, rows, line, n)
    shut = [r for r in rows if r["reason"].startswith("shutdown: ")]
    assert shut and all(r["failsafe"] and r["verdict"] == "reject" for r in shut)


def test_model_update_between_parts_and_rollback(tmp_path: Path, line: Line, parts: Path, bundle: Path,
                                                  bundle2: Path) -> None:
    toml = tmp_path / "kiosk.toml"
    toml.write_text(f'[model]\nref = "{bundle}"\n')
    cfg = replace(config(tmp_path, line, parts / "test", bundle, rate=30), path=toml)
    kiosk = Kiosk(cfg)
    kiosk.start()
    try:
        time.sleep(0.5)
        toml.write_text(f'[model]\nref = "{bundle2}"\n')  # the operator edits kiosk.toml and sends SIGHUP
        kiosk.request_reload()
        deadline = time.monotonic() + 20
        while kiosk.pipeline.stats()["version"] != "2" and time.monotonic() < deadline:
            kiosk.wait(0.2)
        assert kiosk.pipeline.stats()["version"] == "2"
        with pytest.raises(BadInput):
            kiosk.update_model(str(tmp_path / "no-such-bundle"))  # refused: version 2 keeps deciding
        assert kiosk.pipeline.stats()["version"] == "2"
        time.sleep(0.3)
        assert kiosk.rollback() == "1"
        kiosk.wait()
    finally:
        kiosk.close()
    summary = kiosk.summary()
    rows = audit_rows(tmp_path)
    exactly_once(summary, rows, line, summary["parts"])
    versions = [r["version"] for r in rows]
    # atomic between parts: 1...1 2...2 1...1, never interleaved
    runs = [v for i, v in enumerate(versions) if i == 0 or versions[i - 1] != v]
    assert runs == ["1", "2", "1"], runs


def test_config_file_validated_before_anything_starts(tmp_path: Path, line: Line, bundle: Path) -> None:
    toml = tmp_path / "kiosk.toml"
    toml.write_text('[source]\nspec = "camera:0"\n[audit]\nquota = "lots"\n')
    with pytest.raises(BadInput, match=r"\[audit\] quota"):
        read_config(toml)
    toml.write_text('[model]\nref = "x"\nthreads = 0\n')
    with pytest.raises(BadInput, match=r"\[model\] threads 0 is out of range"):
        read_config(toml)
    toml.write_text('[dashboard]\nhost = "0.0.0.0"\n')
    cfg = replace(read_config(toml), source=str(tmp_path), model=str(bundle), plc=line.a.url)
    with pytest.raises(BadInput, match="token"):
        Kiosk(cfg)
    with pytest.raises(BadInput, match="policy: unknown setting"):
        Kiosk(replace(cfg, host="127.0.0.1", policy={"colour": 1})).start()
    assert not (tmp_path / "audit.db").exists()
    assert Counter(t.name for t in threading.enumerate())["kiosk-capture"] == 0
