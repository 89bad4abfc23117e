"""``edgerun convert KIND ...``: KIND is llm, vision or audio; each imports only its own converter."""

from __future__ import annotations

import argparse
import importlib

from runtime.errors import BadInput, MissingDependency

HELP = "convert a trained model into a quantized, measured bundle (convert llm|vision|audio --help)"
KINDS = {
    "llm": "converters.llm.cli",
    "vision": "converters.vision.cli",
    "audio": "converters.audio.cli",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    for kind, module in KINDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
                continue  # this converter is not in this install
            raise
        mod.add_arguments(sub.add_parser(kind, help=getattr(mod, "HELP", "")))


def main(args: argparse.Namespace) -> int:
    if args.kind not in KINDS:
        raise BadInput(f"unknown model kind {args.kind!r}; valid: {', '.join(KINDS)}")
    try:
        mod = importlib.import_module(KINDS[args.kind])
    except ModuleNotFoundError as exc:
        raise MissingDependency(f"the {args.kind} converter is not available: {exc}") from None
    return int(mod.main(args) or 0)
