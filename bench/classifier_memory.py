"""Memory plan against measured peak RSS for classifier bundles (vision and audio), each in a fresh process.

Converts EfficientNet-Lite0 and MobileNetV2 to INT8 TFLite and INT8 ONNX (and
reuses no cache), then for each bundle starts a new interpreter that imports
numpy and the backend, notes its RSS, loads the bundle through edgerun, runs
batch-1 and batch-8 inputs and reports peak RSS (VmHWM) above the numpy-only
start against the plan's total (weights + arena + backend runtime). Prints a
Markdown table; writes bench/results/classifier_memory.json.

    .venv/bin/python bench/classifier_memory.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys
import numpy as np
from runtime.metrics import peak_rss_bytes
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
base = rss()
from runtime.classify.classifier import Classifier
with Classifier.load(sys.argv[1], threads=1, memory=2 << 30, batch=8) as clf:
    spec = clf.spec
    x = np.random.default_rng(0).normal(size=(8, *clf.backend.input.shape[1:])).astype(np.float32)
    clf.scores(x[:1]); clf.scores(x)
    plan = clf.plan
print(json.dumps({"base": base, "peak": peak_rss_bytes(), "plan_total": plan.total_bytes, "weights": plan.weights_bytes,
                  "arena": plan.arena_bytes, "runtime": plan.runtime_bytes}))
"""


def main() -> int:
    from apps.cli import main as edgerun
    from converters.vision import photos

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        calib = Path(tmp) / "calib"
        photos.write_folder(photos.variants([p.rgb for p in photos.photos()], 64, seed=1), calib)
        for model in ("efficientnet-lite0", "mobilenet-v2"):
            for fmt in ("tflite", "onnx"):
                out = Path(tmp) / f"{model}-{fmt}"
                code = edgerun(["convert", "vision", f"zoo:{model}", "--calib", str(calib), "--format", fmt, "--quant", "int8",
                                "--min-agreement", "0.5", "--out", str(out)])
                assert code == 0, code
                env = {**os.environ, "PYTHONPATH": str(ROOT), "EDGERUN_HOME": str(Path(tmp) / "home")}
                res = subprocess.run([sys.executable, "-c", CHILD, str(out)], capture_output=True, text=True, env=env, check=True)
                r = json.loads(res.stdout.strip().splitlines()[-1])
                r.update(model=model, format=fmt, used=r["peak"] - r["base"])
                rows.append(r)
                print(f"done {model} {fmt}", file=sys.stderr, flush=True)
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "classifier_memory.json").write_text(json.dumps(rows, indent=2) + "\n")
    mib = 2**20
    print("| model | format | plan: weights + arena (batch 8) + runtime = total MiB | measured peak above numpy-only start MiB "
          "| measured/plan |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | INT8 {r['format']} | {r['weights'] / mib:.1f} + {r['arena'] / mib:.1f} + {r['runtime'] / mib:.1f} = "
              f"{r['plan_total'] / mib:.1f} | {r['used'] / mib:.1f} | {r['used'] / r['plan_total']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
