"""Text to speech: a Piper voice (VITS, ONNX Runtime), or Debian's espeak-ng as the fallback voice.

piper-tts is GPL-3.0. It is the optional extra ``voice-piper`` and is imported here only, and only when a
Piper voice is loaded: nothing else in edgerun imports it, and without it edgerun speaks through the
``espeak-ng`` program (a subprocess, so no GPL code is linked either way).

:class:`PiperTTS` runs the voice's ONNX model in edgerun's own ONNX Runtime session (the checked file, the
placement's threads) and uses Piper for what is Piper's: its espeak-ng phonemizer and phoneme ids. Text is
spoken a sentence at a time (Piper's phonemizer cuts it; a sentence longer than MAX_PIECE_CHARS is cut at a comma
or a space first, which bounds the working memory), so ``speak`` yields the first sentence's audio
before the second is synthesized: a voice turn plays one sentence while the next is made.

    tts = load_tts()                          # Piper's joe voice; espeak-ng when piper-tts is not installed
    for chunk in tts.speak("Hello. How are you?"):
        play(chunk.samples, chunk.rate)       # float32 mono -1..1, one sentence each
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.errors import BackendError, BadInput, MissingDependency, one_line, require
from runtime.speech import heap
from runtime.speech.models import SpeechFiles, SpeechPlan, ort_session, resolve_speech

log = logging.getLogger(__name__)

MAX_CHARS = 4000  # of one speak() call: a voice turn speaks sentences, not books
# Piper synthesizes a sentence in one run, and its working memory grows with it (measured: 158 MiB over the loaded
# voice at 150 characters, 334 at 300, 703 at 600): text is cut into pieces of at most this many characters (at a
# comma or a space) before Piper sees it, which bounds the working memory the plan counts, whatever the punctuation.
# At 150 characters ONNX Runtime's arena (before _ShrinkingSession) held 155 MiB and, within a dozen rounds of the same
# sentences, 278; at 100 the peak a piece needs is ~101 MiB above what the voice keeps.
MAX_PIECE_CHARS = 100
PIPER_INSTALL = "pip install 'edgerun[voice-piper]'  (piper-tts, GPL-3.0)"
ESPEAK_INSTALL = "apt-get install espeak-ng"
ESPEAK_TIMEOUT_S = 30.0
# Measured RSS on x86_64 by scripts/speech_memory.py --assistant (ORT 1.32, 2 threads, en_US-joe-medium, 63 MB .onnx),
# in the voice assistant's process with ONNX Runtime started (its term: runtime.speech.models.ORT_RUNTIME_BYTES): the
# session adds 126 MiB, twice the file (the initializers ORT copies, and the checker's parse; WEIGHTS_FACTOR); piper's
# phonemizer and rounds of synthesis up to a MAX_PIECE_CHARS piece peak 107-110 MiB above that and, ORT's arena shrunk
# (_ShrinkingSession) and the heap trimmed (runtime.speech.heap) after each sentence, keep 2 MiB (WORKING_BYTES: 112 at most
# over 8 runs; untrimmed, glibc's arenas kept 16-84 MiB more, which threads had freed what deciding how much).
WEIGHTS_FACTOR, WORKING_BYTES = 2.1, 124 << 20


@dataclass(frozen=True)
class SpeechChunk:
    samples: np.ndarray  # float32 mono -1..1
    rate: int
    text: str  # what it says (Piper: the sentence's phonemes joined; espeak-ng: the text given)
    elapsed_s: float  # synthesis time

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


def _text(text: Any) -> str:
    if not isinstance(text, str):
        raise BadInput(f"text to speak must be a string, not {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise BadInput(f"text to speak is {len(text)} characters; at most {MAX_CHARS} per call (give it a sentence at a time)")
    return " ".join(text.split())


def pieces(text: str, limit: int = MAX_PIECE_CHARS) -> list[str]:
    """``text`` (whitespace already collapsed) cut into pieces of at most ``limit`` characters: at a space, after a
    comma, semicolon or colon where one falls in the second half of a piece; a word longer than ``limit`` is cut."""
    out: list[str] = []
    words = text.split(" ")
    piece = ""
    for word in words:
        while len(word) > limit:
            if piece:
                out.append(piece)
                piece = ""
            out.append(word[:limit])
            word = word[limit:]
        if piece and len(piece) + 1 + len(word) > limit:
            out.append(piece)
            piece = ""
        piece = f"{piece} {word}" if piece else word
        if piece[-1] in ",;:" and len(piece) > limit // 2:
            out.append(piece)
            piece = ""
    if piece:
        out.append(piece)
    return out


def tts_plan(files: SpeechFiles, model_file: str) -> SpeechPlan:
    from devices.backends import BackendName
    from runtime.speech.models import ORT_RUNTIME_BYTES

    return SpeechPlan(files.name, BackendName.ORT.value, int(WEIGHTS_FACTOR * files.size(model_file)), WORKING_BYTES,
                      ORT_RUNTIME_BYTES)


class _ShrinkingSession:
    """Piper's ONNX Runtime session, each run asked to shrink ORT's arena after it (``memory.enable_memory_arena_shrinkage``).

    ORT's CPU arena grows in regions that double in size and keeps them, so what a voice holds after speaking depended
    on the history of its sentences: settled at 89 MiB in most runs of the same sentences, 187 MiB in others (one more
    region). Shrunk after each run (and the C heap trimmed after each sentence: runtime.speech.heap) it keeps ~2 MiB and peaks
    107-110 MiB above that during a MAX_PIECE_CHARS piece, every time: a bound the plan can count (WORKING_BYTES), for
    ~10 % more synthesis time."""

    def __init__(self, session: Any) -> None:
        import onnxruntime as ort

        self._session = session
        self._options = ort.RunOptions()
        self._options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> Any:
        return self._session.run(output_names, input_feed, run_options or self._options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class PiperTTS:
    """A Piper voice: the ``tts`` recipe's .onnx and its .onnx.json config."""

    def __init__(self, files: SpeechFiles, placement: Any) -> None:
        require("piper", PIPER_INSTALL, purpose="the Piper voice")
        from piper.config import PiperConfig, SynthesisConfig  # GPL-3.0: imported only here
        from piper.voice import PiperVoice

        model = next((n for n in files.files if n.endswith(".onnx")), None)
        if model is None or f"{model}.json" not in files.files:
            raise BadInput(f"{files.name}: a Piper voice is a .onnx file and its .onnx.json config")
        self.files, self.placement, self.plan = files, placement, tts_plan(files, model)
        with files.opened(model, f"{model}.json") as (onnx_path, config_path):
            try:
                config = PiperConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
            except (ValueError, KeyError, TypeError) as exc:
                raise BadInput(f"{files.path(model + '.json')}: not a Piper voice config ({one_line(exc)})") from None
            session = ort_session(onnx_path, placement, str(files.path(model)))
        self._voice = PiperVoice(session=_ShrinkingSession(session), config=config)
        self._syn = SynthesisConfig()
        self.rate = int(config.sample_rate)

    def speak(self, text: Any) -> Iterator[SpeechChunk]:
        text = _text(text)
        if not text:
            return
        t0 = time.perf_counter()
        try:
            for piece in pieces(text):
                for chunk in self._voice.synthesize(piece, self._syn):  # an ONNX Runtime run per sentence
                    audio = np.asarray(chunk.audio_float_array, np.float32).reshape(-1)
                    yield SpeechChunk(audio, self.rate, "".join(chunk.phonemes), time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    heap.trim()  # the run's freed buffers go back to the system, whichever thread's arena held them
        except (RuntimeError, ValueError) as exc:  # onnxruntime's errors derive from RuntimeError
            raise BackendError(f"{self.files.name}: Piper failed on {text[:40]!r} ({one_line(exc)})") from None

    def close(self) -> None:
        self._voice = None  # type: ignore[assignment]


class EspeakTTS:
    """Debian's ``espeak-ng`` program as a voice (robotic, tiny, always there on Debian images)."""

    plan = SpeechPlan("espeak-ng", "espeak-ng", 0, 16 << 20, 0)  # a child process, outside this process's RSS

    def __init__(self, voice: str = "en-us", executable: str = "espeak-ng") -> None:
        path = shutil.which(executable)
        if path is None:
            raise MissingDependency(f"text to speech needs the Piper voice ({PIPER_INSTALL}) or the {executable!r} program "
                                    f"({ESPEAK_INSTALL}); neither is installed")
        self.executable, self.voice = path, voice
        self.rate = 22_050  # espeak-ng's output rate; checked per call from the WAV it writes

    def speak(self, text: Any) -> Iterator[SpeechChunk]:
        from runtime.formats.wav import WavReader

        text = _text(text)
        if not text:
            return
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="edgerun-tts-") as tmp:
            out = os.path.join(tmp, "speech.wav")
            try:
                # the text goes on stdin, never as an argument: a leading "-" is not an option then
                subprocess.run([self.executable, "-v", self.voice, "-w", out, "--stdin"], input=text.encode(),
                               capture_output=True, timeout=ESPEAK_TIMEOUT_S, check=True)
            except subprocess.TimeoutExpired:
                raise BackendError(f"espeak-ng took over {ESPEAK_TIMEOUT_S:.0f} s on {text[:40]!r}; stopped") from None
            except subprocess.CalledProcessError as exc:
                raise BackendError(f"espeak-ng failed (exit {exc.returncode}: {one_line(exc.stderr.decode(errors='replace'))})") from None
            with WavReader(out) as wav:
                audio = np.concatenate(list(wav.blocks()))
                self.rate = wav.info.rate
        yield SpeechChunk(audio, self.rate, text, time.perf_counter() - t0)

    def close(self) -> None:
        pass


def load_tts(ref: str = "default", *, threads: int | None = None, busy_threads: int = 0, fallback: bool = True) -> Any:
    """The voice ``ref`` (a tts recipe, default piper-joe-medium). When piper-tts is not installed and ``fallback``,
    espeak-ng instead (logged); MissingDependency naming both when neither is there."""
    from devices.backends import BackendName
    from devices.placement import resolve_placement

    if ref == "espeak-ng":
        return EspeakTTS()
    placement = resolve_placement(BackendName.ORT, "cpu", threads=threads, busy_threads=busy_threads)
    try:
        return PiperTTS(resolve_speech(ref, "tts", ()), placement)
    except MissingDependency as exc:  # piper-tts or the voice's package is not installed
        if not fallback:
            raise
        log.warning("%s; speaking through espeak-ng instead", exc)
        return EspeakTTS()
