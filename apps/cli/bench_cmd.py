"""``edgerun bench BUNDLE``: latency p50/p99 at 1 and 2 threads, batched throughput, and the placement.

LLM: prefill and decode tokens/s per thread count as llama-bench reports them, and decode with and without
speculation (apps/cli/bench_llm.py).
Vision: a fixed random image in model layout, so every run sees the same work.
Audio: two seconds of fixed noise through the bundle's front end gives the
windows the model is timed on; the front end's own cost is reported per second
of audio (for wake-word detectors it, not the head, sets the real-time factor).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from apps.cli.common import print_json, refuse_flags
from apps.cli.flags import MAX_BATCH, MAX_RUNS, integer, size, thread_count
from runtime.errors import BadInput
from runtime.llm.plan import CTX_PAD, DEFAULT_MAX_CTX
from runtime.metrics import PercentileMethod, percentile

HELP = ("measure a model: an LLM's prefill/decode tokens/s per thread count (llama-bench's pp/tg) and speculation; "
        "a vision or audio bundle's latency p50/p99, throughput with batching, placement")
RUNS = {"llm": 3, "classifier": 50}
BATCH = 8
MAX_BENCH_TOKENS = DEFAULT_MAX_CTX - CTX_PAD  # prompt + generated tokens share one context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="bundle path or installed name[@version]")
    parser.add_argument("--threads", type=thread_count, nargs="+", default=[1, 2], metavar="N",
                        help="thread counts to measure, each 1 to 4 x the logical CPUs (default 1 2)")
    parser.add_argument("--runs", type=integer(1, MAX_RUNS), metavar="N",
                        help=f"timed runs per setting (default {RUNS['classifier']}; LLM: {RUNS['llm']})")
    parser.add_argument("--batch", type=integer(1, MAX_BATCH), metavar="N",
                        help=f"vision/audio: batch size for the throughput run (default {BATCH})")
    tokens = integer(0, MAX_BENCH_TOKENS, "0 skips the test; prompt and generated tokens share one context")
    parser.add_argument("--prompt-tokens", type=tokens, metavar="N", help="LLM: prompt tokens of the prefill test ppN (default 512)")
    parser.add_argument("--gen-tokens", type=tokens, metavar="N", help="LLM: tokens of the decode test tgN (default 128)")
    parser.add_argument("--memory", type=size(), metavar="SIZE", help="LLM: memory budget (default: the board profile's share)")
    parser.add_argument("--draft", metavar="MODEL", help="LLM: speculation row with this draft model instead of prompt lookup")
    parser.add_argument("--target", default="auto", help="cpu, gpu, npu or auto (default: auto)")
    parser.add_argument("--require-accelerator", action="store_true")
    parser.add_argument("--json", action="store_true")


def _main_llm(args: argparse.Namespace, model: Any) -> int:
    from apps.cli import bench_llm

    refuse_flags(args, ("batch",), model, "it takes --prompt-tokens, --gen-tokens, --runs and --threads; --batch is for vision/audio")
    prompt = 512 if args.prompt_tokens is None else args.prompt_tokens
    gen = 128 if args.gen_tokens is None else args.gen_tokens
    if prompt + gen > MAX_BENCH_TOKENS:
        raise BadInput(f"--prompt-tokens {prompt} + --gen-tokens {gen} is over {MAX_BENCH_TOKENS}: "
                       "they share one context; give at most that many in all")
    report = bench_llm.measure(model, list(args.threads), prompt, gen, args.runs or RUNS["llm"], memory=args.memory,
                               target=args.target, require_accelerator=args.require_accelerator, draft=args.draft)
    if args.json:
        print_json(report)
    else:
        bench_llm.print_report(report)
    return 0


def measure(ref: Any, threads: int, runs: int, batch: int, target: str = "auto", require_accelerator: bool = False) -> dict[str, Any]:
    import time

    from runtime.bundle.manifest import ModelKind
    from runtime.bundle.resolve import resolve
    from runtime.classify import preprocess
    from runtime.classify.classifier import Classifier

    resolved = resolve(ref) if isinstance(ref, str) else ref
    extra: dict[str, Any] = {}
    if resolved.manifest.kind is ModelKind.AUDIO:
        from runtime.classify.audio_classifier import AudioClassifier

        clf: Any = AudioClassifier.load(str(resolved.directory), threads=threads, target=target,
                                        require_accelerator=require_accelerator, batch=batch)
    else:
        clf = Classifier.load(str(resolved.directory), threads=threads, target=target, require_accelerator=require_accelerator,
                              batch=batch)
    with clf:
        spec = clf.spec
        rng = np.random.default_rng(0)
        if resolved.manifest.kind is ModelKind.AUDIO:
            audio = (0.1 * rng.standard_normal(2 * spec.sample_rate)).astype(np.float32)
            start = time.perf_counter()
            windows = clf.frontend.windows(audio, spec.sample_rate).x
            extra["frontend_ms_per_audio_s"] = (time.perf_counter() - start) * 1000 / 2
            x = preprocess.quantize(np.resize(windows, (batch, *windows.shape[1:])), spec.input)
        else:
            rgb = rng.integers(0, 256, (batch, spec.size, spec.size, 3), dtype=np.uint8)
            x = preprocess.quantize(preprocess.normalize(rgb, spec), spec.input)
        one = clf.latency(x[:1], runs)
        many = clf.latency(x, max(5, runs // batch))
        return {
            **extra,
            "model": clf.model.manifest.ref,
            "threads": threads,
            "p50_ms": percentile(one, 50, method=PercentileMethod.LINEAR) * 1000,
            "p99_ms": percentile(one, 99, method=PercentileMethod.LINEAR) * 1000,
            "batch": batch,
            "throughput_per_s": float(batch / np.median(many)),
            "placement": clf.placement.to_dict(),
            "summary": clf.placement.summary(),
        }


def main(args: argparse.Namespace) -> int:
    from runtime.bundle.manifest import ModelKind
    from runtime.bundle.resolve import resolve

    model = resolve(args.model)
    if model.manifest.kind is ModelKind.LLM:
        return _main_llm(args, model)
    refuse_flags(args, ("prompt_tokens", "gen_tokens", "memory", "draft"), model,
                 "it takes --runs, --batch and --threads; --prompt-tokens, --gen-tokens, --memory and --draft are for LLMs")
    runs, batch = args.runs or RUNS["classifier"], args.batch or BATCH
    rows = [measure(model, t, runs, batch, args.target, args.require_accelerator) for t in args.threads]
    if args.json:
        print_json({"model": rows[0]["model"], "results": rows})
        return 0
    print(f"edgerun: {rows[0]['summary']}", file=sys.stderr)
    print(f"{rows[0]['model']}")
    print(f"  {'threads':>7} {'p50 ms':>8} {'p99 ms':>8} {'batch':>5} {'rows/s':>8}")
    for r in rows:
        print(f"  {r['threads']:>7} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['batch']:>5} {r['throughput_per_s']:>8.1f}"
              + (f"   front end {r['frontend_ms_per_audio_s']:.1f} ms per second of audio" if "frontend_ms_per_audio_s" in r else ""))
    return 0
