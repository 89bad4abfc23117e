"""Vision benchmark (issue 4): EfficientNet-Lite0 and MobileNetV2 (ImageNet) on this machine.

For each model: the PyTorch float model (the "what you'd use instead" baseline),
float and static-INT8 TFLite (LiteRT), float and static-INT8 ONNX (ONNX Runtime), INT8 with
weights rounded to nearest, with GPTQ-rounded weights (the converter's default), and what
``--equalize on`` builds (activation ranges equalized across channels before GPTQ, the
candidate closest to float on the calibration set kept; converters.vision.equalize):
size, batch-1 latency p50/p99 at 1 and 2 threads through edgerun's backends,
top-1 agreement with the float model of the same format on the 8 real photos
plus a generated set of 192 crops/flips/brightness changes of them, and how many
photos with a known ImageNet class get it right, and how often the float
model agrees with itself when the same images get +-1 grey level of noise (the
noise floor of top-1 agreement on this set), and the agreement over the images
whose float top-1 survives that noise, and whether the converter's default gate
(converters.vision.gate.default_checks) passes the row. Calibration uses 128 other
generated images (seed 1). Prints a Markdown table (for the README) and writes
bench/results/vision.json.

    .venv/bin/python bench/vision.py [--runs 50]
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

import copy  # noqa: E402

from converters.classifier.quantize import build_quantized  # noqa: E402
from converters.vision import gate, onnx_route, photos, rounding, tflite, zoo  # noqa: E402
from converters.vision.recipes import Format, QuantScheme, Rounding  # noqa: E402
from converters.vision.source import Source, SourceKind  # noqa: E402
from runtime.bundle.manifest import Layout, VisionSpec  # noqa: E402
from runtime.classify.classifier import time_calls  # noqa: E402
from runtime.classify.preprocess import image_tensor  # noqa: E402


def lat(backend, x: np.ndarray, runs: int) -> tuple[float, float]:
    t = time_calls(backend, gate.quantize(x[:1], gate.tensor_quant(backend.input)), runs, warmup=5)
    return float(np.percentile(t, 50) * 1e3), float(np.percentile(t, 99) * 1e3)


def torch_row(module, x: np.ndarray, runs: int) -> dict:
    import torch

    row = {"size_mb": sum(p.numel() * 4 for p in module.parameters()) / 2**20}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        one = torch.from_numpy(x[:1])
        with torch.no_grad():
            for _ in range(5):
                module(one)
            t = []
            for _ in range(runs):
                s = time.perf_counter()
                module(one)
                t.append(time.perf_counter() - s)
        row[f"p50_{threads}"], row[f"p99_{threads}"] = float(np.percentile(t, 50) * 1e3), float(np.percentile(t, 99) * 1e3)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--models", nargs="+", default=list(zoo.MODELS))
    args = ap.parse_args()
    ph = photos.photos()
    base = [p.rgb for p in ph]
    cal_imgs, ev_imgs = photos.benchmark_sets(base)
    # The same evaluation images with +-1 grey level of noise: how often the float model disagrees with itself
    # over a change no one can see (the floor under any top-1 agreement on this set).
    rng = np.random.default_rng(3)
    noisy_imgs = [np.clip(i.astype(np.int16) + rng.integers(-1, 2, i.shape), 0, 255).astype(np.uint8) for i in ev_imgs]
    rows, out = [], {"load_avg_start": os.getloadavg(), "cpus": os.cpu_count()}
    for name in args.models:
        entry = zoo.find(name)
        module = entry.build()
        spec = VisionSpec(size=entry.size, layout=Layout.NCHW, mean=entry.mean, std=entry.std)
        rounded = copy.deepcopy(module)
        gptq = rounding.round_weights(rounded, image_tensor(cal_imgs, spec))
        print(f"GPTQ {name}: {gptq}", file=sys.stderr, flush=True)
        for fmt, layout in (("tflite", Layout.NHWC), ("onnx", Layout.NCHW)):
            spec = VisionSpec(size=entry.size, layout=layout, mean=entry.mean, std=entry.std)
            cal, ev, noisy = image_tensor(cal_imgs, spec), image_tensor(ev_imgs, spec), image_tensor(noisy_imgs, spec)
            nchw = ev if layout is Layout.NCHW else np.ascontiguousarray(np.moveaxis(ev, -1, 1))
            if fmt == "tflite":
                rows.append({"model": name, "variant": "PyTorch float (baseline)", **torch_row(module, nchw, args.runs)})
            with tempfile.TemporaryDirectory() as tmp:
                fp, qp = Path(tmp) / f"float.{fmt}", Path(tmp) / f"int8.{fmt}"
                rp, gp = Path(tmp) / f"rounded.{fmt}", Path(tmp) / f"gptq.{fmt}"
                # what `edgerun convert --equalize on` builds: every equalization candidate GPTQ-rounded and
                # quantized, the one closest to float on the calibration set kept
                ep, eq_work = Path(tmp) / f"equalized.{fmt}", Path(tmp) / "eq"
                eq_work.mkdir()
                choice = build_quantized(Source(SourceKind.TORCH, name, module=module), Format(fmt), QuantScheme.INT8, cal, Path("bench"),
                                         eq_work, ep, nhwc=fmt == "tflite", rounding=Rounding.GPTQ, equalize=True)
                kept = choice.equalization["kept"]
                print(f"equalize {name} {fmt}: {choice.equalization}", file=sys.stderr, flush=True)
                if fmt == "tflite":
                    tflite.export_float(module, cal, fp, nhwc=True)
                    tflite.quantize(fp, QuantScheme.INT8, cal, qp)
                    tflite.export_float(rounded, cal, rp, nhwc=True)
                    tflite.quantize(rp, QuantScheme.INT8, cal, gp)
                else:
                    onnx_route.export_float(module, cal, fp)
                    onnx_route.quantize(fp, QuantScheme.INT8, cal, qp, Path(tmp))
                    onnx_route.export_float(rounded, cal, rp)
                    onnx_route.quantize(rp, QuantScheme.INT8, cal, gp, Path(tmp))
                outs = {}
                float_p50 = noisy_out = None  # set by the float row, which comes first
                for tag, path in (("float", fp), ("INT8 nearest", qp), ("INT8 GPTQ", gp), (f"INT8 --equalize on: {kept}", ep)):
                    row = {"model": name, "variant": f"{tag} {'TFLite (LiteRT)' if fmt == 'tflite' else 'ONNX (ORT)'}",
                           "size_mb": path.stat().st_size / 2**20}
                    for threads in (1, 2):
                        with gate.open_model(path, fmt, threads) as b:
                            if threads == 1:
                                outs[tag] = gate.outputs(b, ev)
                                if tag == "float":
                                    noisy_out = gate.outputs(b, noisy)
                                    row["self_agree"] = float((noisy_out.argmax(1) == outs[tag].argmax(1)).mean())
                            row[f"p50_{threads}"], row[f"p99_{threads}"] = lat(b, ev, args.runs)
                    top = outs[tag][: len(ph)].argmax(1)
                    row["photos_correct"] = sum(int(top[i]) in p.expected for i, p in enumerate(ph))
                    row["photos_known"] = sum(1 for p in ph if p.expected)
                    if tag != "float":
                        m = gate.compare(outs["float"], outs[tag], None)
                        photo = gate.compare(outs["float"][: len(ph)], outs[tag][: len(ph)], None)
                        row.update(agree_all=m["top1_agreement"], agree_top5=m["top5_agreement"], agree_photos=photo["top1_agreement"],
                                   cosine_min=m["cosine_min"], speedup=float_p50 / row["p50_1"])
                        row["agree_stable"], row["stable_n"] = gate.agreement_where_stable(outs["float"], noisy_out, outs[tag])
                        checks = gate.default_checks(samples=len(ev), top1_agreement=m["top1_agreement"],
                                                     top5_agreement=m["top5_agreement"], top1_agreement_stable=row["agree_stable"],
                                                     stable_samples=row["stable_n"])
                        row["default_gate"] = "passes" if all(c.passed for c in checks) else \
                            "fails: " + ", ".join(c.name for c in checks if not c.passed)
                        if tag == "INT8 GPTQ":
                            row["gptq_seconds"] = gptq["seconds"]
                    else:
                        float_p50 = row["p50_1"]
                    rows.append(row)
            print(f"done {name} {fmt}", file=sys.stderr, flush=True)
    out["load_avg_end"] = os.getloadavg()
    out["rows"] = rows
    results = Path(__file__).with_name("results")
    results.mkdir(exist_ok=True)
    (results / "vision.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"machine: {out['cpus']} CPUs, load average {out['load_avg_start'][0]:.2f} at start, {out['load_avg_end'][0]:.2f} at end\n")
    print("| model | variant | size MiB | p50/p99 ms, 1 thread | p50/p99 ms, 2 threads | INT8/float p50 (1 thr) "
          "| top-1 agreement: photos / all 200 | where float is stable | top-5 agr. | cosine min | float vs itself, +-1 grey level "
          "| photos correct | default gate |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        agree = f"{r['agree_photos']:.0%} / {r['agree_all']:.1%}" if "agree_all" in r else ""
        speed = f"{1 / r['speedup']:.2f}x" if "speedup" in r else ""
        top5 = f"{r['agree_top5']:.1%}" if "agree_top5" in r else ""
        correct = f"{r['photos_correct']}/{r['photos_known']}" if "photos_correct" in r else ""
        floor = f"{r['self_agree']:.1%}" if "self_agree" in r else ""
        cos = f"{r['cosine_min']:.3f}" if "cosine_min" in r else ""
        stable = f"{r['agree_stable']:.1%} of {r['stable_n']}" if r.get("agree_stable") is not None else ""
        print(f"| {r['model']} | {r['variant']} | {r['size_mb']:.1f} | {r['p50_1']:.2f} / {r['p99_1']:.2f} "
              f"| {r['p50_2']:.2f} / {r['p99_2']:.2f} | {speed} | {agree} | {stable} | {top5} | {cos} | {floor} | {correct} "
              f"| {r.get('default_gate', '')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
