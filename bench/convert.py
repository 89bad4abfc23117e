"""Converter benchmark: wall time and peak RSS per stage, and the quality table per quant type.

On the largest real checkpoint available offline (SmolLM2-135M-Instruct,
derived from its packaged GGUF with scripts/derive_hf_checkpoint.py unless
--checkpoint is given), each stage runs in a fresh process so that its peak RSS
is its own: HF -> F16 GGUF, then per quant type llama.cpp's quantization and
the evaluation against F16. Prints a table, writes bench/results/convert.json.
The load average is recorded beside the figures (2 shared cores here).

    python bench/convert.py [--checkpoint HF_DIR] [--quants q8_0 q4_0 q4_k_m] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stage(kind: str, a: str, b: str, quant: str, threads: int) -> dict:
    """One stage in this (fresh) process; returns seconds and peak RSS."""
    from converters.llm.options import Quant

    t0 = time.monotonic()
    extra: dict = {}
    if kind == "gguf":
        from converters.llm.checkpoint import HFCheckpoint
        from converters.llm.gguf_export import write_gguf

        with HFCheckpoint.open(Path(a)) as ckpt:
            write_gguf(ckpt, ckpt.vocab(), Path(b), Quant.F16, name="bench")
    elif kind == "quantize":
        from converters.llm.quantize import quantize

        quantize(Path(a), Path(b), Quant.parse(quant), threads=threads)
    elif kind == "evaluate":
        from converters.llm.quality import DEFAULT_TEXT, evaluate

        extra = evaluate(Path(a), Path(b), quant, DEFAULT_TEXT.read_text(), threads=threads).summary()
    return {"seconds": time.monotonic() - t0, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            **extra}


def _run(kind: str, a: Path, b: Path, quant: str, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--stage", kind, str(a), str(b), quant, str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"stage {kind} {quant} failed:\n{proc.stderr[-2000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "load_avg_1m": os.getloadavg()[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, help="HF folder (default: derive SmolLM2-135M-Instruct)")
    p.add_argument("--quants", nargs="+", default=["q8_0", "q4_k_m", "q4_0"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--stage", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.stage:
        kind, a, b, quant, threads = args.stage
        print(json.dumps(stage(kind, a, b, quant, int(threads))))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-convert-") as tmp:
        work = Path(tmp)
        ckpt = args.checkpoint
        if ckpt is None:
            t0 = time.monotonic()
            subprocess.run([sys.executable, str(ROOT / "scripts" / "derive_hf_checkpoint.py"), "default",
                            str(work / "smollm2-135m-instruct")], check=True, capture_output=True, cwd=ROOT)
            ckpt = work / "smollm2-135m-instruct"
            print(f"derived {ckpt.name} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        ckpt_bytes = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
        f16 = work / "f16.gguf"
        stages = [{"stage": "hf->f16 gguf", "quant": "f16", **_run("gguf", ckpt, f16, "f16", args.threads)}]
        quality = []
        for quant in args.quants:
            out = work / f"{quant}.gguf"
            stages.append({"stage": "quantize", "quant": quant, **_run("quantize", f16, out, quant, args.threads)})
            ev = _run("evaluate", f16, out, quant, args.threads)
            stages.append({"stage": "evaluate", "quant": quant,
                           **{k: ev[k] for k in ("seconds", "peak_rss_mib", "load_avg_1m")}})
            quality.append({"quant": quant, "size_mib": out.stat().st_size / 2**20, **{k: ev[k] for k in (
                "tokens", "ppl_f16", "ppl_quant", "kl_mean", "kl_p99", "top1_agreement")}})
        quality.insert(0, {"quant": "f16", "size_mib": f16.stat().st_size / 2**20, "tokens": quality[0]["tokens"],
                           "ppl_f16": quality[0]["ppl_f16"], "ppl_quant": quality[0]["ppl_f16"], "kl_mean": 0.0,
                           "kl_p99": 0.0, "top1_agreement": 1.0})
    result = {"checkpoint": ckpt.name, "checkpoint_mib": ckpt_bytes / 2**20, "machine": platform.machine(),
              "cpus": os.cpu_count(), "threads": args.threads, "stages": stages, "quality": quality}
    print(f"{ckpt.name}: {ckpt_bytes / 2**20:.0f} MiB safetensors, {args.threads} threads, {os.cpu_count()} CPUs")
    print(f"{'stage':<14}{'quant':<8}{'wall s':>8}{'peak RSS MiB':>14}{'load 1m':>9}")
    for s in stages:
        print(f"{s['stage']:<14}{s['quant']:<8}{s['seconds']:>8.1f}{s['peak_rss_mib']:>14.0f}{s['load_avg_1m']:>9.2f}")
    header = f"{'quant':<8}{'size MiB':>9}{'PPL f16':>9}{'PPL q':>9}{'KL mean':>10}{'KL p99':>9}{'top-1':>8}"
    print(f"\n{header}  ({quality[0]['tokens']} tokens)")
    for q in quality:
        print(f"{q['quant']:<8}{q['size_mib']:>9.1f}{q['ppl_f16']:>9.2f}{q['ppl_quant']:>9.2f}{q['kl_mean']:>10.5f}"
              f"{q['kl_p99']:>9.4f}{100 * q['top1_agreement']:>7.1f}%")
    out = ROOT / "bench" / "results" / "convert.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
