"""The voice test audio (scripts/make_voice_audio.py): the scoring helpers on hand-worked cases, and the corpus
itself: every kind is there, the voices differ, the clips are the same every run, and what each clip says is
what a speech recognizer hears (so the corpus can score the assistant)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.classify.audio_frontend import read_wav
from scripts import make_voice_audio as mva
from tests.apps.voice.voice_audio import TEST_VOICES, judge, voice_corpus  # noqa: F401  (fixtures)


def test_word_errors_count_edits_after_normalizing() -> None:
    assert mva.word_errors("What is two plus two?", "what is 2 plus 2") == (0, 5)
    assert mva.word_errors("turn on the lights", "turn the light") == (2, 4)  # "on" deleted, "lights" substituted
    assert mva.word_errors("stop", "stop it now") == (2, 1)  # insertions count: WER can pass 1
    assert mva.word_errors("", "") == (0, 0)
    assert mva.wer([("a b c d", "a b c d"), ("one two", "one three")]) == pytest.approx(1 / 6)
    assert mva.words("It's 24 degrees, set-point 100%") == ["it's", "twenty", "four", "degrees", "set", "point",
                                                            "one", "hundred", "percent"]


def test_strip_wake_and_on_topic() -> None:
    assert mva.strip_wake("Alexa, what is the capital of France?") == "what is the capital of France?"
    assert mva.strip_wake("Hey Alexa. Stop the music.") == "Stop the music."
    assert mva.strip_wake("Alexander the Great") == "Alexander the Great"  # a word boundary, not a prefix
    assert mva.on_topic("The capital of France is Paris.", ("paris",))
    assert mva.on_topic("There are 24 hours in a day.", ("twenty four",))
    assert not mva.on_topic("I like turtles.", ("paris", "france"))
    assert not mva.on_topic("Parisian food", ("paris",))  # whole words only


def test_corpus_kinds_voices_and_layout(voice_corpus: mva.Corpus) -> None:  # noqa: F811
    kinds = {c.kind for c in voice_corpus.clips}
    assert {"turn", "question", "command", "wake", "negative", "noise"} <= kinds
    for voice in TEST_VOICES:
        turns = voice_corpus.of("turn", voice=voice)
        assert len(turns) == len(mva.QUESTIONS) + len(mva.COMMANDS)
        assert all(t.wake and t.request and t.text.startswith(mva.WAKE_PHRASE) for t in turns)
    for clip in voice_corpus.clips:
        x, rate = read_wav(voice_corpus.path(clip))
        assert rate == voice_corpus.rate and abs(len(x) / rate - clip.seconds) < 0.01, clip.id
        if clip.kind in ("turn", "question", "command", "wake", "negative"):
            end = int(clip.speech_end_s * rate)  # speech then the silent tail: the assistant can see speech end
            assert np.abs(x[end - rate // 4 : end]).max() > 0.02, clip.id
            assert np.abs(x[end + rate // 20 :]).max() < 0.01, clip.id
    # the two voices are different voices: their spectra differ more than a voice differs between two phrases
    a, b = (read_wav(voice_corpus.path(voice_corpus.of("question", voice=v)[0]))[0] for v in TEST_VOICES)
    assert abs(_centroid(a) - _centroid(b)) > 150.0


def _centroid(x: np.ndarray, rate: int = 22050) -> float:
    spectrum = np.abs(np.fft.rfft(x))
    return float((spectrum * np.fft.rfftfreq(len(x), 1 / rate)).sum() / spectrum.sum())


def test_same_clips_every_run(voice_corpus: mva.Corpus) -> None:  # noqa: F811
    """Piper's clips are the same samples every run; espeak-ng's vary by a few milliseconds (its synthesizer has
    run-to-run jitter even with its random seed fixed), never in what they say (test_what_each_clip_says_is_heard)."""
    for voice, same in (("piper-joe", True), (TEST_VOICES[1], False)):
        clip = voice_corpus.of("question", voice=voice)[0]
        again, first = (mva.say(clip.text, mva.VOICES[voice])[0] for _ in range(2))
        if same:
            assert np.array_equal(again, first), clip.id
        assert abs(len(again) - len(first)) < 0.01 * len(first), clip.id
        assert abs(mva.LEAD_S + len(first) / 22050 - clip.speech_end_s) < 0.01 * clip.speech_end_s, clip.id


def test_unknown_voice_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown voice.*valid: piper-joe"):
        mva.write_corpus(tmp_path, ["piper-jane"])


@pytest.mark.slow
def test_what_each_clip_says_is_heard(voice_corpus: mva.Corpus, judge) -> None:  # noqa: F811
    """Whisper hears the questions and commands of both voices with a low word error rate, and hears the wake
    word in the turns: the corpus says what its manifest says."""
    for voice in TEST_VOICES:
        clips = voice_corpus.of("question", "command", voice=voice)
        pairs = [(c.text, judge.transcribe(voice_corpus.path(c))) for c in clips]
        rate = mva.wer(pairs)
        print(f"{voice}: WER {rate:.1%} over {len(pairs)} clips")
        assert rate <= 0.25, (voice, rate, [p for p in pairs if mva.word_errors(*p)[0]])
    turn = voice_corpus.of("turn", voice=TEST_VOICES[0])[0]
    assert mva.words(judge.transcribe(voice_corpus.path(turn)))[0] == mva.WAKE_WORD
