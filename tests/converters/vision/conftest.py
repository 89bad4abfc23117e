"""Session fixtures: the digits model and its INT8 bundles, converted once through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.cli import main as edgerun
from tests.converters.vision.digits import MEAN, STD, Digits, make_digits

# tests/runtime declares its own fixtures over session_digits()/session_bundles(); the cache keeps the
# training and the conversions to once per session whichever module asks first.
_CACHE: dict[str, object] = {}


def session_digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    if "digits" not in _CACHE:
        _CACHE["digits"] = make_digits(tmp_path_factory.mktemp("digits"))
    return _CACHE["digits"]  # type: ignore[return-value]


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    return session_digits(tmp_path_factory)


def convert_args(d: Digits, out: Path, fmt: str, *extra: str) -> list[str]:
    return ["convert", "vision", str(d.pt2), "--calib", str(d.calib), "--eval", str(d.eval), "--labels", str(d.labels),
            "--size", "8", "--resize", "stretch", "--mean", str(MEAN), "--std", str(STD), "--format", fmt,
            "--quant", "int8", "--name", "digits", "--out", str(out), *extra]


def session_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"tflite": bundle dir, "onnx": bundle dir}, both static INT8 and past the default gate."""
    digits = session_digits(tmp_path_factory)
    if "bundles" not in _CACHE:
        root = tmp_path_factory.mktemp("digit-bundles")
        out = {}
        for fmt in ("tflite", "onnx"):
            out[fmt] = root / f"digits-{fmt}"
            assert edgerun(convert_args(digits, out[fmt], fmt)) == 0
        _CACHE["bundles"] = out
    return _CACHE["bundles"]  # type: ignore[return-value]


@pytest.fixture(scope="session")
def digit_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return session_bundles(tmp_path_factory)
