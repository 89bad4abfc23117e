"""``edgerun kiosk teach``: bad input is one line and leaves nothing; from good parts alone it builds a bundle that
tells defective parts (taught and unseen types) from good ones; defective images tune it and add a supervised
head; versions install into the store and roll back like any bundle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from apps.cli import main
from converters.anomaly.teach import auroc
from tests.runtime.anomaly_fixture import TAUGHT, UNSEEN, parts_data, taught, taught_supervised  # noqa: F401

MIN_AUROC = 0.9


def _images(folder: Path, n: int, size: int = 48) -> Path:
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    return folder


def _refused(capsys: pytest.CaptureFixture[str], out: Path, argv: list[str], match: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*")), "nothing is left at or beside --out"


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _images(tmp_path / "good", 16)
    out = tmp_path / "bundle"
    _refused(capsys, out, ["kiosk", "teach", "--good", str(tmp_path / "nope"), "--out", str(out)], "no such directory")
    _refused(capsys, out, ["kiosk", "teach", "--good", str(good), "--out", str(out), "--false-reject", "2"], "--false-reject 2.0 must be")
    _refused(capsys, out, ["kiosk", "teach", "--good", str(good), "--out", str(out), "--false-reject", "0"], "--false-reject")
    _refused(capsys, out, ["kiosk", "teach", "--good", str(good), "--out", str(out), "--false-reject", "x"], "invalid float")
    _refused(capsys, out, ["kiosk", "teach", "--good", str(good), "--out", str(out), "--coreset", "0"], "--coreset 0.0 must be")
    _refused(capsys, out, ["kiosk", "teach", "--good", str(good), "--out", str(out), "--seed", "-1"], "--seed -1")
    _refused(capsys, out, ["kiosk", "teach", "--good", str(good), "--out", str(out), "--size", "100"], "multiple of 16")
    _refused(capsys, out, ["kiosk", "teach", "--good", str(good), "--out", str(out), "--bad", str(tmp_path / "nope")],
             "--bad")
    _refused(capsys, out, ["kiosk", "teach", "--good", str(_images(tmp_path / "few", 9)), "--out", str(out)], "too few")
    _refused(capsys, out, ["kiosk", "teach", "--good", str(_images(tmp_path / "empty", 0)), "--out", str(out)], "no images")
    _refused(capsys, out, ["kiosk", "teach", "--out", str(out)], "--good")
    (tmp_path / "exists").mkdir()
    assert main(["kiosk", "teach", "--good", str(good), "--out", str(tmp_path / "exists")]) == 2
    assert "already exists" in capsys.readouterr().err


def _scores(det, paths: list[Path]) -> np.ndarray:
    return np.array([d.score for d in det.detect_files(paths)])


@pytest.mark.slow
def test_teach_from_good_parts_alone_tells_defects_apart(taught) -> None:  # noqa: F811
    from runtime.bundle.manifest import read_manifest_dir
    from runtime.classify.anomaly import AnomalyDetector

    assert taught.exit_code == 0
    manifest = read_manifest_dir(taught.bundle)
    assert {f.role for f in manifest.files} == {"weights", "bank", "report"}  # no head without defective images
    rep = taught.report
    assert rep["bad_images"] == 0 and rep["auroc"] is None and rep["head"] is None
    assert rep["false_reject"]["chosen"] == 0.01 and rep["false_reject"]["measured_held_out"] <= 0.01
    assert rep["feature_gate"]["passed"] and rep["feature_gate"]["cosine_mean"] >= 0.9
    assert manifest.reports["teach"]["threshold"] == manifest.anomaly.threshold
    with AnomalyDetector.load(str(taught.bundle), batch=8, threads=1) as det:
        good = _scores(det, taught.test_good)  # never taught: the test split
        for group in (TAUGHT, UNSEEN):
            bad = np.concatenate([_scores(det, taught.test_bad(t)) for t in group])
            assert auroc(good, bad) > MIN_AUROC, group
            assert (bad >= det.threshold).mean() > 3 * max((good >= det.threshold).mean(), 0.05), group
        assert (good >= det.threshold).mean() <= 0.1  # chosen 1 %: at most 5 of these 50 new good parts


@pytest.mark.slow
def test_defective_images_tune_the_threshold_and_train_a_head(taught_supervised, taught) -> None:  # noqa: F811
    from runtime.classify.anomaly import AnomalyDetector

    rep = taught_supervised.report
    assert taught_supervised.exit_code == 0 and set(rep["defect_types"]) == set(TAUGHT)
    # the report's AUROC is against the dozen held-out good images only (0.875 measured): the bar is lower there
    assert rep["auroc"] > 0.8 and rep["head"]["cv_auroc"] > 0.7
    assert rep["threshold"] <= rep["threshold_choice"]["from_good"]  # defects only ever move it down
    with AnomalyDetector.load(str(taught_supervised.bundle), threads=1) as det:
        good = det.detect_files(taught_supervised.test_good)
        bad = [d for t in TAUGHT for d in det.detect_files(taught_supervised.test_bad(t))]
        assert all(d.head_probability is not None for d in good + bad)
        p_good = np.array([d.head_probability for d in good])
        p_bad = np.array([d.head_probability for d in bad])
        # the supervised route on new images of the taught types: 0.90 measured (scratch 0.83, spot 0.93,
        # missing_hole 0.97); a linear head on pooled features sees a thin scratch less well than PatchCore's max
        assert auroc(p_good, p_bad) > 0.85


@pytest.mark.slow
def test_taught_versions_install_and_roll_back(taught, taught_supervised, store) -> None:  # noqa: F811
    from runtime.classify.anomaly import AnomalyDetector

    first = store.install(taught.bundle)
    second = store.install(taught_supervised.bundle)
    assert first.manifest.name == second.manifest.name == "parts" and first.manifest.version != second.manifest.version
    with AnomalyDetector.load("parts", threads=1) as det:
        assert det.model.manifest.version == second.manifest.version and det.head is not None
    store.rollback("parts")
    with AnomalyDetector.load("parts", threads=1) as det:
        assert det.model.manifest.version == first.manifest.version and det.head is None


def test_teaching_images_are_decoded_one_at_a_time(tmp_path: Path) -> None:
    """A folder of big photos: each is decoded and scaled to model size before the next is read, so memory holds
    one full-size photo, not the folder's (2000 photos of up to 64 Mpx would be hundreds of GB at once)."""
    import tracemalloc

    from PIL import Image

    from converters.anomaly.teach import load_images
    from runtime.bundle.manifest import Layout, ResizeMode, VisionSpec

    files = []
    for i in range(10):
        files.append(tmp_path / f"{i}.png")
        Image.new("RGB", (1600, 1200), (10 * i, 100, 200)).save(files[-1])
    one = 1600 * 1200 * 3
    spec = VisionSpec(size=32, layout=Layout.NHWC, resize=ResizeMode.STRETCH, output_is_logits=False)
    tracemalloc.start()
    try:
        x = load_images(files, spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert x.shape == (10, 32, 32, 3) and x.dtype == np.float32
    assert peak < 3 * one, f"{peak / one:.1f} decoded photos held at once"
