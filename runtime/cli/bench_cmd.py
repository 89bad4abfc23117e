"""``edgerun bench BUNDLE``: latency p50/p99 at 1 and 2 threads, batched throughput, and the placement.

Inputs are the bundle's own sample-shaped tensors (zeros after quantization
do not exercise anything different from images on these CNN runtimes; a fixed
random image in model layout is used so every run sees the same work).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from runtime.cli.common import print_json
from runtime.errors import BadInput

HELP = "measure a vision bundle: latency p50/p99 at 1 and 2 threads, throughput with batching, placement"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="bundle path or installed name[@version]")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], metavar="N", help="thread counts to measure (default 1 2)")
    parser.add_argument("--runs", type=int, default=50, help="timed runs per setting (default 50)")
    parser.add_argument("--batch", type=int, default=8, help="batch size for the throughput run (default 8)")
    parser.add_argument("--target", default="auto", help="cpu, gpu, npu or auto (default: auto)")
    parser.add_argument("--require-accelerator", action="store_true")
    parser.add_argument("--json", action="store_true")


def measure(ref: str, threads: int, runs: int, batch: int, target: str = "auto", require_accelerator: bool = False) -> dict[str, Any]:
    from runtime import preprocess
    from runtime.classifier import Classifier

    with Classifier.load(ref, threads=threads, target=target, require_accelerator=require_accelerator, batch=batch) as clf:
        spec = clf.spec
        rgb = np.random.default_rng(0).integers(0, 256, (batch, spec.size, spec.size, 3), dtype=np.uint8)
        x = preprocess.quantize(preprocess.normalize(rgb, spec), spec.input)
        one = clf.latency(x[:1], runs)
        many = clf.latency(x, max(5, runs // batch))
        return {
            "model": clf.model.manifest.ref,
            "threads": threads,
            "p50_ms": float(np.percentile(one, 50) * 1000),
            "p99_ms": float(np.percentile(one, 99) * 1000),
            "batch": batch,
            "throughput_per_s": float(batch / np.median(many)),
            "placement": clf.placement.to_dict(),
            "summary": clf.placement.summary(),
        }


def main(args: argparse.Namespace) -> int:
    if args.runs < 1 or args.batch < 1 or any(t < 1 for t in args.threads):
        raise BadInput(f"--runs {args.runs}, --batch {args.batch} and --threads {args.threads} must be positive")
    rows = [measure(args.model, t, args.runs, args.batch, args.target, args.require_accelerator) for t in args.threads]
    if args.json:
        print_json({"model": rows[0]["model"], "results": rows})
        return 0
    print(f"edgerun: {rows[0]['summary']}", file=sys.stderr)
    print(f"{rows[0]['model']}")
    print(f"  {'threads':>7} {'p50 ms':>8} {'p99 ms':>8} {'batch':>5} {'img/s':>8}")
    for r in rows:
        print(f"  {r['threads']:>7} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['batch']:>5} {r['throughput_per_s']:>8.1f}")
    return 0
