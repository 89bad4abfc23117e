"""Wake-word detection on a live stream: the one implementation behind the assistant's pipeline
(:class:`apps.voice.models.WakeWordDetector`) and the Wyoming server's ``detect`` requests.

openWakeWord's front end turns audio into mel frames (10 ms) and a speech embedding over 76 frames; its heads score 16
embeddings 8 frames (80 ms) apart. On a whole clip (:meth:`runtime.classify.audio_frontend.OpenWakeWordFrontEnd.windows`) those windows
sit on one 80 ms grid, and on a live stream the grid falls wherever the stream happened to start. The heads are not
equally sure at every offset of that grid: a stream that started 30 ms later hears the same espeak-ng "Alexa" at
0.25 instead of 0.99 (a Piper voice: 0.996 at every offset), so a turn was heard or missed by the accident of when the
stream began. :class:`WakeStream` therefore scores ``phases`` interleaved grids (an embedding every 8 / phases mel
frames: every frame, 10 ms, by default) and reports what any of them hears, so the score no longer depends on where
the stream started; each mel frame and each embedding is computed once, as the audio arrives (a step costs the new
audio's work, not a window's worth again: eight grids cost less than the one that was re-run over 2 s every step).
The threshold is the bundle's own.

Silence is a -100 dBFS hiss (:data:`SILENCE_RMS`), the same whether the audio is digital zeros or a quiet room. The
time before the stream (or a :meth:`WakeStream.reset`) is the stream's own background, taken from its first 80 ms.

Memory: the last 75 mel frames, the last 15 x ``phases`` embeddings and under one frame of samples, whatever the
stream's length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.classify.audio_frontend import (
    OWW_EMBEDDINGS,
    OWW_FFT_SAMPLES,
    OWW_HOP_SAMPLES,
    OWW_MEL_STEP,
    OWW_MEL_WINDOW,
    OWW_TAIL_SECONDS,
    FrontEnd,
)
from runtime.errors import BadInput

PHASES = 8  # interleaved 80 ms grids scored (1, 2, 4 or 8): an embedding every 10 ms (every mel frame)
# After a detection, no other for this long: a window spans ~2 s of audio (OWW_MIN_SAMPLES), so the word stays in the
# windows that follow it, and beside the next words they can score over the threshold again (measured: a second hit
# 1.04 s after the first, on the same "Alexa" followed by a question).
REFRACTORY_S = 2.0
PRIME_FRAMES = 8  # mel frames (80 ms) a (re)started stream hears before its background is taken from them (_prime)
MAX_STEP_SAMPLES = 2560  # audio scored in one step (160 ms at 16 kHz: 16 mel frames, so 2 x PHASES windows)
# The whole-clip front end's grid, in this stream's frames (its clip is padded with OWW_MIN_SAMPLES of silence in front):
# with phases=1 the stream scores exactly the windows runtime.classify.audio_frontend computes on the clip.
_ALIGN = OWW_MEL_STEP - 1
_SPAN = OWW_EMBEDDINGS - 1  # embeddings before the newest one in a head's window
# Silence, as the stream hears it: a -100 dBFS hiss, below any microphone's own noise. openWakeWord's mel model clips
# each call's quietest bins at 80 dB under its loudest, so digital zeros read differently beside speech and alone (-8,
# a value no microphone gives); the stream's features are floored at this hiss's.
SILENCE_RMS = 1e-5


@dataclass(frozen=True)
class Hit:
    at_s: float  # where the word ends, in seconds from the start of the stream
    score: float


class WakeStream:
    """One stream's wake-word state for an openWakeWord detector bundle (runtime.classify.audio_classifier.AudioClassifier).

    ``feed(classifier, samples)`` takes float samples (-1..1) at the bundle's rate as they arrive and returns the
    detections completed by them; ``final=True`` (the stream's end) adds the front end's silent tail, so that a word
    at the very end is scored too. The classifier is passed on each call: the residency manager may hand out the
    same resident model to many streams."""

    def __init__(self, classifier: Any, *, phases: int = PHASES, threshold: float | None = None,
                 refractory_s: float = REFRACTORY_S) -> None:
        spec = classifier.spec
        if spec.frontend != FrontEnd.OPENWAKEWORD:
            raise BadInput(f"{classifier.model.manifest.ref}: a wake word streams through openWakeWord's front end; "
                           f"this bundle's front end is {spec.frontend.value}")
        if phases not in (1, 2, 4, 8):
            raise BadInput(f"wake word: phases must be 1, 2, 4 or 8 (grids scored per 80 ms), got {phases}")
        self.rate, self.phases = int(spec.sample_rate), phases
        self.stride = OWW_MEL_STEP // phases  # mel frames between two embeddings
        self.threshold = spec.threshold if threshold is None else threshold
        self.refractory_s = refractory_s
        fe = classifier.frontend
        hiss = np.random.default_rng(0).normal(0.0, SILENCE_RMS, self.rate // 4).astype(np.float32)
        self._floor = fe.features(hiss).mean(axis=0)  # per mel bin
        self.reset()

    def reset(self) -> None:
        """Forget the audio so far: the stream starts again after silence."""
        self._pcm = np.zeros(OWW_FFT_SAMPLES - OWW_HOP_SAMPLES, np.float32)  # the first frame straddles the start
        # the mel frames and embeddings before the newest: None until the first step makes them of the stream's
        # own background (_prime)
        self._mel: np.ndarray | None = None
        self._emb: np.ndarray | None = None
        self._frames = 0  # mel frames of the stream made so far
        self._last_hit = -math.inf
        self.peak = 0.0  # the best score since the reset (what a missed word came closest to)

    def feed(self, classifier: Any, samples: np.ndarray, *, final: bool = False) -> list[Hit]:
        x = np.asarray(samples, np.float32)
        if final:
            x = np.concatenate([x, np.zeros(int(OWW_TAIL_SECONDS * self.rate), np.float32)])
        # at most MAX_STEP_SAMPLES per step, whatever a caller hands over at once (a Wyoming chunk may hold 30 s):
        # the windows scored together, and so the working memory the plan counts, stay one step's
        return [hit for at in range(0, len(x), MAX_STEP_SAMPLES) for hit in self._step(classifier, x[at : at + MAX_STEP_SAMPLES])]

    def _prime(self, fe: Any, new: np.ndarray) -> None:
        """The windows before the stream: its own background, not a synthetic floor. A stream (re)started in a room's
        steady noise, after the floor's -100 dBFS history, heard the step from one to the other as a sound, and the
        alexa head scored it up to 0.62 (measured: a false wake right after an answer, once the detector resumed in
        -73 dBFS noise). Each mel bin's quietest value over the first step's frames (PRIME_FRAMES at least) stands for the
        background before it: noise continues, and a word that begins at once is not stretched back over the window."""
        level = new.min(axis=0)
        self._mel = np.tile(level, (OWW_MEL_WINDOW - 1, 1))
        self._emb = np.tile(fe.embed(np.tile(level, (OWW_MEL_WINDOW, 1)), [0])[0], (_SPAN * self.phases, 1))

    def _step(self, classifier: Any, x: np.ndarray) -> list[Hit]:
        pcm = np.concatenate([self._pcm, x])
        n = (len(pcm) - OWW_FFT_SAMPLES) // OWW_HOP_SAMPLES + 1 if len(pcm) >= OWW_FFT_SAMPLES else 0
        if n <= 0:
            self._pcm = pcm
            return []
        fe = classifier.frontend
        if self._mel is None and n < PRIME_FRAMES:  # too little to tell the background by: wait for more
            self._pcm = pcm
            return []
        new = np.maximum(fe.features(pcm[: (n - 1) * OWW_HOP_SAMPLES + OWW_FFT_SAMPLES]), self._floor)
        if self._mel is None:
            self._prime(fe, new)
        assert self._mel is not None and self._emb is not None
        mel = np.concatenate([self._mel, new])
        self._pcm = pcm[n * OWW_HOP_SAMPLES :]
        first, self._frames = self._frames, self._frames + n
        base = first - len(self._mel)  # the frame of mel[0]
        self._mel = mel[-(OWW_MEL_WINDOW - 1) :]
        ends = [f for f in range(first, first + n) if (f - _ALIGN) % self.stride == 0]
        if not ends:
            return []
        emb = np.concatenate([self._emb, fe.embed(mel, [f - (OWW_MEL_WINDOW - 1) - base for f in ends])])
        span, k = _SPAN * self.phases, len(self._emb)
        windows = np.stack([emb[k + j - span : k + j + 1 : self.phases] for j in range(len(ends))]).astype(np.float32)
        self._emb = emb[-span:]
        scores = classifier.scores(windows)[:, 0]
        self.peak = max(self.peak, float(scores.max()))
        hits = []
        for f, score in zip(ends, scores, strict=True):
            at = (f + 1) * OWW_HOP_SAMPLES / self.rate  # frame f ends (f + 1) hops into the stream
            if score >= self.threshold and at - self._last_hit >= self.refractory_s:
                self._last_hit = at
                hits.append(Hit(at, float(score)))
        return hits
