"""``edgerun voice``: the memory plan (printed, refused with exit 3 naming the model to shrink), one-line errors for
bad input and output, and the whole assistant on real models: a spoken question in, a spoken answer out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from apps.cli import main
from runtime.formats.wav import write_wav

RATE = 16_000


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    rc = main(["voice", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def plan_4g(smollm) -> dict:
    from apps.voice.plan import VoiceModels, plan_voice

    return plan_voice(VoiceModels(), 4 << 30).to_dict()


def test_plan_prints_every_resident_model_and_fits(capsys, smollm) -> None:
    rc, out, err = run(capsys, "--plan", "--memory", "4G")
    assert rc == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert {"vad", "asr", "llm", "tts"} <= set(rows)
    assert "whisper" not in rows["llm"] and "ctranslate2" in rows["asr"]
    assert "fits" in out.splitlines()[-1]
    rc, out, _ = run(capsys, "--plan", "--memory", "4G", "--json")
    plan = json.loads(out)
    assert rc == 0 and plan["fits"] and [m["name"] for m in plan["models"]] == ["vad", "asr", "llm", "tts"]
    # each library's runtime counted once: ORT serves both the VAD and the voice
    own = sum(m["own_bytes"] for m in plan["models"])
    assert plan["total_bytes"] == own + sum(plan["libraries"].values())
    assert sum(plan["libraries"].values()) < sum(sum(m["runtime"].values()) for m in plan["models"])


def test_plan_that_does_not_fit_is_refused_naming_the_model_to_shrink(capsys, plan_4g: dict) -> None:
    need = plan_4g["total_bytes"]
    budget = int(need * 0.9)  # every model fits alone, not all of them together
    largest = max(plan_4g["models"], key=lambda m: m["own_bytes"])
    rc, out, err = run(capsys, "--plan", "--memory", str(budget))
    assert rc == 3
    assert "DOES NOT FIT" in out
    assert err.count("\n") == 1 and f"shrink {largest['name']} " in err and "--memory" in err
    rc, out, err = run(capsys, "--input", "nothing.wav", "--output", "x.wav", "--memory", str(budget))
    assert rc == 3 and out == "" and f"shrink {largest['name']} " in err  # refused before loading anything


def test_bad_input_and_output_are_one_line_exit_2(capsys, tmp_path: Path, smollm) -> None:
    rc, _, err = run(capsys, "--input", str(tmp_path / "missing.wav"), "--output", str(tmp_path / "a.wav"))
    assert rc == 2 and err.count("\n") == 1 and "missing.wav" in err
    (tmp_path / "text.wav").write_text("hello")
    rc, _, err = run(capsys, "--input", str(tmp_path / "text.wav"), "--output", str(tmp_path / "a.wav"))
    assert rc == 2 and err.count("\n") == 1 and "text.wav" in err
    write_wav(tmp_path / "q.wav", np.zeros(RATE, np.float32), RATE)
    rc, _, err = run(capsys, "--input", str(tmp_path / "q.wav"), "--output", str(tmp_path / "answer.txt"))
    assert rc == 2 and "give 'speaker' or a .wav file path" in err
    rc, _, err = run(capsys, "--input", str(tmp_path / "q.wav"), "--output", str(tmp_path / "no" / "a.wav"))
    assert rc == 2 and "does not exist" in err
    assert not (tmp_path / "a.wav").exists()


@pytest.mark.slow
def test_spoken_question_in_spoken_answer_out(capsys, tmp_path: Path, smollm) -> None:
    from tests.runtime.speech_clips import silence, spoken

    question = np.concatenate([silence(0.5), spoken("What is the capital of France?"), silence(0.3)])
    write_wav(tmp_path / "q.wav", question, RATE)
    rc, out, err = run(capsys, "--input", str(tmp_path / "q.wav"), "--output", str(tmp_path / "a.wav"),
                       "--memory", "4G", "--json")
    assert rc == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    marks = {e["mark"]: e for e in events if e["event"] == "voice.turn"}
    assert "capital" in marks["transcript"]["text"].lower()
    for mark in ("speech_end", "transcript", "first_token", "first_sentence", "first_audio", "done"):
        assert mark in marks, (mark, events)
    assert 0 < marks["first_audio"]["ms_after_speech_end"] < 30_000
    # latencies count from when the speaker stopped, not from when the VAD's 480 ms hangover ran out
    assert 300 <= marks["speech_end"]["vad_decided_ms"] <= 800
    assert marks["transcript"]["ms_after_speech_end"] >= marks["speech_end"]["vad_decided_ms"]
    summary = events[-1]
    assert summary["event"] == "voice.summary" and summary["turns"] == 1
    assert summary["latency_ms"]["first_audio"]["n"] == 1
    from runtime.classify.audio_frontend import read_wav

    answer, rate = read_wav(tmp_path / "a.wav")
    assert len(answer) / rate > 0.5 and float(np.abs(answer).max()) > 0.05  # a spoken answer, not silence
    assert not (tmp_path / "a.wav.part").exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="Debian's espeak-ng is not installed (apt-get install espeak-ng)")
def test_the_espeak_ng_voice_answers_end_to_end(capsys, tmp_path: Path, smollm) -> None:
    """``--tts espeak-ng``: the whole assistant speaks through Debian's espeak-ng program, and what it said is heard
    back by Whisper (runtime.speech.asr) as the sentences the LLM wrote."""
    import re

    from runtime.classify.audio_frontend import load_audio
    from tests.runtime.speech_clips import shared, silence, spoken

    question = np.concatenate([silence(0.5), spoken("What is the capital of France?"), silence(0.3)])
    write_wav(tmp_path / "q.wav", question, RATE)
    rc, out, err = run(capsys, "--input", str(tmp_path / "q.wav"), "--output", str(tmp_path / "a.wav"),
                       "--tts", "espeak-ng", "--memory", "4G", "--json")
    assert rc == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    said = " ".join(e["text"] for e in events if e.get("mark") == "first_sentence")
    assert said, events
    heard = shared("asr").transcribe(load_audio(tmp_path / "a.wav", RATE).samples).text

    def words(text: str) -> set[str]:
        return set(re.findall(r"[a-z]+", text.lower()))

    assert len(words(said) & words(heard)) >= 0.6 * len(words(said)), (said, heard)
