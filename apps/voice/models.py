"""The pipeline's models, taken from the residency manager: leases held for the session (all are pinned),
the LLM leased per turn (its requests at URGENT priority, see apps/voice/conversation.py).

:class:`WakeWordDetector` runs an openWakeWord audio bundle (``edgerun convert audio zoo:openwakeword-...``) on the
live stream (apps/voice/wake.py, shared with the Wyoming server), scored every hop. The openWakeWord models are
licensed for non-commercial use only (CC BY-NC-SA 4.0); say so to whoever picks one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from apps.voice.pipeline import Models
from apps.voice.plan import ESPEAK, WAKE_HOP_FRAMES
from apps.voice.types import SAMPLE_RATE
from apps.voice.wake import WakeStream
from runtime.errors import BadInput
from runtime.residency.manager import ResidencyManager

log = logging.getLogger(__name__)

ASR_PARTIAL_EVERY_S = 1.5  # a partial transcript per 1.5 s of speech: bounded CPU on a 2-core board
# The transcript is decoded after this much quiet following speech (runtime.speech.asr.StreamingTranscriber's pause_s), while
# the VAD waits out its 0.48 s hangover: ready when the end of speech is confirmed, not a decode later.
ASR_PAUSE_S = 0.16


class WakeWordDetector:
    """A detector audio bundle (one output: the wake word's probability) on the pipeline's 16 kHz frames, scored
    every WAKE_HOP_FRAMES frames by the shared streaming detector (apps/voice/wake.py)."""

    def __init__(self, classifier: Any, name: str, threshold: float | None = None) -> None:
        if not classifier.is_detector:
            raise BadInput(f"--wake-word {name}: {classifier.model.manifest.ref} is a {len(classifier.labels)}-class audio "
                           "model, not a wake-word detector (one output)")
        if classifier.spec.sample_rate != SAMPLE_RATE:
            raise BadInput(f"--wake-word {name}: the model takes {classifier.spec.sample_rate} Hz audio; the assistant "
                           f"listens at {SAMPLE_RATE} Hz")
        self.classifier, self.name = classifier, name
        self.stream = WakeStream(classifier, threshold=threshold)
        self.threshold = self.stream.threshold
        self._frames: list[np.ndarray] = []

    def reset(self) -> None:
        self.stream.reset()
        self._frames.clear()

    def detect(self, frame: np.ndarray) -> float | None:
        self._frames.append(frame)
        if len(self._frames) < WAKE_HOP_FRAMES:
            return None
        hits = self.stream.feed(self.classifier, np.concatenate(self._frames))
        self._frames.clear()
        if not hits:
            return None
        self.reset()  # the same utterance does not fire twice
        return hits[0].score


class _Recognizer:
    def __init__(self, asr: Any) -> None:
        self.asr = asr

    def stream(self) -> Any:
        return self.asr.stream(partial_every_s=ASR_PARTIAL_EVERY_S, pause_s=ASR_PAUSE_S)


@contextlib.contextmanager
def leased_models(manager: ResidencyManager, *, tts: str, wake: str | None) -> Iterator[Models]:
    """The pipeline's models from ``manager`` (specs named as apps.voice.plan names them), leased for the block;
    loading them all first, so a load failure is one line before the session starts."""
    from runtime.speech.vad import SpeechSegmenter

    with contextlib.ExitStack() as stack:
        names = {s.name for s in manager.specs()}
        vad = stack.enter_context(manager.acquire("vad"))
        asr = stack.enter_context(manager.acquire("asr"))
        stack.enter_context(manager.acquire("llm"))  # loaded now; each turn takes its own lease
        if tts == ESPEAK:
            from runtime.speech.tts import EspeakTTS

            voice: Any = EspeakTTS()
        else:
            voice = stack.enter_context(manager.acquire("tts"))
        detector = None
        if wake is not None and "wake" in names:
            detector = WakeWordDetector(stack.enter_context(manager.acquire("wake")), wake)
        yield Models(vad=SpeechSegmenter(vad), asr=_Recognizer(asr), llm=lambda: manager.acquire("llm"),
                     tts=voice, wake=detector)
