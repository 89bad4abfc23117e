"""The other recipes (int4w, fp16, auto) and the other sources (ONNX, TorchScript) on the digits model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.cli import main as edgerun
from tests.converters.vision.conftest import convert_args
from tests.converters.vision.digits import Digits


def _report(bundle: Path) -> dict:
    return json.loads((bundle / "report.json").read_text())


@pytest.mark.parametrize("fmt, quant, smaller", [
    ("tflite", "fp16", 0.6),  # float16 weights: about half the float file
    ("onnx", "fp16", 0.6),
    ("tflite", "int4w", 0.6),  # 4-bit weights of convolutions and the classifier
    ("onnx", "int4w", 1.0),  # MatMulNBits: only the classifier's MatMul/Gemm becomes 4-bit; convolutions stay float
])
def test_weight_recipes_convert_and_shrink(digits: Digits, tmp_path: Path, fmt: str, quant: str, smaller: float) -> None:
    out = tmp_path / "b"
    args = convert_args(digits, out, fmt)
    args[args.index("--quant") + 1] = quant
    assert edgerun(args + ["--min-agreement", "0.9"]) == 0
    report = _report(out)
    assert report["recipe"] == quant and report["passed"]
    assert report["quant_bytes"] < smaller * report["float_bytes"], report
    if (fmt, quant) == ("onnx", "int4w"):
        import onnx

        ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
        assert "MatMulNBits" in ops and "Gemm" not in ops  # the Linear layer really is 4-bit now


def test_auto_picks_int8_for_a_cnn_and_says_why(digits: Digits, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b"
    args = convert_args(digits, out, "onnx")
    args[args.index("--quant") + 1] = "auto"
    capsys.readouterr()
    assert edgerun(args) == 0
    report = _report(out)
    assert report["recipe"] == "int8" and report["why"].startswith("auto:") and "convolution" in report["why"]
    assert "faster than float only on CPUs with 8-bit dot products" in report["why"]  # no fixed speed-up promised
    # the speed it has here, measured at conversion, is on the CLI line with the ratio and the CPU
    printed = capsys.readouterr().out
    assert f"({report['latency_ratio']:.2f}x float; batch 1, 1 thread, median of 20 runs on {report['cpu']} at conversion)" in printed
    assert "gate on " in printed and "default gate passed" in printed and "--min-agreement not given" in printed


def test_onnx_source_converts_to_onnx(digits: Digits, tmp_path: Path) -> None:
    # An .onnx file is a source of its own: its input shape gives size and layout (no --size needed).
    import numpy as np
    import torch

    from converters.vision.onnx_route import export_float

    src = tmp_path / "digits.onnx"
    export_float(torch.export.load(str(digits.pt2)).module(), np.zeros((1, 3, 8, 8), np.float32), src)
    out = tmp_path / "b"
    args = [a for a in convert_args(digits, out, "onnx") if a not in ("--size", "8")]
    args[2] = str(src)
    assert edgerun(args) == 0
    report = _report(out)
    assert report["passed"] and "conversion" not in report  # no framework model to compare the export with


def test_torchscript_source_goes_to_onnx_only(digits: Digits, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    module = torch.export.load(str(digits.pt2)).module()
    script = tmp_path / "digits.pt"
    torch.jit.trace(module, torch.zeros(1, 3, 8, 8)).save(str(script))
    args = convert_args(digits, tmp_path / "t", "tflite")
    args[2] = str(script)
    assert edgerun(args) == 2  # litert-torch needs torch.export: refused with the route that works
    assert "use --format onnx" in capsys.readouterr().err
    args = convert_args(digits, tmp_path / "o", "onnx")
    args[2] = str(script)
    assert edgerun(args) == 0


@pytest.mark.parametrize(
    "requested, ops, quant",
    [
        ("auto", {"Conv": 12, "Gemm": 1}, "int8"),  # a CNN
        ("auto", {"MatMul": 3}, "int4w"),  # an MLP
        ("int8", {"FULLY_CONNECTED": 3}, "int8"),  # int8 asked for an MLP: int4w is suggested
        ("int4w", {"CONV_2D": 9, "FULLY_CONNECTED": 1}, "int4w"),  # int4w asked for a CNN: int8 is suggested
    ],
)
def test_every_recipe_reason_leaves_speed_to_the_measured_latency(requested: str, ops: dict[str, int], quant: str) -> None:
    # report["why"] is kept in the bundle: a speed stated as fact would be false on some CPUs, so every word on
    # speed points at the latency this conversion measured (report["latency_ratio"])
    import re

    from converters.vision.recipes import MEASURED, QuantScheme, choose

    choice = choose(QuantScheme(requested), ops)
    assert choice.quant.value == quant
    assert re.search(r"faster|slower|speed", choice.why) and MEASURED in choice.why, choice.why
