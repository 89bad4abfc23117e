"""Audio benchmark (issue 4): openWakeWord's "alexa" detector on this machine.

Speech clips synthesized offline (Piper, the packaged en_US "joe" voice;
tests/converters/audio/speech.py): 27 calibration clips, 10 held-out clips (4
with the wake word). For the float head and its INT8 / INT4-weight TFLite and
ONNX conversions: size, head latency p50/p99 per window at 1 thread, decision
agreement with the float head over every window of the held-out clips, and
held-out clips detected correctly; plus the front end (mel spectrogram +
speech embedding, float ONNX) per second of audio, which dominates the cost.
Prints a Markdown table and writes bench/results/audio.json.

    .venv/bin/python bench/audio.py [--runs 200]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from converters.audio import zoo  # noqa: E402
from converters.audio.clips import windows  # noqa: E402
from converters.vision import gate, onnx_route, tflite  # noqa: E402
from converters.vision.recipes import QuantScheme  # noqa: E402
from runtime.classify.audio_frontend import OpenWakeWordFrontEnd, load_audio  # noqa: E402
from runtime.classify.classifier import time_calls  # noqa: E402
from tests.converters.audio.speech import OTHER, WAKE, synthesize  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    out = {"load_avg_start": os.getloadavg(), "cpus": os.cpu_count()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        synthesize(root / "calib", WAKE[:4] + OTHER[:5], [0.85, 1.0, 1.2])
        said = synthesize(root / "eval" / "alexa", WAKE[4:], [0.9, 1.1], seed=1)
        held = said + synthesize(root / "eval" / "other", OTHER[5:], [0.9, 1.1], seed=1)
        wake = [p in said for p in held]
        mel, emb = zoo.frontend_files()
        entry = zoo.find("openwakeword-alexa")
        module = zoo.build_head(mel.parent / entry.head)
        fe = OpenWakeWordFrontEnd(mel, emb)  # one thread on this CPU
        cal = windows(root / "calib", fe, zoo.SAMPLE_RATE, limit=500)
        ev = windows(root / "eval", fe, zoo.SAMPLE_RATE)
        clips = [load_audio(p, zoo.SAMPLE_RATE) for p in held]
        per_clip = [fe.windows(c.samples, c.rate).x for c in clips]
        seconds = sum(c.seconds for c in clips)
        start = time.perf_counter()
        for c in clips:
            fe.windows(c.samples, c.rate)
        fe_ms_per_s = (time.perf_counter() - start) * 1e3 / seconds
        fe.close()
        for fmt in ("tflite", "onnx"):
            fp = root / f"float.{fmt}"
            if fmt == "tflite":
                tflite.export_float(module, cal, fp, nhwc=False)
            else:
                onnx_route.export_float(module, cal, fp)
            ref = None
            for tag, quant in (("float", None), ("INT8", QuantScheme.INT8), ("INT4 weights", QuantScheme.INT4W)):
                path = fp if quant is None else root / f"{quant.value}.{fmt}"
                if quant is not None and fmt == "tflite":
                    tflite.quantize(fp, quant, cal, path)
                elif quant is not None:
                    onnx_route.quantize(fp, quant, cal, path, root)
                with gate.open_model(path, fmt, 1) as b:
                    y = gate.outputs(b, ev)
                    t = time_calls(b, gate.quantize(ev[:1], gate.tensor_quant(b.input)), args.runs, warmup=20)
                    detected = [bool(gate.outputs(b, x).max() >= 0.5) for x in per_clip]
                ref = y if ref is None else ref
                m = gate.compare(ref, y, None)
                rows.append({"format": fmt, "variant": tag, "size_kib": path.stat().st_size / 1024,
                             "p50_ms": float(np.percentile(t, 50) * 1e3), "p99_ms": float(np.percentile(t, 99) * 1e3),
                             "agreement": m["top1_agreement"], "max_abs_error": m["max_abs_error"], "windows": len(ev),
                             "clips_correct": sum(d == w for d, w in zip(detected, wake, strict=True)), "clips": len(held)})
            print(f"done {fmt}", file=sys.stderr, flush=True)
    out.update(load_avg_end=os.getloadavg(), rows=rows, frontend_ms_per_audio_second=fe_ms_per_s)
    results = Path(__file__).with_name("results")
    results.mkdir(exist_ok=True)
    (results / "audio.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"machine: {out['cpus']} CPUs, load average {out['load_avg_start'][0]:.2f} at start, {out['load_avg_end'][0]:.2f} at end")
    print(f"front end (mel + embedding, float ONNX, 1 thread): {fe_ms_per_s:.1f} ms per second of audio\n")
    print("| format | head | size KiB | p50 / p99 ms per window (1 thread) | decision agreement with float | max abs error "
          "| held-out clips right |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['format']} | {r['variant']} | {r['size_kib']:.0f} | {r['p50_ms']:.4f} / {r['p99_ms']:.4f} | "
              f"{r['agreement']:.1%} of {r['windows']} | {r['max_abs_error']:.3f} | {r['clips_correct']}/{r['clips']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
