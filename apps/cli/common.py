"""Flags shared by the commands that load a model, and their translation to API calls.

Their types and bounds are in apps/cli/flags.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from apps.cli.flags import INT32_MAX, integer, sampling_value, size, thread_count, utf8_text
from runtime.errors import BadInput
from runtime.llm.plan import CTX_PAD, MIN_CTX, KVType

MAX_CTX = INT32_MAX // CTX_PAD * CTX_PAD  # llama.cpp pads n_ctx up to 256 cells: the padded count must stay an int32


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="bundle path, .gguf file, installed name[@version], or 'default'")
    parser.add_argument("--memory", type=size(), metavar="SIZE",
                        help="memory budget, e.g. 512M or 1.5G, at most 256T (default: the board profile's share of available RAM)")
    add_llm_plan_arguments(parser, "(default: largest that fits, up to 8192)")
    parser.add_argument("--no-speculate", action="store_true", default=None,  # None: not given (see refuse_flags)
                        help="LLM: plain decoding, one token per step (default: speculative decoding, drafts by prompt"
                             " lookup verified in one batch; it switches itself off where it does not pay)")
    parser.add_argument("--threads", type=thread_count, metavar="N",
                        help="CPU threads, 1 to 4 x the logical CPUs (default: from the device and its load)")
    parser.add_argument("--target", default="auto", help="cpu, gpu, npu or auto (default: auto)")
    parser.add_argument("--require-accelerator", action="store_true", help="fail instead of falling back to the CPU")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def add_llm_plan_arguments(parser: argparse.ArgumentParser, ctx_default: str = "") -> None:
    """LLM-only planning flags (``run``, ``chat``, ``plan``). Default None: None means 'not given'."""
    parser.add_argument("--ctx", type=integer(MIN_CTX, MAX_CTX, "llama.cpp's int32 cell count"), metavar="N",
                        help=f"LLM: context size in tokens {ctx_default}".rstrip())
    parser.add_argument("--kv-type", choices=[k.value for k in KVType], help="LLM: KV cache type (default: f16 if it fits, else q8_0)")
    parser.add_argument("--prefix-cache", type=size(minimum=0), metavar="SIZE",
                        help="LLM: bytes of saved prompt prefixes, 0 for none (default: 1/16 of the budget, at most 64M)")
    parser.add_argument("--draft", metavar="MODEL",
                        help="LLM: a draft model for speculative decoding instead of prompt lookup: the same model at a"
                             " lower quantization (edgerun convert draft MODEL --out DRAFT.gguf) or a smaller one with"
                             " its vocabulary; planned beside it")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=sampling_value("max_tokens"), metavar="N",
                        help="LLM: tokens to generate at most (default 256)")
    parser.add_argument("--seed", type=sampling_value("seed"), metavar="N",
                        help="LLM: random seed: the same seed gives the same text (default: a fresh one, reported with --json)")
    parser.add_argument("--temperature", type=sampling_value("temperature"), metavar="T", help="LLM: 0 is greedy (default: the bundle's)")
    parser.add_argument("--top-k", type=sampling_value("top_k"), metavar="N", help="LLM: sample from the N likeliest tokens (0: all)")
    parser.add_argument("--top-p", type=sampling_value("top_p"), metavar="P", help="LLM: nucleus sampling, in (0, 1]")
    parser.add_argument("--min-p", type=sampling_value("min_p"), metavar="P", help="LLM: drop tokens below P x the likeliest, in [0, 1)")
    parser.add_argument("--repeat-penalty", type=sampling_value("repeat_penalty"), metavar="X", help="LLM: > 0, 1 disables")
    parser.add_argument("--stop", action="append", type=utf8_text, metavar="TEXT", help="LLM: stop before this text (repeatable)")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE",
                       help="LLM: the answer is JSON valid against this JSON Schema (decoding is constrained to it)")
    shape.add_argument("--grammar", metavar="FILE", help="LLM: the answer follows this GBNF grammar (llama.cpp's format)")


SAMPLING_FLAGS = ("max_tokens", "seed", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "stop", "json_schema",
                  "grammar")
MAX_SHAPE_FILE_BYTES = 256 * 1024  # a --json-schema or --grammar file (the grammar it makes is bounded again)


def _shape_text(path: str, flag: str) -> str:
    from runtime.files import open_regular

    with open_regular(path, f"{flag} file") as fh:
        data = fh.read(MAX_SHAPE_FILE_BYTES + 1)
    if len(data) > MAX_SHAPE_FILE_BYTES:
        raise BadInput(f"{flag} {path}: over {MAX_SHAPE_FILE_BYTES} bytes; a schema or grammar is a small text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{flag} {path}: not UTF-8 text") from None


def grammar_flag(args: argparse.Namespace):
    """The grammar ``--json-schema FILE`` or ``--grammar FILE`` asks for, or None."""
    if getattr(args, "json_schema", None) is not None:
        from runtime.llm.json_schema import schema_grammar

        try:
            schema = json.loads(_shape_text(args.json_schema, "--json-schema"))
        except (ValueError, RecursionError) as exc:
            raise BadInput(f"--json-schema {args.json_schema}: not JSON ({str(exc)[:120]})") from None
        return schema_grammar(schema, f"--json-schema {args.json_schema}")
    if getattr(args, "grammar", None) is not None:
        from runtime.llm.grammar import gbnf

        return gbnf(_shape_text(args.grammar, "--grammar"), f"--grammar {args.grammar}")
    return None


def refuse_flags(args: argparse.Namespace, dests: tuple[str, ...], model: Any, reason: str) -> None:
    """Refuse the flags among ``dests`` that were given (their value is not None): they do not apply to ``model``.

    Each of these flags defaults to None, so "given" is never confused with "given the default value".
    """
    given = ["--" + d.replace("_", "-") for d in dests if getattr(args, d, None) is not None]
    if given:
        what = model.manifest.kind.noun
        verb = "does" if len(given) == 1 else "do"
        raise BadInput(f"{', '.join(given)} {verb} not apply to {model.manifest.ref}, {what}: {reason}")


def load(args: argparse.Namespace, model: Any = None):
    """The LLM named by ``args.model`` (or the already resolved ``model``), with the load flags."""
    from runtime.llm.model import LLM

    speculate = not getattr(args, "no_speculate", None)
    if not speculate and getattr(args, "draft", None):
        raise BadInput("--draft drafts for speculative decoding, which --no-speculate turns off: give one of them")
    return LLM.load(
        args.model if model is None else model,
        memory=args.memory,
        ctx=args.ctx,
        kv_type=args.kv_type,
        threads=args.threads,
        target=args.target,
        require_accelerator=args.require_accelerator,
        prefix_cache_bytes=args.prefix_cache,
        draft=args.draft,
        speculate=speculate,
    )


def sampling(llm, args: argparse.Namespace):
    """The sampling flags as ``llm``'s params, a --json-schema or --grammar compiled (refused before any output)."""
    return llm.check_params(llm.params(
        max_tokens=args.max_tokens,
        seed=args.seed,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        stop=tuple(args.stop) if args.stop else None,
        grammar=grammar_flag(args),
    ))


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
