"""The pipeline's models, taken from the residency manager: leases held for the session (all are pinned),
the LLM leased per turn (its requests at URGENT priority, see apps/voice/conversation.py).

:class:`WakeWordDetector` runs an openWakeWord audio bundle (``edgerun convert audio zoo:openwakeword-...``) on the
live stream: a rolling buffer of one classifier window plus one hop, scored every hop. The openWakeWord models are
licensed for non-commercial use only (CC BY-NC-SA 4.0); say so to whoever picks one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from apps.voice.pipeline import Models
from apps.voice.plan import ESPEAK
from apps.voice.types import FRAME_SAMPLES, SAMPLE_RATE
from runtime.errors import BadInput
from runtime.residency import ResidencyManager

log = logging.getLogger(__name__)

WAKE_HOP_FRAMES = 5  # score every 160 ms (openWakeWord steps 80 ms; a wake word lasts ~0.6 s)
ASR_PARTIAL_EVERY_S = 1.0  # a partial transcript per second of speech: bounded CPU on a 2-core board


class WakeWordDetector:
    """A detector audio bundle (one output: the wake word's probability) on 16 kHz frames."""

    def __init__(self, classifier: Any, name: str, threshold: float | None = None) -> None:
        from runtime.audio import OWW_MIN_SAMPLES

        if not classifier.is_detector:
            raise BadInput(f"--wake-word {name}: {classifier.model.manifest.ref} is a {len(classifier.labels)}-class audio "
                           "model, not a wake-word detector (one output)")
        if classifier.spec.sample_rate != SAMPLE_RATE:
            raise BadInput(f"--wake-word {name}: the model takes {classifier.spec.sample_rate} Hz audio; the assistant "
                           f"listens at {SAMPLE_RATE} Hz")
        self.classifier, self.name = classifier, name
        self.threshold = classifier.spec.threshold if threshold is None else threshold
        self.hop = WAKE_HOP_FRAMES * FRAME_SAMPLES
        self._buf = np.zeros(OWW_MIN_SAMPLES + self.hop, np.float32)
        self.reset()

    def reset(self) -> None:
        self._buf[:] = 0.0
        self._new = 0

    def detect(self, frame: np.ndarray) -> float | None:
        n = len(frame)
        self._buf = np.roll(self._buf, -n)
        self._buf[-n:] = frame
        self._new += n
        if self._new < self.hop:
            return None
        fresh, self._new = self._new, 0
        w = self.classifier.frontend.windows(self._buf, SAMPLE_RATE)
        keep = w.ends > (len(self._buf) - fresh) / SAMPLE_RATE  # windows ending in the new audio (and the tail pad)
        if not keep.any():
            return None
        score = float(self.classifier.scores(w.x[keep])[:, 0].max())
        if score < self.threshold:
            return None
        self.reset()  # the same utterance does not fire twice
        return score


class _Recognizer:
    def __init__(self, asr: Any) -> None:
        self.asr = asr

    def stream(self) -> Any:
        return self.asr.stream(partial_every_s=ASR_PARTIAL_EVERY_S)


@contextlib.contextmanager
def leased_models(manager: ResidencyManager, *, tts: str, wake: str | None) -> Iterator[Models]:
    """The pipeline's models from ``manager`` (specs named as apps.voice.plan names them), leased for the block;
    loading them all first, so a load failure is one line before the session starts."""
    from runtime.vad import SpeechSegmenter

    with contextlib.ExitStack() as stack:
        names = {s.name for s in manager.specs()}
        vad = stack.enter_context(manager.acquire("vad"))
        asr = stack.enter_context(manager.acquire("asr"))
        stack.enter_context(manager.acquire("llm"))  # loaded now; each turn takes its own lease
        if tts == ESPEAK:
            from runtime.tts import EspeakTTS

            voice: Any = EspeakTTS()
        else:
            voice = stack.enter_context(manager.acquire("tts"))
        detector = None
        if wake is not None and "wake" in names:
            detector = WakeWordDetector(stack.enter_context(manager.acquire("wake")), wake)
        yield Models(vad=SpeechSegmenter(vad), asr=_Recognizer(asr), llm=lambda: manager.acquire("llm"),
                     tts=voice, wake=detector)
