"""Keras input: a .keras file and a SavedModel directory convert to INT8 TFLite (TensorFlow's converter, then the
same quantizer and gate as PyTorch models) and classify held-out digits; the ONNX route is refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.cli import main as edgerun
from runtime.bundle.manifest import Layout, read_manifest_dir
from tests.converters.vision.digits import LABELS, MEAN, STD, Digits, make_keras_digits


@pytest.fixture(scope="module")
def keras_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    return make_keras_digits(tmp_path_factory.mktemp("keras"))


def _args(model: Path, d: Digits, out: Path, *extra: str) -> list[str]:
    return ["convert", "vision", str(model), "--calib", str(d.calib), "--eval", str(d.eval), "--labels", str(d.labels),
            "--resize", "stretch", "--mean", str(MEAN), "--std", str(STD), "--quant", "int8", "--out", str(out), *extra]


@pytest.mark.parametrize("which", ["keras-file", "savedmodel"])
def test_keras_model_converts_to_int8_tflite_and_classifies(keras_models: tuple[Path, Path, float], digits: Digits, which: str,
                                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keras_file, saved, accuracy = keras_models
    assert accuracy > 0.9
    out = tmp_path / "bundle"
    assert edgerun(_args(keras_file if which == "keras-file" else saved, digits, out)) == 0
    manifest = read_manifest_dir(out)
    spec = manifest.vision
    assert spec is not None and spec.size == 8 and spec.layout is Layout.NHWC and spec.input.dtype == "int8"  # size from the model
    report = manifest.reports["accuracy"]
    assert report["passed"] and report["top1_agreement"] >= 0.99 and report["accuracy_quant"] >= accuracy - 0.02
    assert manifest.source["route"] == "keras->tflite"
    capsys.readouterr()
    images = digits.test_images[:20]
    assert edgerun(["run", str(out), "--input", *map(str, images), "--top", "1", "--json"]) == 0
    got = [p["labels"][0]["label"] for p in json.loads(capsys.readouterr().out)["predictions"]]
    right = sum(g == LABELS[t] for g, t in zip(got, digits.test_labels[:20], strict=True))
    assert right >= 17


@pytest.mark.parametrize("case, extra, message", [
    ("onnx-route", ["--format", "onnx"], "tf2onnx"),
    ("nchw", ["--layout", "nchw"], "NHWC 8px"),
])
def test_keras_refusals(keras_models: tuple[Path, Path, float], digits: Digits, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                        case: str, extra: list[str], message: str) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    capsys.readouterr()
    assert edgerun(_args(keras_models[0], digits, out_dir / "b", *extra)) == 2
    assert message in capsys.readouterr().err
    assert list(out_dir.iterdir()) == []
