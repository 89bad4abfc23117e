"""``edgerun run MODEL --prompt TEXT``: generate once, streaming to the terminal."""

from __future__ import annotations

import argparse
import sys

from runtime.cli.common import add_load_arguments, add_sampling_arguments, emit, load, sampling
from runtime.errors import BadInput

HELP = "run a model: text from a prompt (LLM, streams) or labels for --input files (vision/audio)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_load_arguments(parser)
    parser.add_argument("--prompt", help="LLM: the text to continue (use 'edgerun chat' for a conversation)")
    parser.add_argument("--input", nargs="+", metavar="FILE", help="vision/audio: images or WAV files to classify")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as one user message in the model's chat template")
    add_sampling_arguments(parser)


def main(args: argparse.Namespace) -> int:
    if args.input is not None:
        from runtime.cli.run_classifier import main as run_classifier  # vision/audio bundles

        return run_classifier(args)
    if not args.prompt:
        raise BadInput("--prompt is missing or empty: give some text to continue (or --input FILE... for a classifier)")
    with load(args) as llm:
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
