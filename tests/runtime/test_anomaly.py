"""Anomaly bundles: the manifest section refuses hostile values; the distance search, coreset, threshold and AUROC
are what they claim; a taught bundle loads through the planner, the backends and the ResidencyManager."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from converters.anomaly.teach import auroc, choose_threshold, coreset
from devices.backends import BackendName
from runtime.bundle.manifest import FileEntry, Manifest, ModelKind, VisionSpec
from runtime.bundle.specs.anomaly import AnomalySpec
from runtime.classify import anomaly
from runtime.errors import BadInput
from tests.runtime.anomaly_fixture import parts_data, taught  # noqa: F401  (session fixtures)

SHA = "0" * 64


def manifest_dict(**changes: object) -> dict:
    spec = AnomalySpec(backbone="efficientnet-lite0", grid=16, channels=152, bank="bank.npy", bank_rows=100,
                       bank_dtype="float32", threshold=3.5, false_reject=0.01, coreset=0.1)
    m = Manifest(kind=ModelKind.ANOMALY, backend=BackendName.LITERT, model_format="tflite", name="parts", version="v1",
                 files=(FileEntry("model.tflite", SHA, 10), FileEntry("bank.npy", SHA, 10, "bank")),
                 vision=VisionSpec(size=128), anomaly=spec)
    data = json.loads(m.to_json())
    data["anomaly"].update(changes)
    return data


def test_anomaly_section_round_trips() -> None:
    data = manifest_dict()
    m = Manifest.from_dict(data)
    assert m.kind is ModelKind.ANOMALY and m.anomaly is not None and m.anomaly.threshold == 3.5
    assert json.loads(m.to_json()) == data


@pytest.mark.parametrize("field,value,match", [
    ("grid", 0, "grid"), ("grid", 10**9, "grid"), ("grid", True, "grid"), ("grid", 16.0, "grid"),
    ("channels", -1, "channels"), ("channels", "152", "channels"),
    ("bank_rows", 10**12, "bank_rows"),
    ("bank", "../bank.npy", "bank"), ("bank", "sub/bank.npy", "bank"), ("bank", 7, "bank"),
    ("bank_dtype", "int8", "bank_dtype"), ("bank_dtype", "object", "bank_dtype"),
    ("threshold", float("nan"), "threshold"), ("threshold", float("inf"), "threshold"), ("threshold", 0, "threshold"),
    ("threshold", -1.0, "threshold"), ("threshold", "3.5", "threshold"), ("threshold", 10**400, "threshold"),
    ("false_reject", 0.7, "false_reject"), ("false_reject", -0.1, "false_reject"),
    ("coreset", 0, "coreset"), ("coreset", 1.5, "coreset"),
    ("head", "../head.npy", "head"), ("head", ["h"], "head"), ("head_threshold", 1.5, "head_threshold"),
    ("backbone", "Bad Name\n", "backbone"), ("backbone", "x" * 200, "backbone"),
    ("border", -1, "border"), ("border", 8, "border"), ("border", True, "border"), ("border", 1.0, "border"),
])
def test_hostile_anomaly_values_are_refused(field: str, value: object, match: str) -> None:
    data = manifest_dict()
    data["anomaly"][field] = value
    with pytest.raises(BadInput, match=match) as err:
        Manifest.from_dict(data)
    assert "\n" not in str(err.value)


def test_anomaly_bundle_needs_its_sections_and_files() -> None:
    data = manifest_dict()
    del data["anomaly"]
    with pytest.raises(BadInput, match="kind 'anomaly' requires"):
        Manifest.from_dict(data)
    data = manifest_dict()
    del data["vision"]
    with pytest.raises(BadInput, match="kind 'anomaly' requires"):
        Manifest.from_dict(data)
    with pytest.raises(BadInput, match="not among the bundle files"):
        Manifest.from_dict(manifest_dict(bank="other.npy"))
    with pytest.raises(BadInput, match="not among the bundle files"):
        Manifest.from_dict(manifest_dict(head="head.npy"))
    for missing in ("grid", "threshold", "bank"):
        data = manifest_dict()
        del data["anomaly"][missing]
        with pytest.raises(BadInput, match=missing):
            Manifest.from_dict(data)


def test_nearest_distances_match_brute_force_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    patches, bank = rng.normal(size=(300, 24)).astype(np.float32), rng.normal(size=(170, 24)).astype(np.float32)
    want = np.sqrt(((patches[:, None] - bank[None]) ** 2).sum(-1)).min(1)
    monkeypatch.setattr(anomaly, "CHUNK_BYTES", 4 * 37 * 11)  # many row and column blocks, none even
    np.testing.assert_allclose(anomaly.nearest_distances(patches, bank), want, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(anomaly, "CHUNK_BYTES", 16 << 20)
    np.testing.assert_allclose(anomaly.nearest_distances(patches, bank), want, rtol=1e-4, atol=1e-4)
    assert anomaly.nearest_distances(bank[:5], bank).max() < 1e-2  # a bank row is at distance 0 from itself


def test_coreset_covers_the_set_better_than_random_rows() -> None:
    rng = np.random.default_rng(1)
    # two dense clusters and a few outliers: k-center must keep the outliers, a random subset mostly does not
    x = np.concatenate([rng.normal(0, 0.1, (900, 8)), rng.normal(5, 0.1, (90, 8)), rng.normal(-20, 1, (10, 8))]).astype(np.float32)
    idx = coreset(x, 0.05, seed=0)
    assert len(idx) == 50 and len(set(idx.tolist())) == 50
    assert np.array_equal(idx, coreset(x, 0.05, seed=0))  # seeded: the same rows again
    radius = anomaly.nearest_distances(x, x[idx]).max()
    random_radius = anomaly.nearest_distances(x, x[rng.choice(len(x), 50, replace=False)]).max()
    assert radius < 0.5 * random_radius
    assert set(range(990, 1000)) <= set(idx.tolist())
    assert len(coreset(x, 1.0, seed=0)) == len(x)


def test_auroc_matches_the_rank_statistic() -> None:
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(2)
    neg, pos = rng.normal(0, 1, 60), np.r_[rng.normal(1, 1, 40), [0.0, 0.0]]
    neg[:3] = 0.0  # ties count half
    want = roc_auc_score(np.r_[np.zeros(len(neg)), np.ones(len(pos))], np.r_[neg, pos])
    assert auroc(neg, pos) == pytest.approx(want)
    assert auroc(neg, np.zeros(0)) is None


@pytest.mark.parametrize("rate", [0.01, 0.05, 0.2])
def test_threshold_gives_the_chosen_false_reject_rate(rate: float) -> None:
    rng = np.random.default_rng(3)
    calib = np.exp(rng.normal(1.0, 0.2, 2000))
    threshold, how = choose_threshold(calib, np.zeros(0), rate)
    assert (calib >= threshold).mean() <= rate  # on the calibration set itself
    fresh = np.exp(rng.normal(1.0, 0.2, 100_000))  # and on new good parts from the same process, within sampling error
    assert abs((fresh >= threshold).mean() - rate) < max(0.3 * rate, 3 * math.sqrt(rate / 2000))
    assert not how["tuned_by_bad"]


def test_threshold_with_few_good_images_reaches_past_the_largest() -> None:
    good = np.array([1.0, 1.1, 1.2, 1.15, 1.05, 0.95, 1.3, 1.0])
    threshold, how = choose_threshold(good, np.zeros(0), 0.01)
    assert threshold > good.max() and how["fitted_lognormal"] == threshold  # 8 images cannot resolve 1 %


def test_defective_scores_move_the_threshold_down_within_the_rate() -> None:
    good = np.array([1.0, 1.1, 1.2, 1.15, 1.05, 0.95, 1.3, 1.0])
    bad = np.array([1.35, 5.0, 6.0])  # 1.35: above every good image, below what the good images alone allow (1.39)
    threshold, how = choose_threshold(good, bad, 0.01)
    assert how["tuned_by_bad"] and good.max() < threshold <= 1.35 and (good >= threshold).mean() == 0
    assert (bad >= threshold).all()


def test_upsample_keeps_where_the_peak_is() -> None:
    grid = np.zeros((8, 8), np.float32)
    grid[2, 5] = 1.0
    heat = anomaly.upsample(grid, 96, 64)
    assert heat.shape == (96, 64) and heat.dtype == np.float32
    y, x = np.unravel_index(heat.argmax(), heat.shape)
    assert abs(y - (2.5 * 12)) <= 6 and abs(x - (5.5 * 8)) <= 4
    np.testing.assert_allclose(anomaly.upsample(np.full((4, 4), 0.3, np.float32), 10, 13), 0.3, rtol=1e-6)


# --- a taught bundle (tests/runtime/anomaly_fixture.py: teaches once per session, ~1-2 min) ---


@pytest.mark.slow
def test_taught_bundle_loads_through_planner_and_backend(taught, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    from runtime.bundle.manifest import read_manifest_dir
    from runtime.classify.preprocess import load_rgb

    manifest = read_manifest_dir(taught.bundle)
    spec = manifest.anomaly
    assert manifest.kind is ModelKind.ANOMALY and manifest.vision.quantization == "int8"
    with anomaly.AnomalyDetector.load(str(taught.bundle), batch=4, threads=1) as det:
        assert det.backend.input.dtype == "int8" and det.backend.output.shape[1:] == (spec.grid, spec.grid, spec.channels)
        assert det.plan.input_bytes == anomaly.working_bytes(spec, 4) > spec.bank_rows * spec.channels * 4
        assert det.plan.weights_bytes == manifest.file("weights").size
        images = [load_rgb(p) for p in taught.test_good[:3]]
        out = det.score(images)
        assert len(out) == 3
        for (score, heat), img in zip(out, images, strict=True):
            assert isinstance(score, float) and heat.shape == img.shape[:2] and heat.dtype == np.float32
            assert 0.0 <= heat.min() and heat.max() <= 1.0
        assert [s for s, _ in det.score(images[:1])] == pytest.approx([out[0][0]], rel=1e-5)  # batched = alone
    from apps.cli import main

    assert main(["plan", str(taught.bundle), "--batch", "4", "--json"]) == 0  # edgerun plan counts the bank too
    assert json.loads(capsys.readouterr().out)["total_bytes"] == det.plan.total_bytes


@pytest.mark.slow
def test_heat_map_peaks_where_the_defect_is(taught) -> None:  # noqa: F811
    from runtime.classify.preprocess import load_rgb

    with anomaly.AnomalyDetector.load(str(taught.bundle), threads=1) as det:
        hits = 0
        spots = [(30, 30), (30, 66), (66, 30), (66, 60)]
        for path, (cy, cx) in zip(taught.test_good[:4], spots, strict=True):
            img = load_rgb(path).copy()
            yy, xx = np.mgrid[: img.shape[0], : img.shape[1]]
            blob = (yy - cy) ** 2 + (xx - cx) ** 2 <= 5**2
            img[blob] = (40, 20, 10)  # a dark rust spot, 10 px across, on a 96 px part
            d = det.detect([img])[0]
            y, x = np.unravel_index(d.heatmap.argmax(), d.heatmap.shape)
            hits += d.anomalous and math.hypot(y - cy, x - cx) <= 14
        assert hits >= 3, "the heat map's peak is on the painted spot and the part is flagged"


@pytest.mark.slow
def test_taught_bundle_loads_through_the_residency_manager(taught, tmp_path: Path) -> None:  # noqa: F811
    from runtime.classify.preprocess import load_rgb
    from runtime.residency.manager import ModelSpec, ResidencyManager

    with ResidencyManager(2 << 30) as rm:
        rm.add(ModelSpec("parts", str(taught.bundle), "anomaly", options={"batch": 2, "threads": 1}))
        with rm.acquire("parts") as det:
            assert isinstance(det, anomaly.AnomalyDetector)
            assert rm.planned_bytes("parts") == det.plan.total_bytes
            assert len(det.score([load_rgb(taught.test_good[0])])) == 1
        with pytest.raises(BadInput, match="unknown anomaly option"):
            rm.add(ModelSpec("other", str(taught.bundle), "anomaly", options={"ctx": 5}))


@pytest.mark.slow
def test_a_bank_that_disagrees_with_its_manifest_is_refused(taught, tmp_path: Path) -> None:  # noqa: F811
    from runtime.files import sha256_file

    copy = tmp_path / "b"
    shutil.copytree(taught.bundle, copy)
    np.save(copy / "bank.npy", np.zeros((3, 7), np.float32))  # re-listed with its checksum: only the shape is wrong
    data = json.loads((copy / "manifest.json").read_text())
    for entry in data["files"]:
        if entry["path"] == "bank.npy":
            entry["sha256"], entry["size"] = sha256_file(copy / "bank.npy")
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BadInput, match=r"memory bank bank.npy is float32 \(3, 7\), the manifest says"):
        anomaly.AnomalyDetector.load(str(copy), threads=1)
    (copy / "bank.npy").write_bytes(b"\x93NUMPY" + b"x" * ((copy / "bank.npy").stat().st_size - 6))  # same size, altered
    with pytest.raises(BadInput, match="checksum"):
        anomaly.AnomalyDetector.load(str(copy), threads=1)


def test_a_vision_bundle_is_not_an_anomaly_detector(tmp_path: Path) -> None:
    data = manifest_dict()
    data["kind"] = "vision"
    m = Manifest.from_dict(data)
    with pytest.raises(BadInput, match="AnomalyDetector takes anomaly bundles"):
        anomaly.plan_anomaly(m, 1 << 30)


@pytest.mark.parametrize("rate", [0.1, 0.2])
def test_threshold_holds_for_float32_scores(rate: float) -> None:
    # the detector's scores are float32: a threshold one float64 step above a score rounds back onto it, and that
    # score would count as a rejection (here the empirical threshold decides: the top scores stand apart)
    good = np.array([3.0] * 7 + [3.5, 3.6, 3.7], np.float32)
    threshold, how = choose_threshold(good, np.zeros(0, np.float32), rate)
    assert threshold == how["empirical"] and (good >= threshold).sum() == how["rejections_allowed"] == round(rate * 10)


def test_residency_refuses_a_vision_bundle_as_anomaly(tmp_path: Path) -> None:
    from runtime.residency.manager import ModelSpec, ResidencyManager
    from tests.apps.kiosk.kiosk_models import kiosk_bundle

    bundle = kiosk_bundle(tmp_path / "vision", "v1")
    with ResidencyManager(1 << 30) as rm:
        with pytest.raises(BadInput, match="is a vision bundle, not kind 'anomaly'"):
            rm.add(ModelSpec("parts", str(bundle), "anomaly"))
        with pytest.raises(BadInput, match="AnomalyDetector takes anomaly bundles"):
            anomaly.AnomalyDetector.load(str(bundle))
