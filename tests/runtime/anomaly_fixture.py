"""One anomaly bundle taught per test session from the generated parts (scripts/make_parts.py), through
``edgerun kiosk teach`` in-process: the good images alone, plus the taught defect types for a second, supervised
bundle. Import :func:`parts_data` and :func:`taught` (and :func:`taught_supervised`) into a test module to use them:
each module that imports them gets its own fixture definitions, so what they make is cached here, once per process."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

SIZE = 96  # pixels per side of the generated images
N_GOOD, N_BAD = 100, 32  # per category; half of the good and of each taught defect teach, the rest test
TAUGHT = ("scratch", "spot", "missing_hole")
UNSEEN = ("wrong_color", "bent_edge")


def make_parts():
    from scripts import make_parts as module

    return module


@dataclass(frozen=True)
class Taught:
    data: Path  # the dataset (make_parts layout)
    bundle: Path
    report: dict
    exit_code: int

    @property
    def test_good(self) -> list[Path]:
        return sorted((self.data / "test" / "good").glob("*.png"))

    def test_bad(self, defect: str) -> list[Path]:
        return sorted((self.data / "test" / "bad" / defect).glob("*.png"))


_MADE: dict[str, object] = {}


@pytest.fixture(scope="session")
def parts_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if "data" in _MADE:
        return _MADE["data"]  # type: ignore[return-value]
    root = tmp_path_factory.mktemp("parts") / "data"
    make_parts().write_dataset(root, seed=0, size=SIZE, n_good=N_GOOD, n_bad=N_BAD, teach_defects=TAUGHT,
                               teach_fraction=0.5, video_parts=0)
    _MADE["data"] = root
    return root


def _teach(data: Path, out: Path, *extra: str) -> Taught:
    from apps.cli import main

    if out.name in _MADE:
        return _MADE[out.name]  # type: ignore[return-value]
    code = main(["kiosk", "teach", "--good", str(data / "teach" / "good"), "--out", str(out), "--name", "parts", *extra])
    report = json.loads((out / "report.json").read_text()) if code == 0 else {}
    _MADE[out.name] = Taught(data, out, report, code)
    return _MADE[out.name]  # type: ignore[return-value]


@pytest.fixture(scope="session")
def taught(parts_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Taught:
    """Taught from the good images alone."""
    return _teach(parts_data, tmp_path_factory.mktemp("anomaly") / "parts-good")


@pytest.fixture(scope="session")
def taught_supervised(parts_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Taught:
    """Taught from the good images and the taught defect types (threshold tuning, supervised head)."""
    return _teach(parts_data, tmp_path_factory.mktemp("anomaly") / "parts-sup", "--bad", str(parts_data / "teach" / "bad"))
