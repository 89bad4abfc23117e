"""Flags shared by the commands that load a model, and their translation to API calls."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from runtime.plan import KVType
from runtime.units import parse_size


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="bundle path, .gguf file, installed name[@version], or 'default'")
    parser.add_argument("--memory", metavar="SIZE", help="memory budget, e.g. 512M or 1.5G (default: the board profile's share of available RAM)")
    parser.add_argument("--ctx", type=int, metavar="N", help="context size in tokens (default: largest that fits, up to 8192)")
    parser.add_argument("--kv-type", choices=[k.value for k in KVType], help="KV cache type (default: f16 if it fits, else q8_0)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: from the device and its load)")
    parser.add_argument("--target", default="auto", help="cpu, gpu, npu or auto (default: auto)")
    parser.add_argument("--require-accelerator", action="store_true", help="fail instead of falling back to the CPU")
    parser.add_argument("--prefix-cache", metavar="SIZE", help="bytes of saved prompt prefixes (default: 1/16 of the budget, at most 64M)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, help="tokens to generate at most (default 256)")
    parser.add_argument("--seed", type=int, help="random seed: the same seed gives the same text (default 0)")
    parser.add_argument("--temperature", type=float, help="0 is greedy (default: the bundle's)")
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--min-p", type=float)
    parser.add_argument("--repeat-penalty", type=float)
    parser.add_argument("--stop", action="append", metavar="TEXT", help="stop before this text (repeatable)")


def load(args: argparse.Namespace):
    from runtime.llm import LLM

    if args.threads is not None and args.threads < 1:
        from runtime.errors import BadInput

        raise BadInput(f"--threads {args.threads} is not valid: use an integer >= 1")
    return LLM.load(
        args.model,
        memory=parse_size(args.memory) if args.memory else None,
        ctx=args.ctx,
        kv_type=args.kv_type,
        threads=args.threads,
        target=args.target,
        require_accelerator=args.require_accelerator,
        prefix_cache_bytes=parse_size(args.prefix_cache, "--prefix-cache") if args.prefix_cache else None,
    )


def sampling(llm, args: argparse.Namespace):
    return llm.params(
        max_tokens=args.max_tokens,
        seed=args.seed,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        stop=tuple(args.stop) if args.stop else None,
    )


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def emit(gen, as_json: bool, extra: dict[str, Any] | None = None):
    """Stream a generation's text to stdout (or, with --json, print one object at the end).

    Truncations are reported on stderr in text mode and in the object in JSON mode.
    """
    for piece in gen:
        if not as_json:
            sys.stdout.write(piece)
            sys.stdout.flush()
    result = gen.result
    assert result is not None
    if as_json:
        print_json({**result.to_dict(), **(extra or {})})
    else:
        sys.stdout.write("\n")
        for t in result.truncations:
            what = f"{t.tokens_dropped} tokens" + (f", {t.messages_dropped} messages" if t.messages_dropped else "")
            print(f"edgerun: context full ({t.kind}): {what} dropped", file=sys.stderr)
    return result
