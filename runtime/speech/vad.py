"""Voice activity detection: Silero VAD v6 (ONNX, run by ONNX Runtime) on 16 kHz audio, 32 ms frames.

:class:`SileroVAD` is the model (one per process, shared); :meth:`SileroVAD.stream` gives a stream's
:class:`VadStream`, the speech probability of each 512-sample frame. The network is stateful: each
frame is given the last 64 samples of the frame before it as context, and the LSTM state (h, c) is carried
from frame to frame, so feeding audio in pieces of any size gives the same probabilities as feeding it
whole (frames are run together in one call when several are ready).

:class:`SpeechSegmenter` turns the probabilities into events, with hysteresis as Silero's own
``get_speech_timestamps`` does: speech starts after ``min_speech_ms`` of frames at or above ``threshold``
(the event's time is the first of those frames), and ends after ``hangover_ms`` of frames below
``neg_threshold`` (its time is the first of those silent frames); frames in between keep the state.

    vad = SileroVAD.load()                 # the silero-vad recipe, one thread; shared by any number of streams
    seg = SpeechSegmenter(vad)             # one stream's state (vad.stream() gives the bare probabilities)
    for block in microphone_blocks:        # float32 mono 16 kHz, any length
        for event in seg.feed(block):      # VadEvent("start", 1.23) ... VadEvent("end", 2.87)
            ...
    seg.flush()                            # an "end" if the stream stopped inside speech
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.errors import BadInput, EdgerunError
from runtime.speech.models import SpeechFiles, SpeechPlan, check_samples, ort_session, resolve_speech

log = logging.getLogger(__name__)

RATE = 16_000
FRAME, CONTEXT, STATE = 512, 64, 128  # samples per frame, samples of context before it, LSTM state size
FRAME_S = FRAME / RATE
MODEL_FILE = "silero_vad_v6.onnx"
MAX_RUN_FRAMES = 64  # frames scored in one ONNX Runtime call (2 s): bounds the working memory, whatever a caller feeds
# Measured RSS on x86_64 by scripts/speech_memory.py (ORT 1.32, one thread, the 1.2 MB model), over the voice
# assistant's process with ONNX Runtime started (its term: runtime.speech.models.ORT_RUNTIME_BYTES): the session adds
# 7 MiB, scoring (at most MAX_RUN_FRAMES a call) under 1 more; alone in a process (its session ORT's first) 55.6 MiB
# in all: WEIGHTS_FACTOR x the file and WORKING_BYTES.
WEIGHTS_FACTOR, WORKING_BYTES = 3, 12 << 20


def vad_plan(files: SpeechFiles) -> SpeechPlan:
    from devices.backends import BackendName
    from runtime.speech.models import ORT_RUNTIME_BYTES

    return SpeechPlan(files.name, BackendName.ORT.value, WEIGHTS_FACTOR * files.total_bytes, WORKING_BYTES,
                      ORT_RUNTIME_BYTES)


class SileroVAD:
    """Silero VAD on ONNX Runtime: the model, shared; each stream's state is a :class:`VadStream`."""

    rate = RATE
    frame_samples = FRAME

    def __init__(self, files: SpeechFiles, placement: Any) -> None:
        self.files, self.placement, self.plan = files, placement, vad_plan(files)
        with files.opened(MODEL_FILE) as (path,):
            self._session: Any = ort_session(path, placement, str(files.path(MODEL_FILE)))
        inputs = {i.name: i.shape for i in self._session.get_inputs()}
        if set(inputs) != {"input", "h", "c"} or inputs["input"][-1] != CONTEXT + FRAME:
            self.close()
            raise BadInput(f"{files.path(MODEL_FILE)}: not Silero VAD v6 (inputs {inputs}; expected input (N, "
                           f"{CONTEXT + FRAME}), h and c (1, 1, {STATE}))")

    @classmethod
    def load(cls, ref: str = "default", *, threads: int = 1, busy_threads: int = 0) -> SileroVAD:
        """``ref``: a vad recipe (default: silero-vad) or a folder holding silero_vad_v6.onnx. One thread is plenty:
        a frame takes well under a millisecond."""
        from devices.backends import BackendName
        from devices.placement import resolve_placement

        files = resolve_speech(ref, "vad", (MODEL_FILE,))
        placement = resolve_placement(BackendName.ORT, "cpu", threads=threads, busy_threads=busy_threads)
        return cls(files, placement)

    def stream(self) -> VadStream:
        """A new audio stream over this model (its own context and state; the model is shared and thread-safe)."""
        return VadStream(self)

    def run(self, batch: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Frames with their context, (n, 576), from state (h, c): their probabilities and the state after them."""
        if self._session is None:
            raise EdgerunError(f"{self.files.name}: the VAD model is closed")
        probs, h, c = self._session.run(None, {"input": batch, "h": h, "c": c})
        return np.asarray(probs, np.float32).reshape(len(batch)), h, c

    def close(self) -> None:
        self._session = None

    def __enter__(self) -> SileroVAD:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class VadStream:
    """One audio stream's VAD state: the last frame's context samples, the LSTM state, a partial frame."""

    def __init__(self, model: SileroVAD) -> None:
        self.model = model
        self.reset()

    def reset(self) -> None:
        """Forget the audio so far (a new stream)."""
        self._h = np.zeros((1, 1, STATE), np.float32)
        self._c = np.zeros((1, 1, STATE), np.float32)
        self._context = np.zeros(CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)

    def probabilities(self, samples: Any) -> np.ndarray:
        """The speech probability of every whole frame completed by ``samples`` (float32 mono 16 kHz, any length;
        a partial frame waits for the next call)."""
        x = np.concatenate([self._pending, check_samples(samples, "VAD input")])
        n = len(x) // FRAME
        self._pending = x[n * FRAME :].copy()
        if n == 0:
            return np.zeros(0, np.float32)
        frames = x[: n * FRAME].reshape(n, FRAME)
        prev = np.concatenate([self._context[None], frames[:-1, -CONTEXT:]])
        batch = np.concatenate([prev, frames], axis=1)
        probs = np.empty(n, np.float32)
        for at in range(0, n, MAX_RUN_FRAMES):  # the state carries from run to run: the same as one run
            probs[at : at + MAX_RUN_FRAMES], self._h, self._c = self.model.run(batch[at : at + MAX_RUN_FRAMES], self._h, self._c)
        self._context = frames[-1, -CONTEXT:].copy()
        return probs


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "start" | "end"
    at_s: float  # seconds from the start of the stream: the first speech frame, or the first silent frame after speech
    frame: int  # that frame's index


class SpeechSegmenter:
    """Speech start/end events of one stream from a :class:`SileroVAD` (its own :class:`VadStream`), or from anything
    with ``probabilities(samples)`` and ``reset()``."""

    def __init__(self, vad: Any, *, threshold: float = 0.5, neg_threshold: float | None = None,
                 min_speech_ms: float = 96.0, hangover_ms: float = 480.0) -> None:
        neg = threshold - 0.15 if neg_threshold is None else neg_threshold
        if not 0.0 < threshold < 1.0 or not 0.0 <= neg <= threshold:
            raise BadInput(f"VAD thresholds: need 0 < threshold < 1 and 0 <= neg_threshold <= threshold, got {threshold}, {neg}")
        if min_speech_ms < 0 or hangover_ms < 0:
            raise BadInput(f"VAD min_speech_ms and hangover_ms must be >= 0, got {min_speech_ms}, {hangover_ms}")
        self.vad = vad.stream() if hasattr(vad, "stream") else vad
        self.threshold, self.neg_threshold = threshold, neg
        self.min_speech_frames = max(1, round(min_speech_ms / 1000 / FRAME_S))
        self.hangover_frames = max(1, round(hangover_ms / 1000 / FRAME_S))
        self.reset(reset_vad=False)

    def reset(self, *, reset_vad: bool = True) -> None:
        if reset_vad:
            self.vad.reset()
        self.in_speech = False
        self._frame = 0  # frames seen
        self._run_start = -1  # first frame of the current run of speech (before start) or silence (during speech)
        self._run = 0

    def feed(self, samples: Any) -> list[VadEvent]:
        """Events completed by ``samples`` (float32 mono 16 kHz, any length)."""
        events = []
        for p in self.vad.probabilities(samples):
            events.extend(self._step(float(p)))
        return events

    def _step(self, p: float) -> list[VadEvent]:
        i = self._frame
        self._frame += 1
        if not self.in_speech:
            if p >= self.threshold:
                if self._run == 0:
                    self._run_start = i
                self._run += 1
                if self._run >= self.min_speech_frames:
                    self.in_speech, self._run = True, 0
                    return [VadEvent("start", self._run_start * FRAME_S, self._run_start)]
            elif p < self.neg_threshold:
                self._run = 0  # between the thresholds a run goes on; below neg it breaks
            return []
        if p < self.neg_threshold:
            if self._run == 0:
                self._run_start = i
            self._run += 1
            if self._run >= self.hangover_frames:
                self.in_speech, self._run = False, 0
                return [VadEvent("end", self._run_start * FRAME_S, self._run_start)]
        elif p >= self.threshold:
            self._run = 0  # speech again: the silence so far was a pause
        return []

    def flush(self) -> list[VadEvent]:
        """At the end of the stream: an "end" now if it stopped inside speech."""
        if not self.in_speech:
            return []
        at = self._run_start if self._run else self._frame
        self.in_speech, self._run = False, 0
        return [VadEvent("end", at * FRAME_S, at)]
