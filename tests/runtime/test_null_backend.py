"""The null backend: the classifier stack end to end (bundle, resolve, plan, placement, scores, CLI) without a native runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from apps.cli import main as edgerun
from devices.placement import cpu_placement
from runtime.backends.base import TensorInfo
from runtime.backends.null import NullBackend
from runtime.errors import BadInput
from runtime.files import sha256_file

IMAGE_IN = TensorInfo("input", (-1, 8, 8, 3), "float32")
LOGITS = TensorInfo("output", (-1, 10), "float32")


def null_bundle(directory: Path, output: TensorInfo = LOGITS) -> Path:
    directory.mkdir(parents=True)
    (directory / "model.null").write_bytes(NullBackend.describe(IMAGE_IN, output))
    (directory / "labels.txt").write_text("".join(f"label-{i}\n" for i in range(10)))
    files = [{"path": name, "sha256": sha256_file(directory / name)[0], "size": (directory / name).stat().st_size, "role": role}
             for name, role in (("model.null", "weights"), ("labels.txt", "labels"))]
    quant = {"dtype": output.dtype, "scale": output.scale, "zero_point": output.zero_point}
    manifest = {"format": "edgerun.bundle", "schema_version": 1, "kind": "vision", "backend": "null", "model_format": "null",
                "name": "null-vision", "version": "1", "files": files,
                "vision": {"size": 8, "layout": "nhwc", "resize": "stretch", "labels": "labels.txt", "output": quant,
                           "output_is_logits": output.dtype == "float32"}}  # integer outputs: scores as they are
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def _images(tmp_path: Path, n: int) -> list[str]:
    from PIL import Image

    paths = []
    for i in range(n):
        path = tmp_path / f"image{i}.png"
        Image.fromarray(np.full((10, 10, 3), 40 * i, np.uint8)).save(path)
        paths.append(str(path))
    return paths


def test_run_through_the_cli_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle, images = null_bundle(tmp_path / "bundle"), _images(tmp_path, 3)
    runs = []
    for _ in range(2):
        capsys.readouterr()
        assert edgerun(["run", str(bundle), "--input", *images, "--json", "--threads", "1"]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    assert runs[0]["predictions"] == runs[1]["predictions"]
    scores = [[lab["score"] for lab in p["labels"]] for p in runs[0]["predictions"]]
    assert len({tuple(s) for s in scores}) == 3  # three different images, three different outputs
    assert all(lab["label"].startswith("label-") for p in runs[0]["predictions"] for lab in p["labels"])
    placement = runs[0]["placement"]
    assert (placement["backend"], placement["device"], placement["offload"]["total"]) == ("null", "cpu", 0)


def test_an_accelerator_is_refused_for_the_null_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle, images = null_bundle(tmp_path / "bundle"), _images(tmp_path, 1)
    capsys.readouterr()
    assert edgerun(["run", str(bundle), "--input", *images, "--target", "gpu", "--require-accelerator"]) == 5
    assert "null backend runs on the CPU only" in capsys.readouterr().err


def test_a_row_gives_the_same_output_alone_or_in_any_batch(tmp_path: Path) -> None:
    (tmp_path / "m").write_bytes(NullBackend.describe(IMAGE_IN, LOGITS))
    x = np.random.default_rng(0).standard_normal((5, 8, 8, 3)).astype(np.float32)
    with NullBackend(tmp_path / "m", None, cpu_placement("null")) as backend:
        batch = backend.run(x)
        single = np.concatenate([backend.run(x[i : i + 1]) for i in range(5)])
        other = backend.run(np.concatenate([x[2:3], x[::-1]]))
    np.testing.assert_array_equal(batch, single)
    np.testing.assert_array_equal(other[0], batch[2])
    assert batch.shape == (5, 10) and batch.dtype == np.float32 and len(np.unique(batch[:, 0])) == 5


def test_integer_outputs_are_dequantized_by_the_classifier(tmp_path: Path) -> None:
    from runtime.classify.classifier import Classifier

    int8 = TensorInfo("output", (-1, 10), "int8", 0.25, -3)
    with Classifier.load(str(null_bundle(tmp_path / "bundle", int8)), threads=1, target="cpu") as clf:
        raw = clf.backend.run(np.zeros((2, 8, 8, 3), np.float32))
        scores = clf.scores(np.zeros((2, 8, 8, 3), np.float32))
    assert raw.dtype == np.int8
    np.testing.assert_allclose(scores, 0.25 * (raw.astype(np.float32) + 3))


BAD_MODELS = [
    # not JSON at all
    (b"\x00\x01", "not a null model"),
    # an array, not an object
    (b"[]", "JSON object"),
    # no output
    (b'{"input": {"shape": [-1, 4], "dtype": "float32"}}', "'output' must be an object"),
    # a fixed batch dimension: the null backend takes any batch
    (b'{"input": {"shape": [4, 4], "dtype": "float32"}, "output": {"shape": [-1, 2], "dtype": "float32"}}', r"\[-1, d1, ...\]"),
    # a dtype no backend feeds
    (b'{"input": {"shape": [-1, 4], "dtype": "float64"}, "output": {"shape": [-1, 2], "dtype": "float32"}}', "valid: float32, int8, uint8"),
    # an integer output without a scale cannot be dequantized
    (b'{"input": {"shape": [-1, 4], "dtype": "float32"}, "output": {"shape": [-1, 2], "dtype": "int8"}}', "positive scale"),
    # a description that asks for 2^40 elements per row
    (b'{"input": {"shape": [-1, 1048576, 1048576], "dtype": "float32"}, "output": {"shape": [-1, 2], "dtype": "float32"}}',
     "elements per row"),
    # products past 2^64, which np.prod wrapped to a number under the limit (0 and a negative one) and so accepted
    (b'{"input": {"shape": [-1, 4294967296, 4294967296], "dtype": "float32"}, "output": {"shape": [-1, 2], "dtype": "float32"}}',
     "elements per row"),
    (b'{"input": {"shape": [-1, 4], "dtype": "float32"}, "output": {"shape": [-1, 3, 4611686018427387904], "dtype": "float32"}}',
     "output shape .* has more than 16777216 elements per row"),
    # deep nesting
    (b"[" * 100000 + b"]" * 100000, "null model"),
]


@pytest.mark.parametrize("data, message", BAD_MODELS)
def test_bad_null_models_are_one_line(tmp_path: Path, data: bytes, message: str) -> None:
    (tmp_path / "m").write_bytes(data)
    with pytest.raises(BadInput, match=message) as err:
        NullBackend(tmp_path / "m", None, cpu_placement("null"))
    assert "\n" not in str(err.value)


def test_null_backend_imports_no_native_library() -> None:
    code = ("import sys, runtime.backends.null; bad = [m for m in ('onnxruntime', 'ai_edge_litert', 'llama_cpp') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_fifo_as_the_null_model_is_refused_not_waited_on(tmp_path: Path) -> None:
    # read_bytes() on a FIFO blocked until a writer came; the model is now opened as a regular file only
    import os

    os.mkfifo(tmp_path / "m")
    with pytest.raises(BadInput, match=r"m: is a FIFO, not a regular file; give a regular null model$"):
        NullBackend(tmp_path / "m", None, cpu_placement("null"))
