"""runtime.speech.asr: Whisper tiny.en through faster-whisper on the checked files, whole clips and streaming partials."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.errors import BadInput, DoesNotFit
from runtime.residency.manager import ModelSpec, ResidencyManager
from runtime.speech.asr import ASR, asr_plan
from runtime.speech.models import resolve_speech
from tests.runtime.speech_clips import PHRASES, RATE, shared, silence, spoken, word_error_rate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def asr() -> ASR:
    return shared("asr")


def test_spoken_sentences_are_transcribed(asr: ASR) -> None:
    for text in PHRASES:
        got = asr.transcribe(np.concatenate([silence(0.3), spoken(text), silence(0.3)]))
        assert word_error_rate(text, got.text) <= 0.2, (text, got.text)
        assert got.seconds == pytest.approx(0.6 + len(spoken(text)) / RATE)
        assert 0 < got.rtf < 1  # tiny.en INT8 on two threads is faster than real time


def test_a_quiet_room_gives_no_words(asr: ASR) -> None:
    got = asr.transcribe(silence(2.0))
    assert got.text == "" or got.no_speech_prob > 0.5, got
    assert asr.transcribe(np.zeros(100, np.float32)).text == ""  # under 0.1 s: nothing to hear


def test_streaming_partials_grow_and_the_final_is_the_whole_clip(asr: ASR) -> None:
    text = PHRASES[1]
    x = np.concatenate([silence(0.2), spoken(text), silence(0.4)])
    stream = asr.stream(partial_every_s=0.5)
    partials = [p for i in range(0, len(x), 1600) if (p := stream.feed(x[i : i + 1600])) is not None]
    assert len(partials) == int(len(x) / RATE / 0.5), partials  # one decode per half second of new audio
    assert word_error_rate(text, partials[-1]) <= 0.2, partials
    assert len(partials[0].split()) < len(partials[-1].split()), partials  # the first half second holds fewer words
    final = stream.finish()
    assert final.text == asr.transcribe(x).text and not final.truncated
    assert stream.seconds == 0.0  # reset for the next utterance


def test_a_partial_that_covered_the_end_of_speech_is_the_final_transcript(asr: ASR) -> None:
    speech = spoken(PHRASES[2])
    x = np.concatenate([speech, silence(0.5)])  # the hangover's silence after the speech
    end_s = len(speech) / RATE
    stream = asr.stream(partial_every_s=end_s + 0.1)  # one partial, decoded just after the speech ended
    partials = [p for i in range(0, len(x), 800) if (p := stream.feed(x[i : i + 800])) is not None]
    assert len(partials) == 1
    final = stream.finish(speech_end_s=end_s)
    assert final.text == partials[0] and final.elapsed_s == 0.0  # no second decode
    assert final.seconds == pytest.approx(len(x) / RATE, abs=0.06)
    for i in range(0, len(x), 800):  # the same partial at end_s + 0.1 s, but now speech is said to end after it
        stream.feed(x[i : i + 800])
    late = stream.finish(speech_end_s=end_s + 0.3)
    assert late.elapsed_s > 0 and word_error_rate(PHRASES[2], late.text) <= 0.2


def test_a_stream_past_max_seconds_keeps_the_start_and_says_so(asr: ASR) -> None:
    stream = asr.stream(partial_every_s=10.0, max_seconds=1.0)
    stream.feed(silence(0.6))
    stream.feed(silence(0.6))
    assert stream.seconds == pytest.approx(1.0) and stream.truncated
    assert stream.finish().truncated


@pytest.mark.parametrize("bad, why", [(np.zeros((2, 16000), np.float32), "1-D"), (np.zeros(16000, np.int16), "float"),
                                      ([float("inf")] * 16000, "infinity")])
def test_bad_samples_are_refused_in_one_line(asr: ASR, bad: object, why: str) -> None:
    with pytest.raises(BadInput, match=why):
        asr.transcribe(bad)


def test_stream_limits_are_checked(asr: ASR) -> None:
    with pytest.raises(BadInput, match="partial_every_s"):
        asr.stream(partial_every_s=0)


def test_the_speech_models_share_one_memory_plan() -> None:
    """ASR, VAD and TTS as residency kinds: each planned with its measured terms; ONNX Runtime (VAD and TTS) once."""
    files = resolve_speech("default", "asr", ("model.bin",))
    with pytest.raises(DoesNotFit, match="whisper"):
        ResidencyManager(asr_plan(files).total_bytes).add(ModelSpec("whisper", "default", "asr"))
    with ResidencyManager(1 << 30) as models:
        for kind in ("asr", "vad", "tts"):
            models.add(ModelSpec(kind, "default", kind, pinned=True, options={"threads": 1}))
        plans = {kind: models.planned_bytes(kind) for kind in ("asr", "vad", "tts")}
        for kind in ("asr", "vad", "tts"):
            with models.acquire(kind) as obj:
                assert obj.plan.total_bytes == plans[kind]
        from runtime.speech.models import ORT_RUNTIME_BYTES

        assert models.used_bytes() == sum(plans.values()) - ORT_RUNTIME_BYTES
        assert {r["name"] for r in models.resident()} == {"asr", "vad", "tts"}
