"""Every converter publishes a bundle the same way, durably: runtime.bundle.store.publish."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from converters.classifier.package import package as classifier_package
from converters.llm.pipeline import _publish as llm_publish
from runtime.bundle.store import publish


class _Manifest:
    def to_json(self) -> bytes:
        return b'{"stub": true}\n'


def _staging(tmp_path: Path) -> Path:
    staging = tmp_path / ".out.partial"
    staging.mkdir()
    (staging / "model.tflite").write_bytes(b"weights")
    (staging / "labels.txt").write_text("cat\ndog\n")
    return staging


@pytest.fixture
def synced(monkeypatch) -> list[str]:
    """The paths os.fsync was called on, in order."""
    calls: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_publish_fsyncs_files_and_folders_then_renames(tmp_path: Path, synced: list[str]) -> None:
    staging = _staging(tmp_path)
    out = tmp_path / "out"
    assert publish(staging, out) == out
    assert not staging.exists() and sorted(p.name for p in out.iterdir()) == ["labels.txt", "model.tflite"]
    assert {Path(p).name for p in synced} >= {"labels.txt", "model.tflite", staging.name, tmp_path.name}
    assert synced[-1] == str(tmp_path)  # the folder holding the new name, last


@pytest.mark.parametrize("publisher", ["classifier", "llm"])
def test_vision_audio_and_llm_converters_publish_through_it(tmp_path: Path, synced: list[str], publisher: str) -> None:
    # The classifier path (vision's and audio's) used to rename without any fsync.
    staging = _staging(tmp_path)
    out = tmp_path / "bundle"
    if publisher == "classifier":
        classifier_package(staging, _Manifest(), out)
    else:
        llm_publish(staging, out)
    assert out.is_dir() and not staging.exists()
    assert {Path(p).name for p in synced} >= {"labels.txt", "model.tflite"}
    assert synced[-1] == str(tmp_path)
