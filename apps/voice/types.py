"""The voice assistant's shared value types: audio chunks, per-turn timing marks, stage errors.

Audio is mono float32 in [-1, 1] at ``rate`` Hz (the models want :data:`SAMPLE_RATE`); times are seconds on
``time.monotonic()``; latencies are milliseconds. Used by the pipeline, the Wyoming server and the benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from runtime.errors import EdgerunError

SAMPLE_RATE = 16000  # what wake word, VAD and ASR take
FRAME_SAMPLES = 512  # 32 ms at 16 kHz: silero VAD's frame, the pipeline's input chunk


@dataclass(frozen=True)
class AudioChunk:
    """A piece of mono audio. ``samples``: float32 in [-1, 1]; ``t``: time.monotonic() when the chunk was complete
    (input: its last sample captured; output: when it was synthesized)."""

    samples: np.ndarray
    rate: int
    t: float = 0.0

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate

    def pcm16(self) -> bytes:
        """Little-endian signed 16-bit PCM (what WAV files, speakers and Wyoming carry)."""
        return (np.clip(self.samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()

    @classmethod
    def from_pcm16(cls, data: bytes, rate: int, t: float = 0.0) -> AudioChunk:
        """From little-endian signed 16-bit mono PCM (a trailing odd byte is dropped)."""
        n = len(data) // 2
        pcm = np.frombuffer(data[: 2 * n], dtype="<i2")
        return cls(pcm.astype(np.float32) / 32768.0, rate, t)


class Mark(str, Enum):
    """The moments of a turn that are timed, in pipeline order."""

    WAKE = "wake"  # wake word detected (absent when no wake word is used)
    SPEECH_START = "speech_start"
    SPEECH_END = "speech_end"  # end of speech: the VAD's first silent frame (the reference point of a turn's latencies)
    TRANSCRIPT = "transcript"  # final transcript ready
    FIRST_TOKEN = "first_token"  # first LLM token
    FIRST_SENTENCE = "first_sentence"  # first sentence cut from the stream
    FIRST_AUDIO = "first_audio"  # first synthesized audio handed to the output
    DONE = "done"  # the turn's last audio played (or the turn ended without any)


# Latencies summarized per session: each is measured from SPEECH_END.
SUMMARY_MARKS = (Mark.TRANSCRIPT, Mark.FIRST_TOKEN, Mark.FIRST_SENTENCE, Mark.FIRST_AUDIO)


@dataclass(frozen=True)
class TurnEvent:
    """One timed moment of turn ``turn`` (structured log event ``voice.turn``). ``detail``: what that moment
    carries (the transcript's text, the sentence, a truncation...)."""

    turn: int
    mark: Mark
    t: float
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"event": "voice.turn", "turn": self.turn, "mark": self.mark.value, "t": round(self.t, 4), **self.detail}


class Stage(str, Enum):
    """The stages of the pipeline, in order."""

    INPUT = "input"
    WAKE = "wake"
    VAD = "vad"
    ASR = "asr"
    LLM = "llm"
    TTS = "tts"
    OUTPUT = "output"


class StageError(EdgerunError):
    """A stage failed on one turn (the model raised, the microphone went away...): reported on one line, and the
    assistant goes back to listening; ``fatal`` (the input is gone for good) ends the session instead."""

    exit_code = 6

    def __init__(self, stage: Stage, message: str, *, turn: int | None = None, fatal: bool = False) -> None:
        super().__init__(f"{stage.value} stage failed: {message}")
        self.stage, self.turn, self.fatal = stage, turn, fatal
