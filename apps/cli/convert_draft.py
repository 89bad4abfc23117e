"""``edgerun convert draft MODEL --out DRAFT.gguf|BUNDLE_DIR``: a draft model for self-speculation
(converters/llm/draft.py): a .gguf file attached with ``--draft``, or a copy of the bundle that carries it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from apps.cli import flags
from converters.llm.draft import DRAFT_TYPES
from converters.llm.options import Quant

HELP = "an LLM's GGUF requantized lower (q4_0) as its draft model for speculative decoding (--draft)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the target: bundle path, .gguf file, installed name[@version], or 'default'")
    parser.add_argument("--out", required=True, type=Path,
                        help="the draft's .gguf file (attach it with --draft), or a new bundle directory: the model and"
                             " its draft, loaded together (manifest llm.draft)")
    parser.add_argument("--quant", default=Quant.Q4_0.value, choices=[q.value for q in DRAFT_TYPES],
                        help="weight type of the draft (default q4_0)")
    parser.add_argument("--threads", type=flags.thread_count, default=2)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def main(args: argparse.Namespace) -> int:
    from converters.llm.draft import bundle_with_draft, make_draft
    from runtime.bundle.manifest import ModelKind
    from runtime.bundle.resolve import resolve
    from runtime.errors import BadInput

    model = resolve(args.model)
    if model.manifest.kind is not ModelKind.LLM:
        raise BadInput(f"{model.manifest.ref} is a {model.manifest.kind.value} model: a draft is made from a GGUF language model")
    quant = Quant.parse(args.quant)
    if args.out.suffix != ".gguf":
        out = bundle_with_draft(model, args.out, quant, threads=args.threads)
        if args.json:
            print(json.dumps({"out": str(out), "target": model.manifest.ref, "quant": quant.value, "bundle": True}, indent=2))
        else:
            print(f"{out}  {model.manifest.ref} with its {quant.value} draft; run it as: edgerun run {out}")
        return 0
    made = make_draft(model.path(), args.out, quant, threads=args.threads)
    if args.json:
        print(json.dumps({"out": str(made.path), "target": model.manifest.ref, "quant": made.quant.value,
                          "draft_bytes": made.draft_bytes, "target_bytes": made.target_bytes}, indent=2))
    else:
        print(f"{made.path}  draft of {model.manifest.ref}  {made.quant.value}  {made.draft_bytes / 2**20:.1f} MiB"
              f" (target {made.target_bytes / 2**20:.1f} MiB); use it with --draft {made.path}")
    return 0
