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
ASR_PARTIAL_EVERY_S = 1.5  # a partial transcript per 1.5 s of speech: bounded CPU on a 2-core board


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


class PauseTranscriber:
    """One utterance's transcript, decoded while the VAD is still waiting out its hangover.

    Whisper cannot extend a decode, so a partial transcript is of no use to the final one unless nothing was said
    after it. Here the audio is watched as it is fed: once it has been quiet for PAUSE_S after speech, the whole
    buffer is decoded at once (in the ASR stage's thread, while the VAD's ~0.5 s hangover runs). When the end of speech
    is then confirmed and nothing loud came after that decode, :meth:`finish` returns it without decoding again: the
    transcript is ready when the VAD decides, not a decode later. Speech after the pause makes the next pause (or
    finish) decode again. Besides, a partial every ``partial_every_s`` of speech is decoded (logged by the pipeline)."""

    PAUSE_S = 0.16  # quiet after speech that is worth a decode (the VAD's hangover is 0.48 s)
    QUIET_RMS = 0.1  # a frame below this fraction of the loudest frame so far (and below -40 dBFS) is quiet

    def __init__(self, asr: Any, partial_every_s: float = ASR_PARTIAL_EVERY_S, max_seconds: float = 30.0) -> None:
        self.asr, self.partial_every = asr, int(partial_every_s * SAMPLE_RATE)
        self._buf = np.zeros(int(max_seconds * SAMPLE_RATE), np.float32)
        self._n = self._quiet = self._decoded_n = 0
        self._loudest = 0.0
        self._decoded: Any = None  # the last decode, and whether anything loud came after it
        self._loud_after = True
        self.decodes = 0

    def feed(self, samples: np.ndarray) -> str | None:
        x = np.asarray(samples, np.float32)[: len(self._buf) - self._n]
        self._buf[self._n : self._n + len(x)] = x
        self._n += len(x)
        rms = float(np.sqrt(np.mean(x**2))) if len(x) else 0.0
        self._loudest = max(self._loudest, rms)
        if rms < max(0.01, self.QUIET_RMS * self._loudest):
            self._quiet += len(x)
        else:
            self._quiet, self._loud_after = 0, True
        paused = self._quiet >= self.PAUSE_S * SAMPLE_RATE and self._loud_after and self._loudest > 0.01
        if paused or self._n - self._decoded_n >= self.partial_every:
            return self._decode().text
        return None

    def _decode(self) -> Any:
        self._decoded = self.asr.transcribe(self._buf[: self._n])
        self._decoded_n, self._loud_after = self._n, False
        self.decodes += 1
        return self._decoded

    def finish(self) -> Any:
        if self._decoded is not None and not self._loud_after:
            return self._decoded  # nothing but quiet since: that decode is the transcript
        return self._decode()


class _Recognizer:
    def __init__(self, asr: Any) -> None:
        self.asr = asr

    def stream(self) -> PauseTranscriber:
        return PauseTranscriber(self.asr)


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
