"""`edgerun run` as a user sees it, in a fresh process: silent stderr on success, one line on failure, no stray files.

A fresh process is the point: LiteRT prints its INFO line from native code once per process, and ONNX
Runtime starts its telemetry (a device id and a database under ~/.cache/Microsoft/) when it is imported.
HOME is an empty folder and the store lies outside it, so any file under HOME (or in the working
directory) was written by something other than edgerun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.runtime.modelgen import onnx_model, vision_bundle

ROOT = Path(__file__).resolve().parents[2]


def _edgerun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(exist_ok=True)
    cwd.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "ORT_", "TF_"))}
    env.update(HOME=str(home), EDGERUN_HOME=str(tmp_path / "store"), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "apps", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def _image(tmp_path: Path) -> Path:
    from PIL import Image

    path = tmp_path / "image.png"
    Image.fromarray((np.arange(12 * 12 * 3) % 251).astype(np.uint8).reshape(12, 12, 3)).save(path)
    return path


def _files_under(folder: Path) -> list[str]:
    return sorted(str(Path(d, f).relative_to(folder)) for d, _, names in os.walk(folder) for f in names)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_a_run_prints_only_its_result_and_writes_nothing_outside_edgerun(tmp_path: Path, fmt: str) -> None:
    bundle = vision_bundle(tmp_path / "bundle", fmt)
    done = _edgerun(tmp_path, "run", str(bundle), "--input", str(_image(tmp_path)), "--json", "--threads", "1")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."
    assert json.loads(done.stdout)["predictions"][0]["labels"][0]["label"].startswith("class-")
    assert _files_under(tmp_path / "home") == [] and _files_under(tmp_path / "cwd") == []  # no ~/.cache/Microsoft/...


def _unknown_op(path: Path) -> Path:
    from onnx import helper

    return onnx_model(path, [helper.make_node("Foo", ["x"], ["y"])], ["N", 3, 8, 8], ["N", 10], {})


def test_the_onnx_checker_message_is_folded_to_one_line(tmp_path: Path) -> None:
    # onnx.checker's message for an unknown op spans three lines ("No Op registered ...\n\n==> Context: ..."):
    # the error a library caller gets is one line too, not only what the CLI prints.
    from runtime.errors import BadInput
    from runtime.formats.model_files import check_model_file

    with pytest.raises(BadInput, match="No Op registered for Foo with domain_version of 17 ==> Context: Bad node spec") as err:
        check_model_file(_unknown_op(tmp_path / "m.onnx"), "onnx")
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_model_the_onnx_checker_rejects_is_one_line_on_stderr(tmp_path: Path) -> None:
    from runtime.files import sha256_file

    bundle = vision_bundle(tmp_path / "bundle", "onnx")
    model = _unknown_op(bundle / "model.onnx")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"][0].update(sha256=sha256_file(model)[0], size=model.stat().st_size)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    done = _edgerun(tmp_path, "run", str(bundle), "--input", str(_image(tmp_path)), "--threads", "1")
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("edgerun: ") and "No Op registered for Foo" in done.stderr
    assert done.stdout == ""
