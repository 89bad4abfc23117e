"""``edgerun plan MODEL --memory M``: the memory plan, without loading anything."""

from __future__ import annotations

import argparse

from apps.cli.common import add_llm_plan_arguments, print_json, refuse_flags
from apps.cli.flags import MAX_BATCH, integer, size
from runtime.bundle.manifest import ModelKind
from runtime.bundle.resolve import resolve
from runtime.formats.gguf_file import read_gguf
from runtime.llm.draft import resolve_draft
from runtime.llm.plan import MAX_SLOTS, KVType, default_budget, plan_llm

HELP = "show how a model would use a memory budget (refuses with exit 3 if it cannot fit)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="bundle path, .gguf file, installed name[@version], or 'default'")
    parser.add_argument("--memory", type=size(), metavar="SIZE",
                        help="memory budget, e.g. 512M, at most 256T (default: the board profile's share of available RAM)")
    add_llm_plan_arguments(parser)
    parser.add_argument("--slots", type=integer(1, MAX_SLOTS, "sequences one context decodes together"), metavar="N",
                        help="LLM: requests served at once (edgerun serve); the KV cache is split between them, --ctx is"
                             " per slot (default 1)")
    parser.add_argument("--batch", type=integer(1, MAX_BATCH), metavar="N", help="vision: rows per call (default 1)")
    parser.add_argument("--json", action="store_true", help="machine-readable fields for every term")


def main(args: argparse.Namespace) -> int:
    model = resolve(args.model)
    budget = args.memory or default_budget()
    kind = model.manifest.kind
    if kind is ModelKind.LLM:
        refuse_flags(args, ("batch",), model, "an LLM decodes --slots sequences together; --batch is for vision bundles")
    else:
        refuse_flags(args, ("ctx", "kv_type", "prefix_cache", "slots", "draft"), model,
                     "context, KV cache, prefix cache, slots and draft models are an LLM's")
    if kind is ModelKind.AUDIO:
        refuse_flags(args, ("batch",), model, "an audio bundle is planned per segment of its input, not per batch")
    if kind is not ModelKind.LLM:  # classifiers: weights (+ front-end models) + arena + runtime
        from runtime.classify.plan import plan_classifier

        spec = model.manifest.audio
        files = ["weights"] if spec is None else ["weights", *spec.frontend_files]
        model_bytes = sum(model.manifest.file(f).size if f == "weights" else model.file(f).stat().st_size for f in files)
        if kind is ModelKind.ANOMALY:  # as AnomalyDetector.load plans it: the memory bank and the distance search too
            from runtime.classify.anomaly import plan_anomaly

            plan = plan_anomaly(model.manifest, budget, batch=args.batch or 1)
        elif spec is None:
            plan = plan_classifier(model.manifest, model_bytes, budget, batch=args.batch or 1)
        else:  # as AudioClassifier.load plans it: a segment's windows and working set (input files not known here)
            from runtime.classify.audio_classifier import SEGMENT_WINDOWS, segment_bytes

            plan = plan_classifier(model.manifest, model_bytes, budget, batch=SEGMENT_WINDOWS, input_bytes=segment_bytes(spec))
    else:
        draft_path, draft_name = None, ""
        if args.draft:
            draft = resolve_draft(args.draft)
            draft_path, draft_name = draft.path(), draft.manifest.ref
        elif model.manifest.llm is not None and model.manifest.llm.draft and (args.slots or 1) == 1:  # the bundle's own
            draft_path, draft_name = model.file(model.manifest.llm.draft), f"{model.manifest.ref}/{model.manifest.llm.draft}"
        plan = plan_llm(
            read_gguf(model.path()),
            budget,
            name=model.manifest.ref,
            ctx=args.ctx,
            kv_type=KVType(args.kv_type) if args.kv_type else None,
            prefix_cache_bytes=args.prefix_cache,
            slots=args.slots or 1,
            draft=read_gguf(draft_path) if draft_path else None,
            draft_name=draft_name,
        )
    if args.json:
        print_json(plan.to_dict())
    else:
        print(plan.table())
    return 0
