"""``edgerun plan MODEL --memory M``: the memory plan, without loading anything."""

from __future__ import annotations

import argparse

from runtime.bundle import ModelKind
from runtime.cli.common import print_json
from runtime.errors import BadInput
from runtime.gguf_file import read_gguf
from runtime.plan import KVType, default_budget, plan_llm
from runtime.resolve import resolve
from runtime.units import parse_size

HELP = "show how a model would use a memory budget (refuses with exit 3 if it cannot fit)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="bundle path, .gguf file, installed name[@version], or 'default'")
    parser.add_argument("--memory", metavar="SIZE", help="memory budget, e.g. 512M (default: the board profile's share of available RAM)")
    parser.add_argument("--ctx", type=int, metavar="N", help="context size in tokens")
    parser.add_argument("--kv-type", choices=[k.value for k in KVType])
    parser.add_argument("--prefix-cache", metavar="SIZE", help="bytes of saved prompt prefixes")
    parser.add_argument("--batch", type=int, default=1, help="vision/audio: rows per call (default 1)")
    parser.add_argument("--json", action="store_true", help="machine-readable fields for every term")


def main(args: argparse.Namespace) -> int:
    model = resolve(args.model)
    budget = parse_size(args.memory) if args.memory else default_budget()
    if model.manifest.kind is not ModelKind.LLM:  # classifiers: weights (+ front-end models) + arena + runtime
        from runtime.vision_plan import plan_classifier

        if args.batch < 1:
            raise BadInput(f"--batch {args.batch} is not valid: use an integer >= 1")
        spec = model.manifest.audio
        files = ["weights"] if spec is None else ["weights", *spec.frontend_files]
        size = sum(model.manifest.file(f).size if f == "weights" else (model.directory / f).stat().st_size for f in files)
        if spec is None:
            plan = plan_classifier(model.manifest, size, budget, batch=args.batch)
        else:  # as AudioClassifier.load plans it: a segment's windows and working set (input files not known here)
            from runtime.audio_classifier import SEGMENT_WINDOWS, segment_bytes

            plan = plan_classifier(model.manifest, size, budget, batch=SEGMENT_WINDOWS, input_bytes=segment_bytes(spec))
    else:
        plan = plan_llm(
            read_gguf(model.path()),
            budget,
            name=model.manifest.ref,
            ctx=args.ctx,
            kv_type=KVType(args.kv_type) if args.kv_type else None,
            prefix_cache_bytes=parse_size(args.prefix_cache, "--prefix-cache") if args.prefix_cache else None,
        )
    if args.json:
        print_json(plan.to_dict())
    else:
        print(plan.table())
    return 0
