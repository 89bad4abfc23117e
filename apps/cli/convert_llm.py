"""``edgerun convert llm HF_DIR --quant Q --out BUNDLE``: flags derived from ConvertOptions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from apps.cli import flags
from converters.llm.options import ConvertOptions, Quant

HELP = "Hugging Face checkpoint -> quantized GGUF bundle with a quality report against F16"
CLI_QUANTS = [q.value for q in Quant if q != Quant.F32]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="Hugging Face folder: config.json, *.safetensors, tokenizer.json")
    parser.add_argument("--quant", required=True, choices=CLI_QUANTS, help="weight type of the bundle")
    parser.add_argument("--out", required=True, type=Path, help="bundle directory, or a transport file ending in .edgerun")
    parser.add_argument("--name", help="bundle name (default: from the checkpoint folder)")
    parser.add_argument("--version", help="bundle version (default: the quant type)")
    parser.add_argument("--license", default="unknown", help="license recorded in the manifest")
    parser.add_argument("--eval-text", type=Path, help="UTF-8 text to measure quality on (default: a text shipped with edgerun)")
    parser.add_argument(
        "--max-kl",
        type=flags.number(0, 100, "mean KL in nats"),
        help="fail when mean KL(F16 || quant) exceeds this many nats (default per quant: "
        + ", ".join(f"{q.value} {q.default_max_kl}" for q in Quant if q != Quant.F32)
        + ")",
    )
    parser.add_argument(
        "--eval-ctx",
        type=flags.integer(16, 32768, "tokens in one llama.cpp evaluation context"),
        default=256,
        help="tokens per evaluation window",
    )
    parser.add_argument("--threads", type=flags.thread_count, default=2)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def main(args: argparse.Namespace) -> int:
    from converters.llm.pipeline import convert

    result = convert(
        ConvertOptions(
            checkpoint=args.checkpoint,
            out=args.out,
            quant=Quant.parse(args.quant),
            name=args.name,
            version=args.version,
            eval_text=args.eval_text,
            max_kl=args.max_kl,
            eval_ctx=args.eval_ctx,
            threads=args.threads,
            license=args.license,
        )
    )
    q = result.report
    if args.json:
        print(json.dumps({"out": str(result.out), "ref": result.manifest.ref, "quality": q.summary(), "seconds": result.stages}, indent=2))
        return 0
    size = result.manifest.files[0].size
    print(f"{result.out}  {result.manifest.ref}  {q.quant}  {size / 2**20:.1f} MiB")
    print(
        f"  PPL f16 {q.ppl_f16:.3f}  PPL {q.quant} {q.ppl_quant:.3f}  KL mean {q.kl_mean:.5f}  p99 {q.kl_p99:.5f}"
        f"  top-1 {100 * q.top1_agreement:.1f}%  over {q.tokens} tokens (gate {q.max_kl})"
    )
    print("  " + "  ".join(f"{k} {v:.1f}s" for k, v in result.stages.items()), file=sys.stderr)
    return 0
