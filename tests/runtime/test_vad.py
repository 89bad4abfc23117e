"""runtime.speech.vad: Silero VAD v6 through ONNX Runtime on the checked model file, and speech start/end events."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from runtime.errors import BadInput, MissingDependency
from runtime.speech.models import SpeechRecipe, find_recipe, locate, resolve_speech
from runtime.speech.vad import FRAME, FRAME_S, MODEL_FILE, SileroVAD, SpeechSegmenter
from tests.runtime.speech_clips import PHRASES, RATE, shared, silence, spoken


@pytest.fixture()
def vad() -> SileroVAD:
    return shared("vad")


def test_speech_scores_high_and_a_quiet_room_low(vad: SileroVAD) -> None:
    quiet = vad.stream().probabilities(silence(1.0))
    speech = vad.stream().probabilities(spoken(PHRASES[0]))
    assert quiet.max() < 0.2, quiet.max()
    assert np.mean(speech > 0.5) > 0.6, np.round(speech, 2)  # most frames of a spoken sentence are speech


def test_pieces_of_any_size_give_the_probabilities_of_the_whole(vad: SileroVAD) -> None:
    # the 64-sample context and the LSTM state carry across calls: a stream cut anywhere scores the same
    x = np.concatenate([silence(0.5), spoken(PHRASES[1]), silence(0.5)])
    whole = vad.stream().probabilities(x)
    stream = vad.stream()
    parts, at = [], 0
    for size in [100, 777, 1500, 512, 3, 4096] * 100:
        if at >= len(x):
            break
        parts.append(stream.probabilities(x[at : at + size]))
        at += size
    pieces = np.concatenate(parts)
    assert len(whole) == len(pieces) == len(x) // FRAME
    np.testing.assert_allclose(pieces, whole, atol=1e-4)


def test_two_utterances_give_two_start_end_pairs_at_their_times(vad: SileroVAD) -> None:
    a, b = spoken(PHRASES[0]), spoken(PHRASES[2])
    x = np.concatenate([silence(1.0), a, silence(1.5, 1), b, silence(1.0, 2)])
    seg = SpeechSegmenter(vad, hangover_ms=480)
    events = seg.feed(x) + seg.flush()
    assert [e.kind for e in events] == ["start", "end", "start", "end"], events
    b_at = 1.0 + len(a) / RATE + 1.5
    for event, want in zip(events, [1.0, 1.0 + len(a) / RATE, b_at, b_at + len(b) / RATE], strict=True):
        assert abs(event.at_s - want) < 0.25, (event, want)


def test_a_pause_shorter_than_the_hangover_does_not_end_speech(vad: SileroVAD) -> None:
    x = np.concatenate([silence(0.5), spoken(PHRASES[0]), silence(0.25), spoken(PHRASES[1]), silence(1.0)])
    short = SpeechSegmenter(vad, hangover_ms=600)
    assert [e.kind for e in short.feed(x)] == ["start", "end"]
    eager = SpeechSegmenter(vad, hangover_ms=64)  # the same audio with a 64 ms hangover splits at the pause
    assert [e.kind for e in eager.feed(x)] == ["start", "end", "start", "end"]


def test_a_stream_that_stops_inside_speech_ends_it_on_flush(vad: SileroVAD) -> None:
    seg = SpeechSegmenter(vad)
    x = np.concatenate([silence(0.5), spoken(PHRASES[1])])
    assert [e.kind for e in seg.feed(x)] == ["start"]
    (end,) = seg.flush()
    assert end.kind == "end" and abs(end.at_s - (len(x) // FRAME) * FRAME_S) < 0.3
    assert seg.flush() == []


@pytest.mark.parametrize("bad, why", [(np.zeros((2, 512), np.float32), "1-D"), (np.zeros(512, np.int16), "float"),
                                      (np.full(512, np.nan, np.float32), "NaN")])
def test_bad_samples_are_refused_in_one_line(vad: SileroVAD, bad: np.ndarray, why: str) -> None:
    with pytest.raises(BadInput, match=why) as info:
        vad.stream().probabilities(bad)
    assert "\n" not in str(info.value)


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(BadInput, match="thresholds"):
        SpeechSegmenter(object(), threshold=0.3, neg_threshold=0.6)


def _fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SpeechRecipe:
    """The silero-vad recipe pointed at a copy of its file in a package of our own."""
    real = find_recipe("silero-vad", "vad")
    pkg = tmp_path / "fake_vad_pkg"
    (pkg / "assets").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copyfile(locate(real).path(MODEL_FILE), pkg / "assets" / MODEL_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return SpeechRecipe(**{**real.__dict__, "module": "fake_vad_pkg", "package": "fake-vad-pkg"})


def test_a_model_file_that_is_not_the_recipes_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = _fake_package(tmp_path, monkeypatch)
    assert locate(recipe).size(MODEL_FILE) > 0
    with open(tmp_path / "fake_vad_pkg" / "assets" / MODEL_FILE, "r+b") as f:
        f.seek(1000)
        f.write(b"\0\0\0\0")
    with pytest.raises(BadInput, match="sha256 .* is not the .* that recipe silero-vad expects"):
        locate(recipe)


def test_a_file_replaced_after_the_check_is_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from devices.backends import BackendName
    from devices.placement import cpu_placement

    files = locate(_fake_package(tmp_path, monkeypatch))
    path = files.path(MODEL_FILE)
    shutil.copyfile(path, tmp_path / "other.onnx")
    os.replace(tmp_path / "other.onnx", path)  # the same bytes, another file: not the one that was hashed
    with pytest.raises(BadInput, match="changed since it was verified"):
        SileroVAD(files, cpu_placement(BackendName.ORT))


def test_a_missing_package_names_the_pip_line() -> None:
    real = find_recipe("default", "vad")
    gone = SpeechRecipe(**{**real.__dict__, "module": "no_such_package_xyz"})
    with pytest.raises(MissingDependency, match=r"pip install 'edgerun\[voice\]'"):
        locate(gone)


def test_a_recipe_of_another_kind_or_an_unknown_ref_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="whisper-tiny-en is a speech model of kind 'asr', not 'vad'"):
        resolve_speech("whisper-tiny-en", "vad", (MODEL_FILE,))
    with pytest.raises(BadInput, match="not a vad recipe \\(silero-vad, default\\)"):
        resolve_speech(str(tmp_path / "nowhere"), "vad", (MODEL_FILE,))
