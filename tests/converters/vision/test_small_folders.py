"""The default gate on a user's own small calibration folder: EfficientNet-Lite0 to INT8 TFLite, no --eval.

168 photos (the packaged ones and crops, flips and exposure changes of them, converters/vision/photos.py) in one
folder: the default rule holds 33 of them out of calibration and scores them. A good conversion must pass there,
whatever two or three top-5 misses do to the point value (converters/vision/gate.py judges top-5 agreement by its
95 % upper confidence bound); the broken ones, calibrated at half and at a tenth of the inputs' real range, must
still be refused (exit 7) when scored on 40 photos. Three conversions in all; the broken ones round to nearest
(GPTQ does not mend a clipped range, and nearest is faster).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from apps.cli import main as edgerun

pytestmark = pytest.mark.slow
PHOTOS, SCORED = 168, 40


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a folder of PHOTOS photos, a folder of SCORED others): real image statistics, nothing generated."""
    from converters.vision import photos

    root = tmp_path_factory.mktemp("small-folders")
    base = [p.rgb for p in photos.photos()]
    photos.write_folder(base + photos.variants(base, PHOTOS - len(base), seed=3), root / "mine")
    photos.write_folder(photos.variants(base, SCORED, seed=4), root / "scored")
    return root / "mine", root / "scored"


def test_a_good_conversion_on_168_photos_passes(folders: tuple[Path, Path], tmp_path: Path) -> None:
    mine, _ = folders
    out = tmp_path / "lite0"
    assert edgerun(["convert", "vision", "zoo:efficientnet-lite0", "--calib", str(mine), "--quant", "int8",
                    "--format", "tflite", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["samples"] == 33 and report["calibration_samples"] == PHOTOS - 33  # the default hold-out
    checks = {c["name"]: c for c in report["gate"]["default_checks"]}
    top5 = checks["top-5 agreement"]
    assert top5["bound"] == 0.95 and top5["samples"] == 33 and top5["upper_bound"] >= 0.95 and top5["passed"]
    assert checks["top-1 agreement"]["value"] >= 0.70 and report["passed"]


@pytest.mark.parametrize("fraction", [0.5, 0.1], ids=["half-range", "a-tenth"])
def test_broken_calibrations_are_still_refused_on_a_small_set(folders: tuple[Path, Path], tmp_path: Path, fraction: float,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from converters.vision import zoo
    from runtime.bundle.manifest import Layout, VisionSpec
    from runtime.classify.preprocess import image_tensor, load_rgb

    mine, scored = folders
    entry = zoo.find("efficientnet-lite0")
    x = image_tensor([load_rgb(p) for p in sorted(mine.iterdir())], VisionSpec(size=entry.size, layout=Layout.NHWC, mean=entry.mean,
                                                                          std=entry.std))
    np.savez(tmp_path / "calib.npz", x=(x * fraction).astype(np.float32))
    capsys.readouterr()
    assert edgerun(["convert", "vision", "zoo:efficientnet-lite0", "--calib", str(tmp_path / "calib.npz"), "--eval", str(scored),
                    "--quant", "int8", "--format", "tflite", "--rounding", "nearest", "--out", str(tmp_path / "b")]) == 7
    err = capsys.readouterr().err
    assert f"accuracy gate failed on {SCORED} samples" in err and "(>= 70%) FAILED" in err, err
    assert not (tmp_path / "b").exists()
