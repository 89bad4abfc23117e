"""``edgerun voice``: a local voice assistant (wake word, VAD, Whisper, the LLM, Piper), offline, in one memory plan.

    edgerun voice --input question.wav --output answer.wav      # per-stage latencies printed per turn
    edgerun voice --wake-word hey-jarvis                          # microphone and speaker
    edgerun voice --plan --memory 1G                              # the memory plan; exit 3 when it does not fit
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from apps.cli.flags import integer, sampling_value, size, thread_count

HELP = "a local voice assistant: microphone or WAV in, speaker or WAV out, all models under one memory plan"
log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", default="mic", metavar="mic|FILE.wav", help="audio in (default: the microphone)")
    parser.add_argument("--output", default="speaker", metavar="speaker|FILE.wav", help="audio out (default: the speaker)")
    parser.add_argument("--wake-word", metavar="NAME",
                        help="an openWakeWord audio bundle (edgerun convert audio zoo:openwakeword-...); without it every "
                             "utterance is a question. openWakeWord's models are licensed for non-commercial use only "
                             "(CC BY-NC-SA 4.0)")
    parser.add_argument("--memory", type=size(), metavar="SIZE",
                        help="one budget for every resident model, e.g. 1G (default: the board profile's share of RAM)")
    parser.add_argument("--llm", default="default", metavar="MODEL", help="the LLM: an installed name, bundle or .gguf")
    parser.add_argument("--ctx", type=integer(256, 32768), default=None, metavar="N",
                        help="tokens of conversation memory (default 1024); older turns are dropped, the system prompt kept")
    parser.add_argument("--asr", default="default", metavar="REF", help="speech recognizer (default whisper-tiny-en)")
    parser.add_argument("--tts", default="default", metavar="REF",
                        help="voice (default piper-joe-medium, needs the GPL-3.0 piper-tts extra; espeak-ng: the program)")
    parser.add_argument("--threads", type=thread_count, metavar="N", help="CPU threads of the LLM and the recognizer")
    parser.add_argument("--system", metavar="TEXT", help="the system prompt (default: short spoken answers)")
    parser.add_argument("--temperature", type=sampling_value("temperature"), metavar="T",
                        help="LLM: 0 is greedy, the same answer every time (default: the bundle's)")
    parser.add_argument("--seed", type=sampling_value("seed"), metavar="N", help="LLM: the same seed gives the same answers")
    parser.add_argument("--plan", action="store_true", help="print the memory plan and exit (exit 3 when it does not fit)")
    parser.add_argument("--barge-in", action=argparse.BooleanOptionalAction, default=None,
                        help="speech while the assistant answers stops it (default on, off with mic and speaker: "
                             "without echo cancellation it would hear itself)")
    parser.add_argument("--fast", action="store_true",
                        help="read --input FILE.wav as fast as the answers allow, not in real time: each question is "
                             "heard once the one before it is answered (no barge-in)")
    parser.add_argument("--json", action="store_true", help="print each turn event as a JSON line instead of a table row")


def main(args: argparse.Namespace) -> int:
    from apps.voice.plan import DEFAULT_CTX, VoiceModels, open_residency, plan_voice
    from runtime.llm.plan import default_budget
    from runtime.residency.loaders import default_loaders

    wanted = VoiceModels(llm=args.llm, asr=args.asr, tts=args.tts, wake=args.wake_word, ctx=args.ctx or DEFAULT_CTX,
                         threads=args.threads)
    budget = args.memory or default_budget()
    loaders = default_loaders()
    plan = plan_voice(wanted, budget, loaders)
    if args.plan:
        print(json.dumps(plan.to_dict()) if args.json else "\n".join(plan.lines()))
        if not plan.fits:
            raise plan.refusal()
        return 0
    if not plan.fits:
        raise plan.refusal()
    source, sink = _source(args), None
    try:
        sink = _sink(args)
        with open_residency(plan, loaders) as manager:
            return _converse(args, wanted, manager, source, sink)
    finally:
        source.close()
        if sink is not None:
            sink.close()


def _source(args: argparse.Namespace) -> Any:
    from apps.voice.audio_io import MicSource, WavSource
    from runtime.errors import BadInput

    if args.input == "mic":
        if args.fast:
            raise BadInput("--fast reads a WAV file ahead of real time; it does not apply to --input mic")
        return MicSource()
    return WavSource(args.input, realtime=not args.fast)


def _sink(args: argparse.Namespace) -> Any:
    from apps.voice.audio_io import SpeakerSink, WavSink
    from runtime.errors import BadInput

    if args.output == "speaker":
        return SpeakerSink()
    if not args.output.lower().endswith((".wav", ".wave")):
        raise BadInput(f"--output {args.output!r}: give 'speaker' or a .wav file path")
    return WavSink(args.output)


def _converse(args: argparse.Namespace, wanted: Any, manager: Any, source: Any, sink: Any) -> int:
    from apps.voice.conversation import SYSTEM_PROMPT, Conversation
    from apps.voice.models import leased_models
    from apps.voice.pipeline import Options, Pipeline

    live = args.input == "mic" and args.output == "speaker"
    barge_in = (not live) if args.barge_in is None else args.barge_in
    with leased_models(manager, tts=wanted.tts, wake=wanted.wake) as models:
        pipeline = Pipeline(models, sink, conversation=Conversation(args.system or SYSTEM_PROMPT, **{
            k: v for k in ("temperature", "seed") if (v := getattr(args, k)) is not None}),
                            options=Options(barge_in=barge_in and not args.fast, hold_input=args.fast),
                            on_event=_printer(args.json))
        print("listening" + (f" for the wake word {wanted.wake!r}" if wanted.wake else "") + " (Ctrl-C ends)",
              file=sys.stderr)
        try:
            results = pipeline.run(source.frames())
        except KeyboardInterrupt:
            pipeline.stop()
            results = pipeline.results
        summary = pipeline.timing.summary()
        if args.json:
            print(json.dumps({"event": "voice.summary", "turns": len(results), "latency_ms": summary}))
        else:
            print(f"session: {len(results)} turn(s); latency from end of speech:")
            for line in pipeline.timing.summary_lines():
                print("  " + line)
    return 0


def _printer(as_json: bool) -> Any:
    from apps.voice.types import Mark, TurnEvent

    def show(event: TurnEvent) -> None:
        if as_json:
            print(json.dumps(event.to_dict(), default=str), flush=True)
            return
        ms = event.detail.get("ms_after_speech_end")
        when = f"+{ms:7.1f} ms" if ms is not None else " " * 11
        extra = event.detail.get("text") or event.detail.get("reason") or event.detail.get("error") or ""
        if event.mark is Mark.WAKE:
            extra = f"{event.detail.get('wake_word')} (score {event.detail.get('score')})"
        print(f"turn {event.turn:<3} {event.mark.value:<15} {when}  {extra}".rstrip(), flush=True)

    return show
