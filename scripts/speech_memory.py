"""Measure what each speech model adds to a process (RSS) and how fast it runs: the figures behind the
measured plan constants in runtime/asr.py, runtime/vad.py and runtime/tts.py.

Each model is measured in a fresh process over numpy: RSS after importing its library (the runtime term),
after loading it (weights), and the high-water mark while it works (working memory), plus its real-time
factor. Run: ``python scripts/speech_memory.py [--threads 2] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PHRASES = ("Turn on the kitchen lights please.", "What is the capital of France?", "Set a timer for ten minutes.",
           "The quick brown fox jumps over the lazy dog.", "Please remind me to call my mother tomorrow morning.")
# the longest piece runtime.tts gives Piper (MAX_PIECE_CHARS, no comma to cut at): the working memory the plan covers
LONG = ("the weather today is mostly sunny with a light breeze from the west and a high of twenty two degrees so it is "
        "a good afternoon for a long walk in the park")


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def child(kind: str, threads: int, audio: str) -> dict:
    import runtime.speech_models  # noqa: F401  (numpy, the runtime's own modules)

    out: dict = {"kind": kind, "threads": threads, "base": _status("VmRSS")}
    if kind == "asr":
        import faster_whisper  # noqa: F401

        out["imported"] = _status("VmRSS")
        from runtime.asr import ASR

        model = ASR.load(threads=threads)
        out["loaded"] = _status("VmRSS")
        clips = list(np.load(audio, allow_pickle=True))
        model.transcribe(clips[0])  # warm-up
        _reset_peak()
        results = [model.transcribe(c) for c in clips]
        out["peak"] = _status("VmHWM")
        out["rtf"] = sum(r.elapsed_s for r in results) / sum(r.seconds for r in results)
        out["rtf_each"] = [round(r.rtf, 3) for r in results]
        out["texts"] = [r.text for r in results]
        out["plan"] = model.plan.to_dict()
    elif kind == "vad":
        import onnxruntime  # noqa: F401

        out["imported"] = _status("VmRSS")
        from runtime.vad import SileroVAD

        model = SileroVAD.load(threads=1)
        out["loaded"] = _status("VmRSS")
        x = np.concatenate(list(np.load(audio, allow_pickle=True)))
        _reset_peak()
        t0 = time.perf_counter()
        model.stream().probabilities(x)
        out["rtf"] = (time.perf_counter() - t0) / (len(x) / 16000)
        out["peak"] = _status("VmHWM")
        out["plan"] = model.plan.to_dict()
    else:
        import onnxruntime  # noqa: F401

        out["imported"] = _status("VmRSS")
        from runtime.tts import load_tts

        model = load_tts(threads=threads, fallback=False)
        out["loaded"] = _status("VmRSS")
        list(model.speak("Hello."))  # warm-up (the phonemizer loads its data)
        _reset_peak()
        chunks = [c for text in (*PHRASES, LONG) for c in model.speak(text)]
        out["peak"] = _status("VmHWM")
        out["rtf"] = sum(c.elapsed_s for c in chunks) / sum(c.seconds for c in chunks)
        out["first_sentence_s"] = [round(c.elapsed_s, 3) for c in chunks]
        out["plan"] = model.plan.to_dict()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "AUDIO"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.child:
        print(json.dumps(child(args.child[0], args.threads, args.child[1])))
        return
    from tests.runtime.speech_clips import silence, spoken

    clips = [np.concatenate([silence(0.3), spoken(p), silence(0.3)]) for p in PHRASES]
    clips.append(np.concatenate([*clips, *clips])[: 30 * 16000])  # a full 30 s window
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        audio = f"{tmp}/clips.npy"
        arr = np.empty(len(clips), object)
        arr[:] = clips
        np.save(audio, arr, allow_pickle=True)
        for kind in ("asr", "vad", "tts"):
            run = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--child", kind, audio],
                                 capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
            if run.returncode:
                raise SystemExit(f"{kind}: the measuring process failed:\n{run.stderr[-2000:]}")
            row = json.loads(run.stdout.strip().splitlines()[-1])
            mib = lambda b: round(b / 2**20, 1)  # noqa: E731
            row["runtime_mib"] = mib(row["imported"] - row["base"])
            row["weights_mib"] = mib(row["loaded"] - row["imported"])
            row["working_mib"] = mib(row["peak"] - row["loaded"])
            row["adds_mib"] = mib(row["peak"] - row["base"])
            row["plan_mib"] = mib(row["plan"]["total_bytes"])
            rows.append(row)
            print(f"{kind}: runtime {row['runtime_mib']} MiB, weights {row['weights_mib']} MiB, working "
                  f"{row['working_mib']} MiB, adds {row['adds_mib']} MiB (plan {row['plan_mib']} MiB), RTF {row['rtf']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
