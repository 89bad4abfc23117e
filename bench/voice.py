"""Voice benchmark (issue 19): the whole assistant on this machine, over spoken turns.

The audio is made here (scripts/make_voice_audio.py): wake word + question or command "turns" in Piper and
espeak-ng voices, and the same corpus' speech without the wake word and noise. openWakeWord's "alexa" head is
converted to an INT8 TFLite bundle on the corpus (as the tests do). Each measurement runs in a fresh process:

- ``session``: ``edgerun voice`` (the CLI, in process) on one WAV of >= 20 turns read in real time, each turn
  followed by silence long enough for its answer: end of speech -> transcript, first token, first sentence and
  first audio out, p50/p95; the transcripts' word error rate; peak RSS of the process against the memory plan;
- ``asr``: runtime.speech.asr on every question and command clip: real-time factor (decoding time / audio time), WER;
- ``tts``: runtime.speech.tts (the default voice) on the answers the session gave: real-time factor;
- ``wake``: the assistant's wake-word detector (apps/voice/models.py) on every clip without the wake word, fed
  frame by frame: false accepts per hour of that audio; and the share of wake turns it detects.

Prints a table and writes bench/results/voice.json; the machine's load average is recorded beside the figures.

    .venv/bin/python bench/voice.py [--turns 24] [--voices piper-joe espeak-en-us espeak-en-us-f3] [--gap 7]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import make_voice_audio as mva  # noqa: E402

MEMORY = "2G"
TARGET_P50_MS = 1500.0  # issue 19: end of speech -> first audio out, p50, on this 2-core machine


def _corpus(root: Path) -> mva.Corpus:
    return mva.Corpus.load(root)


def worker_session(corpus_dir: str, bundle: str, session_wav: str, out_wav: str) -> dict:
    from apps.cli import main as edgerun
    from apps.voice.plan import DEFAULT_CTX, VoiceModels, plan_voice
    from runtime.metrics import peak_rss_bytes
    from runtime.units import parse_size

    plan = plan_voice(VoiceModels(wake=bundle, ctx=DEFAULT_CTX), parse_size(MEMORY))
    buf = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(buf):
        code = edgerun(["voice", "--input", session_wav, "--output", out_wav, "--wake-word", bundle, "--memory", MEMORY,
                        "--json"])
    events = [json.loads(line) for line in buf.getvalue().splitlines() if line.startswith("{")]
    return {"exit_code": code, "events": events, "wall_s": time.monotonic() - t0, "peak_rss_bytes": peak_rss_bytes(),
            "plan": plan.to_dict(), "plan_total_bytes": plan.total, "plan_reserve_bytes": plan.reserve,
            "load1": os.getloadavg()[0]}


def worker_asr(corpus_dir: str) -> dict:
    from runtime.classify.audio_frontend import load_audio
    from runtime.speech.asr import ASR

    corpus = _corpus(Path(corpus_dir))
    clips = corpus.of("question", "command")
    rows = []
    with ASR.load() as asr:
        asr.transcribe(load_audio(corpus.path(clips[0]), 16000).samples)  # warm-up (first-call allocations)
        for c in clips:
            t = asr.transcribe(load_audio(corpus.path(c), 16000).samples)
            rows.append({"id": c.id, "voice": c.voice, "ref": c.text, "hyp": t.text, "seconds": t.seconds,
                         "elapsed_s": t.elapsed_s})
    return {"rows": rows, "load1": os.getloadavg()[0]}


def worker_tts(texts_json: str) -> dict:
    from runtime.speech.tts import load_tts

    texts = json.loads(Path(texts_json).read_text())
    tts = load_tts("default")
    list(tts.speak("Warming up."))
    rows = []
    for text in texts:
        t0 = time.perf_counter()
        seconds = sum(chunk.seconds for chunk in tts.speak(text))
        rows.append({"text": text, "seconds": seconds, "elapsed_s": time.perf_counter() - t0})
    tts.close()
    return {"voice": type(tts).__name__, "rows": rows, "load1": os.getloadavg()[0]}


def worker_wake(corpus_dir: str, bundle: str) -> dict:
    from apps.voice.models import WakeWordDetector
    from apps.voice.types import FRAME_SAMPLES
    from runtime.classify.audio_classifier import AudioClassifier
    from runtime.classify.audio_frontend import load_audio

    corpus = _corpus(Path(corpus_dir))
    detector = WakeWordDetector(AudioClassifier.load(bundle), "alexa")

    def fires(clip: mva.Clip) -> int:
        x = load_audio(corpus.path(clip), 16000).samples
        detector.reset()
        n = 0
        for at in range(0, len(x) - FRAME_SAMPLES + 1, FRAME_SAMPLES):
            n += detector.detect(x[at : at + FRAME_SAMPLES]) is not None
        return n

    t0 = time.perf_counter()
    negatives = [{"id": c.id, "kind": c.kind, "seconds": c.seconds, "fires": fires(c)}
                 for c in corpus.of("question", "command", "negative", "noise", "human")]
    turns = [{"id": c.id, "voice": c.voice, "fires": fires(c)} for c in corpus.of("turn")]
    return {"negatives": negatives, "turns": turns, "elapsed_s": time.perf_counter() - t0, "load1": os.getloadavg()[0]}


def _spawn(kind: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", kind, *args], capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"bench/voice.py: the {kind} worker failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _convert_wake(corpus: mva.Corpus, root: Path) -> Path:
    """The "alexa" bundle as tests/apps/voice/voice_audio.py makes it (calibrated on the corpus)."""
    calib = corpus.of("wake", "command") + corpus.of("negative")[::2]
    held = {"alexa": corpus.of("turn")[::5], "other": corpus.of("negative")[1::2]}
    for folder, clips in [("calib", calib), *((f"eval/{k}", v) for k, v in held.items())]:
        (root / folder).mkdir(parents=True)
        for c in clips:
            os.link(corpus.path(c), root / folder / Path(c.file).name)
    out = root / "alexa-tflite-int8"
    subprocess.run([sys.executable, "-m", "apps", "convert", "audio", "zoo:openwakeword-alexa", "--calib", str(root / "calib"),
                    "--eval", str(root / "eval"), "--format", "tflite", "--quant", "int8", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    return out


def _session_wav(corpus: mva.Corpus, clips: list[mva.Clip], path: Path, gap_s: float) -> None:
    from runtime.classify.audio_frontend import read_wav
    from runtime.formats.wav import write_wav

    parts = []
    for i, c in enumerate(clips):
        x, _ = read_wav(corpus.path(c))
        parts += [x, mva.floor_noise(mva.silence(gap_s, corpus.rate), 7000 + i)]
    write_wav(path, np.concatenate(parts), corpus.rate)


def _align(turns: list[mva.Clip], heard: list[str], lookahead: int = 3) -> list[tuple[mva.Clip, str]]:
    """Each transcript with the turn it transcribes: turns are heard in order, but one whose wake word was missed
    has no transcript, so each goes to the best-matching of the next ``lookahead`` turns not yet matched."""
    out, at = [], 0
    for h in heard:
        window = turns[at : at + lookahead]
        if not window:
            break
        rates = [mva.word_errors(c.request, mva.strip_wake(h)) for c in window]
        best = min(range(len(window)), key=lambda k: rates[k][0] / max(rates[k][1], 1))
        out.append((window[best], h))
        at += best + 1
    return out


def _pct(values: list[float], q: float) -> float:
    from runtime.metrics import PercentileMethod, percentile

    return percentile(values, q, method=PercentileMethod.NEAREST_RANK) if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=24, help="spoken turns in the session (at least 20)")
    ap.add_argument("--voices", nargs="+", default=list(mva.DEFAULT_VOICES), choices=list(mva.VOICES))
    ap.add_argument("--gap", type=float, default=7.0, help="seconds of silence after each turn (room for its answer)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "voice.json"))
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, *rest = args.worker
        fn = {"session": worker_session, "asr": worker_asr, "tts": worker_tts, "wake": worker_wake}[kind]
        print(json.dumps(fn(*rest)))
        return 0
    if args.turns < 20:
        raise SystemExit(f"bench/voice.py: --turns {args.turns}: the benchmark needs at least 20 turns")

    results: dict = {"machine": {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()}, "voices": args.voices}
    with tempfile.TemporaryDirectory(prefix="voice-bench-") as tmp:
        root = Path(tmp)
        corpus = mva.write_corpus(root / "audio", args.voices)
        bundle = _convert_wake(corpus, root / "wake")
        by_voice = [corpus.of("turn", voice=v) for v in args.voices]
        turns = [c for group in zip(*by_voice, strict=False) for c in group][: args.turns]  # voices interleaved
        _session_wav(corpus, turns, root / "session.wav", args.gap)
        print(f"{len(turns)} turns, {sum(c.seconds for c in turns) + args.gap * len(turns):.0f} s of input, "
              f"real time", file=sys.stderr, flush=True)
        session = _spawn("session", str(corpus.root), str(bundle), str(root / "session.wav"), str(root / "answers.wav"))
        asr = _spawn("asr", str(corpus.root))
        answers = [e["text"] for e in session["events"] if e.get("mark") == "first_sentence" and e.get("text")]
        texts = root / "texts.json"
        texts.write_text(json.dumps(answers or ["The capital of France is Paris."]))
        tts = _spawn("tts", str(texts))
        wake = _spawn("wake", str(corpus.root), str(bundle))

    # session: per-turn latencies from the structured events
    events = session["events"]
    lat: dict[str, list[float]] = {}
    for e in events:
        if e.get("event") == "voice.turn" and "ms_after_speech_end" in e:
            lat.setdefault(e["mark"], []).append(e["ms_after_speech_end"])
    heard = [e["text"] for e in events if e.get("mark") == "transcript"]
    woke = [e for e in events if e.get("mark") == "wake"]
    matched = _align(turns, heard)
    session_wer = mva.wer((c.request, mva.strip_wake(h)) for c, h in matched) if matched else None
    missed = [c.id for c in turns if c not in {m[0] for m in matched}]
    asr_rtf = sum(r["elapsed_s"] for r in asr["rows"]) / sum(r["seconds"] for r in asr["rows"])
    asr_wer = {v: mva.wer((r["ref"], r["hyp"]) for r in asr["rows"] if r["voice"] == v) for v in args.voices}
    tts_rtf = sum(r["elapsed_s"] for r in tts["rows"]) / max(sum(r["seconds"] for r in tts["rows"]), 1e-9)
    neg_s = sum(r["seconds"] for r in wake["negatives"])
    false_accepts = sum(r["fires"] for r in wake["negatives"])
    plan_bytes = session["plan_total_bytes"]  # the models and their libraries; the 5 % reserve is headroom on top
    results.update(
        session={"turns": len(turns), "exit_code": session["exit_code"], "wakes": len(woke), "transcripts": len(heard),
                 "wer": session_wer, "missed_turns": missed, "latency_ms": {m: {"n": len(v), "p50": _pct(v, 50), "p95": _pct(v, 95)}
                                                    for m, v in lat.items()},
                 "peak_rss_bytes": session["peak_rss_bytes"], "plan_bytes": plan_bytes,
                 "plan_reserve_bytes": session["plan_reserve_bytes"],
                 "rss_over_plan": session["peak_rss_bytes"] / plan_bytes, "plan": session["plan"],
                 "wall_s": session["wall_s"], "load1": session["load1"], "events": events},
        asr={"rtf": asr_rtf, "wer_by_voice": asr_wer, "clips": len(asr["rows"]), "load1": asr["load1"], "rows": asr["rows"]},
        tts={"rtf": tts_rtf, "voice": tts["voice"], "sentences": len(tts["rows"]), "load1": tts["load1"]},
        wake={"false_accepts": false_accepts, "non_wake_seconds": neg_s,
              "false_accepts_per_hour": false_accepts / (neg_s / 3600), "turns_detected": sum(r["fires"] > 0 for r in wake["turns"]),
              "turns": len(wake["turns"]), "load1": wake["load1"], "negatives": wake["negatives"]},
        load_at_end=os.getloadavg(),
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, default=float))

    s = results["session"]
    first = s["latency_ms"].get("first_audio", {"n": 0, "p50": float("nan"), "p95": float("nan")})
    print(f"machine: {os.cpu_count()} CPUs, load average {results['machine']['load_at_start'][0]:.2f} at start, "
          f"{results['load_at_end'][0]:.2f} at end; voices {', '.join(args.voices)}")
    print("| measure | value |")
    print("|---|---:|")
    for mark in ("transcript", "first_token", "first_sentence", "first_audio"):
        if mark in s["latency_ms"]:
            m = s["latency_ms"][mark]
            print(f"| end of speech -> {mark.replace('_', ' ')}, p50 / p95 (n={m['n']}) | {m['p50']:.0f} / {m['p95']:.0f} ms |")
    print(f"| turns woken / transcribed of {s['turns']} | {s['wakes']} / {s['transcripts']} |")
    if s["missed_turns"]:
        print(f"| turns not woken | {', '.join(s['missed_turns'])} |")
    if s["wer"] is not None:
        print(f"| turn transcripts, word error rate | {s['wer']:.1%} |")
    print(f"| ASR real-time factor (Whisper tiny.en INT8, {results['asr']['clips']} clips) | {asr_rtf:.3f} |")
    print("| ASR word error rate by voice | " + ", ".join(f"{v} {w:.1%}" for v, w in asr_wer.items()) + " |")
    print(f"| TTS real-time factor ({tts['voice']}, {len(tts['rows'])} sentences) | {tts_rtf:.3f} |")
    w = results["wake"]
    print(f"| wake-word false accepts per hour ({w['false_accepts']} in {neg_s / 60:.1f} min of non-wake audio) "
          f"| {w['false_accepts_per_hour']:.1f} |")
    fired = [r["id"] for r in w["negatives"] if r["fires"]]
    if fired:
        print(f"| false accepts on | {', '.join(fired)} |")
    print(f"| wake turns detected | {w['turns_detected']} / {w['turns']} |")
    print(f"| peak RSS of the assistant / its plan (+ 5 % reserve) | {s['peak_rss_bytes'] / 2**20:.0f} / "
          f"{plan_bytes / 2**20:.0f} MiB (+ {s['plan_reserve_bytes'] / 2**20:.0f}): {s['rss_over_plan']:.2f} |")
    verdict = "meets" if first["p50"] <= TARGET_P50_MS else "misses"
    print(f"\nfirst audio p50 {first['p50']:.0f} ms {verdict} the {TARGET_P50_MS:.0f} ms target; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
