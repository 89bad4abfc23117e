"""A resident llama.cpp model's threads reach ONNX Runtime: Classifier.load and AudioClassifier.load take
``busy_threads``, and every ORT session they open (the wake-word front end's two included) stops spinning when
its threads and the busy ones are more than the cores. The session options are read back from the sessions."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from devices import placement as placement_module
from devices.machine import detect
from runtime.backends.ort import SPIN_KEYS
from tests.runtime.modelgen import onnx_model, vision_bundle


@pytest.fixture
def idle_machine(monkeypatch: pytest.MonkeyPatch):
    """This machine with a load average of 0, so that only ``busy_threads`` makes cores busy."""
    here = detect("/")
    idle = dataclasses.replace(here, live=dataclasses.replace(here.live, load_avg=(0.0, 0.0, 0.0)))
    monkeypatch.setattr(placement_module, "detect", lambda root="/": idle)
    return idle


def _spin(backend) -> list[str | None]:
    return [backend.session_option(key) for key in SPIN_KEYS]  # None: unset, ORT's default (spins)


def _wake_word_bundle(directory: Path) -> Path:
    """openWakeWord's packaged front end and a generated detector head over its 16 x 96 embeddings."""
    from onnx import helper

    from converters.audio import zoo
    from runtime.files import sha256_file

    directory.mkdir()
    w = np.random.default_rng(0).standard_normal((16 * 96, 1)).astype(np.float32) / 40
    nodes = [helper.make_node("Flatten", ["x"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["logit"]),
             helper.make_node("Sigmoid", ["logit"], ["y"])]
    head = onnx_model(directory / "head.onnx", nodes, ["N", 16, 96], ["N", 1], {"w": w})
    front = [Path(shutil.copy(f, directory / f.name)) for f in zoo.frontend_files()]
    files = [{"path": f.name, "sha256": sha256_file(f)[0], "size": f.stat().st_size, "role": role}
             for f, role in [(head, "weights"), *((f, "frontend") for f in front)]]
    manifest = {"format": "edgerun.bundle", "schema_version": 1, "kind": "audio", "backend": "ort", "model_format": "onnx",
                "name": "wake", "version": "1", "files": files,
                "audio": {"sample_rate": 16000, "frontend": "openwakeword", "input_shape": [16, 96],
                          "frontend_files": [f.name for f in front]}}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


@pytest.mark.parametrize("resident", [False, True], ids=["alone", "beside-llm"])
def test_audio_classifier_front_end_and_head_stop_spinning_beside_busy_threads(tmp_path: Path, idle_machine, resident: bool) -> None:
    from runtime.classify.audio_classifier import AudioClassifier

    busy = idle_machine.usable_cpus if resident else 0  # a resident llama.cpp model on every core
    with AudioClassifier.load(str(_wake_word_bundle(tmp_path / "wake")), target="cpu", busy_threads=busy) as clf:
        assert clf.placement.shares_cores is resident
        want = ["0", "0"] if resident else [None, None]
        assert _spin(clf.backend) == want
        assert _spin(clf.frontend._mel) == want and _spin(clf.frontend._embedding) == want
        windows = clf.frontend.windows(np.zeros(16000, np.float32), 16000)  # the sessions still run
        assert clf.scores(windows.x).shape == (len(windows.x), 1)


@pytest.mark.parametrize("resident", [False, True], ids=["alone", "beside-llm"])
def test_classifier_stops_spinning_beside_busy_threads(tmp_path: Path, idle_machine, resident: bool) -> None:
    from runtime.classify.classifier import Classifier

    busy = idle_machine.usable_cpus if resident else 0
    with Classifier.load(str(vision_bundle(tmp_path / "img", "onnx")), target="cpu", busy_threads=busy) as clf:
        assert clf.placement.shares_cores is resident
        assert _spin(clf.backend) == (["0", "0"] if resident else [None, None])
