"""Vision bundles at run time: `edgerun run --input`, `edgerun bench`, batching, planning, and missing packages.

The bundles are the digits model converted once per session (tests/converters/vision/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from apps.cli import main as edgerun
from runtime.classify.classifier import Classifier
from tests.converters.vision.digits import LABELS, Digits


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_run_labels_held_out_digits(digit_bundles: dict[str, Path], digits: Digits, fmt: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    # The runtime applies the manifest's resize, normalization and INT8 input scale: labels come out right.
    files = digits.test_images[:40]
    capsys.readouterr()
    assert edgerun(["run", str(digit_bundles[fmt]), "--input", *map(str, files), "--json", "--top", "3", "--threads", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    got = [p["labels"][0]["label"] for p in data["predictions"]]
    want = [LABELS[y] for y in digits.test_labels[:40]]
    assert sum(g == w for g, w in zip(got, want, strict=True)) >= 36  # ~95 % held-out accuracy
    assert all(len(p["labels"]) == 3 and p["labels"][0]["score"] >= p["labels"][1]["score"] for p in data["predictions"])
    assert data["placement"]["backend"] == ("litert" if fmt == "tflite" else "ort")
    assert data["placement"]["offload"]["unit"] == ("ops" if fmt == "tflite" else "nodes")


def test_run_text_output_and_placement_line(digit_bundles: dict[str, Path], digits: Digits,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert edgerun(["run", str(digit_bundles["tflite"]), "--input", str(digits.test_images[0]), "--top", "1"]) == 0
    out = capsys.readouterr()
    assert "placement: litert on cpu" in out.err
    assert out.out.splitlines()[0] == str(digits.test_images[0]) and "%" in out.out.splitlines()[1]


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_batch_equals_one_at_a_time(digit_bundles: dict[str, Path], digits: Digits, fmt: str) -> None:
    # A batch of 7 (LiteRT resizes its fixed batch of 1; ORT's batch axis is dynamic) gives the rows of 7 single calls.
    with Classifier.load(str(digit_bundles[fmt]), threads=1, target="cpu") as clf:
        from runtime.classify.preprocess import image_tensor, load_rgb, quantize

        x = quantize(image_tensor([load_rgb(p) for p in digits.test_images[:7]], clf.spec), clf.spec.input)
        batch = clf.backend.run(x)
        single = np.concatenate([clf.backend.run(x[i : i + 1]) for i in range(7)])
    np.testing.assert_array_equal(batch, single)


CASES = [
    # a file that is not an image: named, exit 2, before anything runs
    ("not-an-image", lambda t: [str(_write(t / "x.jpg", b"hello"))], 2, "cannot decode"),
    # a path that does not exist
    ("missing-file", lambda t: [str(t / "nope.png")], 2, "no such image"),
    # zero labels means nothing: refused by the flag's type, with the valid range
    ("top-zero", lambda t: ["--top", "0"], 2, "argument --top: '0' is out of range: use an integer from 1"),
    # a budget too small for the model's weights and arena: refused before loading, with the plan
    ("too-small-budget", lambda t: ["--memory", "1M"], 3, "does not fit"),
    # --require-accelerator on a machine without one
    ("require-accelerator", lambda t: ["--require-accelerator", "--target", "gpu"], 5, "require-accelerator"),
]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case, extra, code, message", CASES, ids=[c[0] for c in CASES])
def test_run_errors(digit_bundles: dict[str, Path], digits: Digits, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                    case: str, extra, code: int, message: str) -> None:
    args = ["run", str(digit_bundles["onnx"]), "--input", str(digits.test_images[0])]
    more = extra(tmp_path)
    if more and not more[0].startswith("--"):
        args = ["run", str(digit_bundles["onnx"]), "--input", *more]
    else:
        args += more
    capsys.readouterr()
    assert edgerun(args) == code
    assert message in capsys.readouterr().err


def test_bench_reports_latency_and_placement(digit_bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert edgerun(["bench", str(digit_bundles["tflite"]), "--runs", "5", "--batch", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["threads"] for r in data["results"]] == [1, 2]
    for r in data["results"]:
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["throughput_per_s"] > 0 and r["placement"]["threads"] == r["threads"]


def test_missing_onnxruntime_names_the_pip_line(digit_bundles: dict[str, Path], digits: Digits, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # None in sys.modules makes `import onnxruntime` fail as if it were not installed.
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    capsys.readouterr()
    assert edgerun(["run", str(digit_bundles["onnx"]), "--input", str(digits.test_images[0])]) == 4
    assert "pip install" in capsys.readouterr().err


def test_manifest_quantization_must_match_the_model(digit_bundles: dict[str, Path], tmp_path: Path) -> None:
    # A manifest that lies about the input scale would feed wrong numbers: refused at load.
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(digit_bundles["tflite"], bundle)
    data = json.loads((bundle / "manifest.json").read_text())
    data["vision"]["input"]["scale"] *= 2
    (bundle / "manifest.json").write_text(json.dumps(data))
    from runtime.errors import BadInput

    with pytest.raises(BadInput, match="input quantization"):
        Classifier.load(str(bundle), threads=1, target="cpu")


def test_import_runtime_loads_no_backend_library() -> None:
    code = ("import sys, runtime, runtime.classify.classifier, apps.cli.run_classifier, apps.cli.bench_cmd, runtime.classify.plan; "
            "bad = [m for m in ('onnxruntime', 'ai_edge_litert', 'tflite_runtime', 'torch', 'onnx', 'PIL') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr
