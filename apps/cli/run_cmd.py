"""``edgerun run MODEL --prompt TEXT``: generate once, streaming to the terminal."""

from __future__ import annotations

import argparse
import sys

from apps.cli.common import SAMPLING_FLAGS, add_load_arguments, add_sampling_arguments, emit, load, refuse_flags, sampling
from apps.cli.flags import INT32_MAX, integer, utf8_text
from runtime.classify.classifier import DEFAULT_TOP_K
from runtime.errors import BadInput

HELP = "run a model: text from a prompt (LLM, streams) or labels for --input files (vision/audio)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_load_arguments(parser)
    parser.add_argument("--prompt", type=utf8_text, help="LLM: the text to continue (use 'edgerun chat' for a conversation)")
    parser.add_argument("--chat", action="store_true", default=None,  # None: not given (see refuse_flags)
                        help="LLM: wrap the prompt as one user message in the model's chat template")
    add_sampling_arguments(parser)
    parser.add_argument("--input", nargs="+", metavar="FILE", help="vision/audio: images or WAV files to classify")
    parser.add_argument("--top", type=integer(1, INT32_MAX), metavar="N",
                        help=f"vision/audio: how many labels to show per input, best first (default {DEFAULT_TOP_K})")


# Flags that apply to one kind of model only; each defaults to None, so "given" is "not None".
LLM_ONLY = ("prompt", "chat", "ctx", "kv_type", "prefix_cache", "draft", "no_speculate", *SAMPLING_FLAGS)
CLASSIFIER_ONLY = ("input", "top")


def main(args: argparse.Namespace) -> int:
    if args.prompt is None and args.input is None:
        raise BadInput("--prompt is missing or empty: give some text to continue (or --input FILE... for a classifier)")
    from runtime.bundle.manifest import ModelKind
    from runtime.bundle.resolve import resolve

    model = resolve(args.model)  # once: a .edgerun file is installed here, and the kind decides which flags apply
    if model.manifest.kind is not ModelKind.LLM:
        refuse_flags(args, LLM_ONLY, model, "it takes --input FILE... and --top N (labels to show); "
                     "context, KV cache and sampling flags are for LLMs")
        if args.input is None:
            raise BadInput(f"--input is missing: {model.manifest.ref} classifies images or WAV files, give --input FILE...")
        from apps.cli.run_classifier import main as run_classifier  # vision/audio bundles

        return run_classifier(args, model)
    refuse_flags(args, CLASSIFIER_ONLY, model, "it continues --prompt TEXT; --input and --top are for vision/audio bundles")
    if not args.prompt:
        raise BadInput("--prompt is missing or empty: give some text to continue (or --input FILE... for a classifier)")
    with load(args, model) as llm:
        params = sampling(llm, args)
        if not args.json:
            print(f"edgerun: {llm.placement.summary()}", file=sys.stderr)
        if args.chat:
            gen = llm.chat([{"role": "user", "content": args.prompt}], params)
        else:
            gen = llm.stream(args.prompt, params)
        extra = {"model": llm.model.manifest.ref, "plan": llm.plan.to_dict(), "placement": llm.placement.to_dict()}
        emit(gen, args.json, extra)
    return 0
