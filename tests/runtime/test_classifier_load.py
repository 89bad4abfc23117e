"""Classifier and AudioClassifier load through one path (runtime.classify.classifier.load_classifier): whatever it
opened (the backend; the audio front end) is closed when a later step fails."""

from __future__ import annotations

from pathlib import Path

import pytest

import runtime.classify.audio_classifier as audio_module
import runtime.classify.classifier as classifier_module
from runtime.classify.audio_classifier import AudioClassifier
from runtime.classify.classifier import Classifier
from runtime.errors import BadInput
from tests.runtime.modelgen import vision_bundle
from tests.runtime.test_busy_threads import _wake_word_bundle


def _closing(opened: list, closed: list):
    """Wraps an opener: records what it opened and when each is closed."""
    def wrap(real):
        def opener(*args, **kwargs):
            part = real(*args, **kwargs)
            close = part.close

            def recorded_close() -> None:
                closed.append(part)
                close()

            part.close = recorded_close
            opened.append(part)
            return part
        return opener
    return wrap


@pytest.mark.parametrize("kind", ["vision", "audio"])
def test_a_failure_after_the_backend_opened_closes_what_was_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   kind: str) -> None:
    opened: list = []
    closed: list = []
    wrap = _closing(opened, closed)
    # The one load path opens the backend through runtime.classify.classifier.open_backend, for both kinds.
    monkeypatch.setattr(classifier_module, "open_backend", wrap(classifier_module.open_backend))
    monkeypatch.setattr(audio_module, "open_frontend", wrap(audio_module.open_frontend))
    cls = Classifier if kind == "vision" else AudioClassifier

    def refuse(self, *args, **kwargs) -> None:
        raise BadInput("refused after opening")

    monkeypatch.setattr(cls, "__init__", refuse)
    bundle = vision_bundle(tmp_path / "img", "onnx") if kind == "vision" else _wake_word_bundle(tmp_path / "wake")
    with pytest.raises(BadInput, match="refused after opening"):
        cls.load(str(bundle), target="cpu", threads=1)
    assert len(opened) == (1 if kind == "vision" else 2)  # the backend (and the audio front end)
    assert closed == opened[::-1]  # every part closed, the last opened first


@pytest.mark.parametrize("kind, message", [("vision", "audio bundle; Classifier takes vision bundles"),
                                           ("audio", "vision bundle, not an audio one")])
def test_the_wrong_kind_is_refused_before_anything_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         kind: str, message: str) -> None:
    monkeypatch.setattr(classifier_module, "open_backend", lambda *a: pytest.fail("opened a backend"))
    cls = Classifier if kind == "vision" else AudioClassifier
    bundle = _wake_word_bundle(tmp_path / "wake") if kind == "vision" else vision_bundle(tmp_path / "img", "onnx")
    with pytest.raises(BadInput, match=message):
        cls.load(str(bundle), target="cpu", threads=1)
