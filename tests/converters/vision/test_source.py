"""Sources that are code: a .pt2, TorchScript or Keras file can run code when loaded, and the converter says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.converters.vision.conftest import convert_args
from tests.converters.vision.digits import Digits

ROOT = Path(__file__).resolve().parents[3]


def _convert(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "apps", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_a_pt2_source_gets_one_warning_line_on_stderr(digits: Digits, tmp_path: Path) -> None:
    # the conversion stops at the calibration set (shaped for another model), after the source was loaded
    bad = tmp_path / "c.npz"
    np.savez(bad, x=np.zeros((16, 3, 9, 9), np.float32))
    args = convert_args(digits, tmp_path / "out", "tflite")
    args[args.index("--calib") + 1] = str(bad)
    done = _convert(args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    warned = [line for line in lines if "can run code" in line]
    assert warned == [f"edgerun: {digits.pt2} is a PyTorch ExportedProgram (.pt2): loading it can run code it carries; "
                      "convert only files from a source you trust"]
    assert lines.index(warned[0]) < len(lines) - 1 and "the model takes" in lines[-1]  # the warning, later the one error line


@pytest.mark.parametrize("kind", ["vision", "audio"])
def test_the_help_says_which_sources_are_code(kind: str) -> None:
    done = _convert(["convert", kind, "--help"])
    assert done.returncode == 0
    assert "TorchScript or Keras/SavedModel source is code" in " ".join(done.stdout.split())


def test_torchscript_and_keras_sources_warn_before_loading(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    import torch

    from converters.vision import tflite
    from converters.vision.source import load_source
    from runtime.errors import BadInput

    def not_loaded(path: Path) -> None:  # stands in for tensorflow's loader, which the warning must precede
        raise BadInput(f"{path}: not loaded")

    monkeypatch.setattr(tflite, "keras_input_size", not_loaded)

    script = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(script))
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"not a graph")
    onnx_file = tmp_path / "m.onnx"
    onnx_file.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="converters.vision.source"):
        load_source(str(script))
        with pytest.raises(BadInput, match="not loaded"):  # warned before the loader looked at it
            load_source(str(saved))
        load_source(str(onnx_file))  # an ONNX file is data: no warning (it is checked when opened)
    assert [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records] == [
        (logging.WARNING, f"{script} is a TorchScript file"), (logging.WARNING, f"{saved} is a Keras SavedModel directory")]
