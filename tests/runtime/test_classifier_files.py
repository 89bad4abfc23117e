"""Hostile model files, manifest vision sections and preprocessing arithmetic: no native runtime sees a bad file."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from runtime.bundle.manifest import Layout, Manifest, ResizeMode, TensorQuant, VisionSpec
from runtime.errors import BadInput
from runtime.formats.model_files import check_model_file


def _tflite(bundles: dict[str, Path]) -> bytes:
    return (bundles["tflite"] / "model.tflite").read_bytes()


def _onnx(bundles: dict[str, Path]) -> bytes:
    return (bundles["onnx"] / "model.onnx").read_bytes()


TFLITE_CASES = [
    # empty file
    ("empty", lambda b: b"", "file identifier"),
    # an ONNX file renamed .tflite
    ("wrong-identifier", lambda b: b[:4] + b"ONNX" + b[8:], "file identifier"),
    # root table offset pointing past the end
    ("root-out-of-bounds", lambda b: struct.pack("<I", len(b) + 100) + b[4:], "out of bounds"),
    # cut in half: vectors run past the end
    ("truncated", lambda b: b[: len(b) // 2], "not a valid TFLite"),
    # only the 8-byte header
    ("header-only", lambda b: b[:8], "not a valid TFLite"),
]


@pytest.mark.parametrize("case, mutate, message", TFLITE_CASES, ids=[c[0] for c in TFLITE_CASES])
def test_hostile_tflite(digit_bundles: dict[str, Path], tmp_path: Path, case: str, mutate, message: str) -> None:
    path = tmp_path / "m.tflite"
    path.write_bytes(mutate(_tflite(digit_bundles)))
    with pytest.raises(BadInput, match=message):
        check_model_file(path, "tflite")


ONNX_CASES = [
    # a TFLite file renamed .onnx: its first bytes are not a ModelProto
    ("tflite-bytes", lambda b, t: t, "not a"),
    # cut short: the graph field runs past the end
    ("truncated", lambda b, t: b[: len(b) - 10], "past the end"),
    # an unknown wire type (7) at the start
    ("bad-wire-type", lambda b, t: bytes([0x0F]) + b, "wire type"),
    # empty
    ("empty", lambda b, t: b"", "no ir_version or graph"),
    # valid wire format, but the graph's bytes are garbage: onnx.checker (or ORT) must not be reached with it
    ("garbage-graph", lambda b, t: bytes([0x08, 0x08, 0x3A, 0x04, 0xFF, 0xFF, 0xFF, 0xFF]), "checker rejects"),
]


@pytest.mark.parametrize("case, mutate, message", ONNX_CASES, ids=[c[0] for c in ONNX_CASES])
def test_hostile_onnx(digit_bundles: dict[str, Path], tmp_path: Path, case: str, mutate, message: str) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(mutate(_onnx(digit_bundles), _tflite(digit_bundles)))
    with pytest.raises(BadInput, match=message):
        check_model_file(path, "onnx")


def test_real_files_pass(digit_bundles: dict[str, Path]) -> None:
    check_model_file(digit_bundles["tflite"] / "model.tflite", "tflite")
    check_model_file(digit_bundles["onnx"] / "model.onnx", "onnx")


def _manifest(vision: dict) -> dict:
    return {"format": "edgerun.bundle", "schema_version": 1, "kind": "vision", "backend": "ort", "model_format": "onnx",
            "name": "m", "version": "1", "files": [{"path": "model.onnx", "sha256": "0" * 64, "size": 1}], "vision": vision}


VISION_CASES = [
    # no size: the runtime could not resize
    ({"layout": "nhwc"}, "size"),
    # a layout that does not exist: the valid ones are listed
    ({"size": 224, "layout": "chw"}, "valid: nhwc, nchw"),
    # two mean values: neither one for all channels nor one per channel
    ({"size": 224, "mean": [1, 2]}, "1 or 3 numbers"),
    # zero std would divide by zero
    ({"size": 224, "std": [0]}, "positive"),
    # an int8 input without a scale cannot be quantized
    ({"size": 224, "input": {"dtype": "int8", "scale": 0, "zero_point": 0}}, "positive scale"),
    # a dtype the runtime does not feed
    ({"size": 224, "input": {"dtype": "float64"}}, "valid: float32, int8, uint8"),
    # a labels file the bundle does not carry
    ({"size": 224, "labels": "labels.txt"}, "not among the bundle files"),
    # a labels path with a directory in it
    ({"size": 224, "labels": "../etc/passwd"}, "bundle file name"),
]


@pytest.mark.parametrize("vision, message", VISION_CASES)
def test_manifest_vision_rejects(vision: dict, message: str) -> None:
    with pytest.raises(BadInput, match=message.replace("(", r"\(")):
        Manifest.from_dict(_manifest(vision))


def test_manifest_vision_round_trip_and_required() -> None:
    spec = VisionSpec(size=224, layout=Layout.NHWC, mean=(1.0, 2.0, 3.0), std=(4.0,), input=TensorQuant("int8", 0.5, -3))
    data = _manifest(spec.to_dict())
    assert Manifest.from_dict(data).vision == spec
    del data["vision"]
    with pytest.raises(BadInput, match="requires a 'vision' section"):  # a vision bundle without preprocessing is unusable
        Manifest.from_dict(data)


def test_preprocess_matches_hand_arithmetic() -> None:
    # stretch-resize a uniform image, normalize per channel, NCHW, quantize: every step checkable by hand.
    from runtime.classify.preprocess import image_tensor, quantize, top_k

    img = np.full((10, 20, 3), (10, 20, 30), np.uint8)
    spec = VisionSpec(size=8, layout=Layout.NCHW, resize=ResizeMode.STRETCH, mean=(10.0, 10.0, 10.0), std=(2.0, 5.0, 10.0))
    x = image_tensor([img], spec)
    assert x.shape == (1, 3, 8, 8)
    np.testing.assert_allclose(x[0, :, 0, 0], [0.0, 2.0, 2.0])
    q = quantize(x, TensorQuant("int8", 0.5, -1))
    np.testing.assert_array_equal(q[0, :, 0, 0], [-1, 3, 3])
    assert quantize(np.array([1000.0], np.float32), TensorQuant("int8", 0.5, 0))[0] == 127  # saturates, never wraps
    labels = top_k(np.array([0.1, 0.7, 0.2]), ["a", "b"], 5)
    assert [(lab.label, lab.index) for lab in labels] == [("b", 1), ("class 2", 2), ("a", 0)]


def test_center_crop_keeps_the_middle() -> None:
    # A 100x300 image: center crop of a square from the middle third; the side bands must not leak in.
    from runtime.classify.preprocess import resize_rgb

    img = np.zeros((100, 300, 3), np.uint8)
    img[:, 100:200] = 255
    out = resize_rgb(img, VisionSpec(size=16, resize=ResizeMode.CENTER_CROP, crop_fraction=1.0))
    assert out.shape == (16, 16, 3) and out[2:-2, 2:-2].min() == 255


def _vision_manifest(backend: str, arena: int) -> Manifest:
    data = _manifest(VisionSpec(size=224, arena_bytes=arena).to_dict())
    data["backend"] = backend
    data["model_format"] = {"litert": "tflite", "ort": "onnx"}[backend]  # the manifest refuses a format its backend cannot load
    data["files"][0]["size"] = 4 << 20
    return Manifest.from_dict(data)


PLAN_CASES = [
    # LiteRT, measured arena, batch 1, plenty of budget: weights + arena + runtime
    ("litert", 1 << 20, 1, 0, 256 << 20, (4 << 20) + (1 << 20) + (26 << 20)),
    # the arena grows with the batch
    ("litert", 1 << 20, 8, 0, 256 << 20, (4 << 20) + (8 << 20) + (26 << 20)),
    # ORT's arena allocator rounds up: its arena share is doubled, and its runtime is larger
    ("ort", 1 << 20, 1, 0, 256 << 20, (4 << 20) + (2 << 20) + (66 << 20)),
    # no measurement in the manifest: 32 float input tensors per row
    ("litert", 0, 1, 0, 256 << 20, (4 << 20) + 32 * 3 * 224 * 224 * 4 + (26 << 20)),
    # other resident models take most of the budget: refused, nothing loaded
    ("litert", 1 << 20, 1, 230 << 20, 256 << 20, None),
    # a budget smaller than the weights alone
    ("ort", 1 << 20, 1, 0, 2 << 20, None),
]


@pytest.mark.parametrize("backend, arena, batch, resident, budget, total", PLAN_CASES)
def test_classifier_plan(backend: str, arena: int, batch: int, resident: int, budget: int, total: int | None) -> None:
    from runtime.classify.plan import plan_classifier
    from runtime.errors import DoesNotFit

    manifest = _vision_manifest(backend, arena)
    if total is None:
        with pytest.raises(DoesNotFit, match="does not fit"):
            plan_classifier(manifest, 4 << 20, budget, batch=batch, resident_bytes=resident)
        return
    plan = plan_classifier(manifest, 4 << 20, budget, batch=batch, resident_bytes=resident)
    assert plan.total_bytes == total and plan.fits and plan.arena_measured == (arena > 0)


GATE_CASES = [
    # identical outputs: everything agrees, no error
    (np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]]), np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]]), (1.0, 1.0, 0.0)),
    # the second row's top-1 flips (but stays in the top 5), one of two: 50 % top-1, 100 % top-5
    (np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.9]]), np.array([[3.0, 1.0, 0.0], [0.0, 1.9, 2.0]]), (0.5, 1.0, 0.1)),
]


@pytest.mark.parametrize("ref, test, want", GATE_CASES)
def test_gate_metrics(ref: np.ndarray, test: np.ndarray, want: tuple[float, float, float]) -> None:
    from converters.vision.gate import compare

    m = compare(ref, test, np.array([0, 1]))
    assert (m["top1_agreement"], m["top5_agreement"]) == want[:2]
    assert m["max_abs_error"] == pytest.approx(want[2])
    assert m["accuracy_float"] == 1.0 and m["accuracy_quant"] == want[0]  # labels [0, 1] are the float answers


def test_peak_live_bytes_frees_each_tensor_after_its_last_reader() -> None:
    from runtime.classify.plan import peak_live_bytes

    # x -> a -> b -> y, with a skip connection a -> y: a stays alive until the last op reads it
    steps = [(["x", "w1"], ["a"]), (["a"], ["b"]), (["b", "a"], ["y"])]
    sizes = {"x": 10, "a": 100, "b": 50, "y": 1}  # w1 is a constant: not in the arena
    assert peak_live_bytes(steps, sizes, ["x"], ["y"]) == 151  # a + b + y at the last op (x freed after op 0)
    chain = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["y"])]
    assert peak_live_bytes(chain, sizes, ["x"], ["y"]) == 150  # a and b together, never all four
    assert peak_live_bytes(chain, sizes, ["x"], ["y"]) < sum(sizes.values())


@pytest.mark.parametrize("raced", [False, True], ids=["fifo", "fifo-swapped-in-after-stat"])
def test_an_image_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raced: bool) -> None:
    """load_rgb checked is_file() and then opened the path: a FIFO swapped in between blocked the open forever (and a
    FIFO was "no such image file"). It now opens through open_regular: no blocking open, and fstat() decides."""
    import os

    import runtime.files
    from runtime.classify.preprocess import load_rgb

    fifo = tmp_path / "in.png"
    os.mkfifo(fifo)
    if raced:  # stat() saw a regular file; the FIFO is what gets opened
        monkeypatch.setattr(runtime.files, "stat_regular", lambda path, what="file": None)
    with pytest.raises(BadInput, match=r"in.png: is a FIFO, not a regular file; give a regular image file$"):
        load_rgb(fifo)
    with pytest.raises(BadInput, match=r": is a directory, not a regular file"):
        load_rgb(tmp_path)
