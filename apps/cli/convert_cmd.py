"""``edgerun convert KIND ...``: KIND is llm, vision, audio or draft; each imports only its own converter.

Every kind is always a choice. A converter whose module cannot be imported (an optional package missing)
still gets its subcommand, which takes any arguments and exits 4 with the pip line that installs it,
rather than argparse's "invalid choice".
"""

from __future__ import annotations

import argparse
import importlib

from runtime.errors import BadInput, MissingDependency, not_installed

HELP = "convert a trained model into a quantized, measured bundle (convert llm|vision|audio|draft --help)"
KINDS = {
    "llm": "apps.cli.convert_llm",
    "vision": "apps.cli.convert_vision",
    "audio": "apps.cli.convert_audio",
    "draft": "apps.cli.convert_draft",
}
EXTRAS = {"llm": "convert", "vision": "convert-vision", "audio": "convert-vision,audio", "draft": "convert"}  # pyproject's extras
OWN_PACKAGES = {"apps", "converters", "runtime", "devices"}


def unavailable(kind: str, exc: ModuleNotFoundError) -> str:
    """One line: which converter, which module is missing, and the pip line that installs it."""
    name = exc.name or "?"
    pip_line = f"pip install 'edgerun[{EXTRAS[kind]}]'"
    if name.split(".")[0] in OWN_PACKAGES:
        what = f"its module {name!r} is not part of this install; install it with: {pip_line}"
    else:
        what = str(not_installed(name.split(".")[0], pip_line))
    return f"the {kind} converter cannot be imported: {what}"


def _import(kind: str) -> tuple[object | None, str | None]:
    """The converter's CLI module, or None and why it is unavailable (a module that is not installed)."""
    try:
        return importlib.import_module(KINDS[kind]), None
    except ModuleNotFoundError as exc:
        if exc.name is None:
            raise
        return None, unavailable(kind, exc)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    for kind in KINDS:
        mod, why = _import(kind)
        if mod is not None:
            mod.add_arguments(sub.add_parser(kind, help=getattr(mod, "HELP", "")))  # type: ignore[attr-defined]
            continue
        # takes every argument as it is (no option is known, --help included), so that main gives the pip line
        stub = sub.add_parser(kind, help=f"(not available: {why})", description=why, add_help=False, prefix_chars="\0")
        stub.add_argument("args", nargs=argparse.REMAINDER)
        stub.set_defaults(unavailable=why)


def main(args: argparse.Namespace) -> int:
    if args.kind not in KINDS:
        raise BadInput(f"unknown model kind {args.kind!r}; valid: {', '.join(KINDS)}")
    if getattr(args, "unavailable", None):
        raise MissingDependency(args.unavailable)
    mod, why = _import(args.kind)
    if mod is None:
        raise MissingDependency(why)
    return int(mod.main(args) or 0)  # type: ignore[attr-defined]
