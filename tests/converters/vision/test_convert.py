"""``edgerun convert vision``: the digits model through both routes, the gate, and every refusal leaving nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from apps.cli import main as edgerun
from runtime.bundle.manifest import Layout, read_manifest_dir, verify_dir
from tests.converters.vision.conftest import convert_args
from tests.converters.vision.digits import Digits


@pytest.mark.parametrize("fmt, layout, backend", [
    ("tflite", Layout.NHWC, "litert"),  # TFLite defaults to NHWC: the native layout, no transpose in front
    ("onnx", Layout.NCHW, "ort"),  # ONNX keeps PyTorch's NCHW
])
def test_int8_bundle_passes_gate_and_records_preprocessing(digit_bundles: dict[str, Path], digits: Digits, fmt: str,
                                                           layout: Layout, backend: str) -> None:
    bundle = digit_bundles[fmt]
    manifest = read_manifest_dir(bundle)
    verify_dir(bundle, manifest)
    assert (manifest.backend.value, manifest.model_format) == (backend, fmt)
    spec = manifest.vision
    assert spec is not None and spec.layout is layout and spec.size == 8 and spec.mean == (127.5,) and spec.labels == "labels.txt"
    assert spec.quantization == "int8" and spec.arena_bytes > 0
    if fmt == "tflite":  # full-integer: int8 in and out, with the scale the runtime must apply
        assert spec.input.dtype == "int8" and spec.input.scale > 0 and spec.output.dtype == "int8"
    report = manifest.reports["accuracy"]
    assert report == json.loads((bundle / "report.json").read_text())
    assert report["passed"] and report["top1_agreement"] >= 0.99 and report["cosine_min"] > 0.98
    assert 0.9 <= report["float_self_agreement"] <= 1.0  # the noise floor: digits are decisive, little flips
    # agreement over the samples whose float top-1 survives the noise (the self-agreement counts them)
    assert 0 < report["stable_samples"] <= report["samples"] and report["top1_agreement_stable"] >= 0.99
    assert report["labelled"] == len(digits.test_labels)
    assert report["accuracy_quant"] >= digits.accuracy - 0.02  # INT8 costs at most 2 points on held-out digits
    assert report["conversion"]["top1_agreement"] == 1.0  # float export matches PyTorch exactly in top-1
    # a .pt2 ExportedProgram has no Conv2d/Linear modules left for GPTQ: the report says so and why
    assert report["rounding"]["method"] == "nearest" and "graph" in report["rounding"]["why"]
    assert not report["equalization"]["applied"] and "--equalize on" in report["equalization"]["why"]  # opt-in
    assert report["quant_bytes"] < report["float_bytes"]
    # latency as measured here at conversion, not a promise: both medians, their ratio and this CPU's name
    from devices.cpu import read_cpu
    from devices.rootfs import RootFS

    assert report["float_latency_ms"] > 0 and report["latency_ratio"] == report["quant_latency_ms"] / report["float_latency_ms"]
    assert report["cpu"] == read_cpu(RootFS.at("/")).model
    assert report["gate"]["criterion"] == "default" and report["gate"]["default_passed"] and report["min_agreement"] is None
    assert (bundle / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_transport_file_out(digits: Digits, tmp_path: Path) -> None:
    # --out NAME.edgerun writes the single-file transport form and nothing else beside it.
    out = tmp_path / "digits.edgerun"
    assert edgerun(convert_args(digits, out, "onnx", "--version", "t1")) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits.edgerun"]
    assert edgerun(["install", str(out)]) == 0


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


CASES = [
    # an ONNX source cannot go to TFLite without onnx2tf, which is kept out: the error names the route that works
    ("onnx-to-tflite", lambda d, t: ["--format", "tflite"], "onnx", "use --format onnx"),
    # calibration arrays shaped for another model
    ("npz-wrong-shape", lambda d, t: ["--calib", str(_npz(t / "c.npz", x=np.zeros((16, 3, 9, 9), np.float32)))], None, "the model takes"),
    # integer calibration arrays: the model's float inputs are expected, already normalized
    ("npz-wrong-dtype", lambda d, t: ["--calib", str(_npz(t / "c.npz", x=np.zeros((16, 8, 8, 3), np.uint8)))], None, "float32"),
    # an empty calibration set
    ("npz-empty", lambda d, t: ["--calib", str(_npz(t / "c.npz", x=np.zeros((0, 8, 8, 3), np.float32)))], None, "empty"),
    # a folder with no images in it
    ("empty-folder", lambda d, t: ["--calib", str((t / "none").mkdir() or t / "none")], None, "no images"),
    # a file in the calibration folder that is not an image
    ("undecodable", lambda d, t: ["--calib", str(_bad_image_folder(t))], None, "cannot decode"),
    # calibration on all-zero inputs collapses every activation range: the gate must catch it, write nothing, and name
    # only what applies (the .pt2 source keeps only its graph, so --equalize on is not offered)
    ("gate-fails", lambda d, t: ["--calib", str(_npz(t / "c.npz", x=np.zeros((16, 8, 8, 3), np.float32)))], None,
     ("accuracy gate failed", "nothing was written. Try more or more representative --calib data, or --quant fp16")),
    # a file named .keras that is not a Keras model
    ("keras", lambda d, t: [], "keras", "not a loadable Keras model"),
    # a legacy HDF5 Keras file: the error says how to re-save it
    ("h5", lambda d, t: [], "h5", "save it as .keras"),
    # mean/std with two values (neither one for all channels nor one per channel)
    ("bad-mean", lambda d, t: ["--mean", "1,2"], None, "one number"),
]


def _bad_image_folder(tmp: Path) -> Path:
    folder = tmp / "bad"
    folder.mkdir()
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    return folder


@pytest.mark.parametrize("case, extra, model, message", CASES, ids=[c[0] for c in CASES])
def test_refusals_exit_with_their_code_and_leave_nothing(digits: Digits, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           case: str, extra, model: str | None, message: str | tuple[str, ...]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = convert_args(digits, out_dir / "bundle", "tflite", *extra(digits, work))
    if model == "onnx":
        onnx_file = work / "digits.onnx"
        assert edgerun(convert_args(digits, out_dir / "src", "onnx")) == 0
        onnx_file.write_bytes((out_dir / "src" / "model.onnx").read_bytes())
        import shutil

        shutil.rmtree(out_dir / "src")
        args[2] = str(onnx_file)
        args = [a for a in args if a not in ("--size", "8")]
    elif model in ("keras", "h5"):
        args[2] = str(work / f"model.{model}")
        (work / f"model.{model}").write_bytes(b"PK")
    capsys.readouterr()
    assert edgerun(args) == (7 if case == "gate-fails" else 2)  # a failed quality gate exits 7, bad input 2
    err = capsys.readouterr().err
    for part in (message,) if isinstance(message, str) else message:
        assert part in err, err
    assert list(out_dir.iterdir()) == []  # no bundle, no temporary directory
