"""runtime.speech.tts: the Piper voice in edgerun's ONNX Runtime session, a sentence at a time; espeak-ng as the fallback."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.errors import BadInput, MissingDependency
from runtime.speech.resample import resample
from runtime.speech.tts import MAX_CHARS, MAX_PIECE_CHARS, EspeakTTS, PiperTTS, load_tts, pieces
from tests.runtime.speech_clips import RATE, shared, word_error_rate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tts() -> PiperTTS:
    return shared("tts")


def test_each_sentence_comes_as_its_own_chunk_and_says_it(tts: PiperTTS) -> None:
    text = ["Turn on the kitchen lights.", "The weather is sunny today."]
    chunks = tts.speak(" ".join(text))
    first = next(chunks)  # the first sentence is ready before the second is synthesized
    rest = list(chunks)
    assert len(rest) == 1 and first.rate == rest[0].rate == 22050
    asr = shared("asr")
    for chunk, sentence in zip([first, *rest], text, strict=True):
        assert chunk.samples.dtype == np.float32 and np.abs(chunk.samples).max() <= 1.0
        assert 0.5 < chunk.seconds < 5 and chunk.elapsed_s < chunk.seconds  # faster than real time
        heard = asr.transcribe(resample(chunk.samples, chunk.rate, RATE)).text
        assert word_error_rate(sentence, heard) <= 0.25, (sentence, heard)


def test_long_text_is_cut_into_bounded_pieces_at_commas_or_spaces() -> None:
    words = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet " * 12).strip()
    cut = pieces(words)
    assert len(cut) > 1 and max(map(len, cut)) <= MAX_PIECE_CHARS and " ".join(cut) == words
    assert pieces("one two, three four", limit=12) == ["one two,", "three four"]  # at the comma past half a piece
    assert pieces("x" * 20 + " y", limit=8) == ["xxxxxxxx", "xxxxxxxx", "xxxx y"]  # a run-on word is cut too
    assert pieces("short.") == ["short."]


def test_a_sentence_without_punctuation_is_spoken_in_bounded_pieces(tts: PiperTTS) -> None:
    # Piper's working memory grows with the sentence (334 MiB at 300 characters): the plan holds only if it is cut
    text = ("the weather today is mostly sunny with a light breeze from the west " * 5).strip()
    chunks = list(tts.speak(text))
    assert len(chunks) == len(pieces(text)) >= 3
    assert all(c.seconds < 12 for c in chunks)


def test_empty_text_is_silence_and_bad_text_is_refused(tts: PiperTTS) -> None:
    assert list(tts.speak("  \n ")) == []
    with pytest.raises(BadInput, match="must be a string"):
        list(tts.speak(None))
    with pytest.raises(BadInput, match=f"at most {MAX_CHARS}"):
        list(tts.speak("word " * MAX_CHARS))


def test_without_piper_or_espeak_ng_the_error_names_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "piper", None)  # as if piper-tts were not installed
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MissingDependency, match=r"edgerun\[voice-piper\].*'espeak-ng' program \(apt-get install espeak-ng\)"):
        load_tts()
    with pytest.raises(MissingDependency, match=r"edgerun\[voice-piper\]"):
        load_tts(fallback=False)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="Debian's espeak-ng is not installed (apt-get install espeak-ng)")
@pytest.mark.parametrize("text", ["The capital of France is Paris.", "Turn on the kitchen lights please."])
def test_the_real_espeak_ng_fallback_speaks_what_whisper_hears_back(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setitem(sys.modules, "piper", None)  # as if piper-tts were not installed: load_tts falls back
    voice = load_tts()
    assert isinstance(voice, EspeakTTS)
    chunks = list(voice.speak(text))
    x = np.concatenate([c.samples for c in chunks])
    assert chunks[0].rate == 22050 and x.dtype == np.float32 and 0.1 < float(np.abs(x).max()) <= 1.0
    assert 0.5 < len(x) / chunks[0].rate < 5.0  # a spoken sentence, not a click or a minute of silence
    heard = shared("asr").transcribe(resample(x, chunks[0].rate, RATE)).text
    assert word_error_rate(text, heard) <= 0.2, heard


def test_the_fallback_runs_espeak_ng_with_the_text_on_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Debian's espeak-ng is not installed on this build machine: a stand-in program with its command line
    # (-v VOICE -w FILE --stdin) writes a WAV of the text's length, so the subprocess and WAV plumbing run for real.
    fake = tmp_path / "espeak-ng"
    fake.write_text(f"""#!{sys.executable}
import sys, wave
args = sys.argv[1:]
assert args[:2] == ["-v", "en-us"] and args[2] == "-w" and args[4:] == ["--stdin"], args
text = sys.stdin.read()
with wave.open(args[3], "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(22050)
    w.writeframes(b"\\x00\\x10" * (1000 * len(text)))
""")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setitem(sys.modules, "piper", None)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/nonexistent")
    tts = load_tts()
    assert isinstance(tts, EspeakTTS)
    (chunk,) = tts.speak("-v hello")  # a leading dash is text, not an option
    assert chunk.rate == 22050 and len(chunk.samples) == 1000 * len("-v hello")
    assert chunk.samples[0] == pytest.approx(0x1000 / 32768)
