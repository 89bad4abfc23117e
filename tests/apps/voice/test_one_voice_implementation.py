"""One implementation of each voice mechanism (the style of tests/test_one_implementation.py): the copies the voice
branch grew in parallel stay merged."""

from __future__ import annotations

import ast

from tests.test_one_implementation import ROOT, _functions_using, _sources


def test_wake_words_are_scored_on_a_stream_in_one_place() -> None:
    # openWakeWord windows scored on live audio (the assistant's pipeline and the Wyoming server's detect requests):
    # apps/voice/wake.py's WakeStream (its _step, which feed calls per 160 ms of audio). The whole-clip path
    # (edgerun run / classify) is runtime.classify.audio_classifier's.
    streaming = [f for f in _functions_using("frontend", "scores") if f.startswith("apps/")]
    assert streaming == ["apps/voice/wake.py:_step"]


def test_a_streamed_utterance_is_transcribed_in_one_place() -> None:
    # Partial transcripts, the decode in the pause after speech, and a final transcript that reuses a decode nothing
    # was said after: runtime.speech.asr.StreamingTranscriber alone (the pipeline's recognizer is asr.stream(pause_s=...)).
    decoders = [f for f in _functions_using("transcribe") if f.split(":")[1] in ("feed", "finish", "_decode")]
    assert decoders == ["runtime/speech/asr.py:_decode"]
    # Classes that take audio with feed() and give a transcript with finish() (the pipeline's Transcriber protocol
    # only declares them); StreamChecker (runtime/serving/safety.py) feeds text, not audio.
    streams = [f"{p.relative_to(ROOT).as_posix()}:{node.name}" for p, src in _sources().items()
               for node in ast.walk(ast.parse(src)) if isinstance(node, ast.ClassDef)
               and {"feed", "finish"} <= {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
               and "transcri" in ast.get_source_segment(src, node).lower()]
    assert sorted(streams) == ["apps/voice/pipeline.py:Transcriber", "runtime/speech/asr.py:StreamingTranscriber"]
