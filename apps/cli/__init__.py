"""The ``edgerun`` command: one dispatcher, each subcommand imported only when it runs.

A subcommand module exposes ``HELP`` (one line), ``add_arguments(parser)`` and
``main(args) -> int``. Data goes to stdout, logs and errors to stderr. Exit codes
(``exit_code`` of runtime.errors' classes, and the dispatcher's own):
0 ok, 1 other edgerun error, 2 bad input, 3 does not fit the memory budget,
4 missing optional package, 5 placement refused, 6 backend failure,
7 conversion failed its quality gate, 8 queue full, 9 deadline exceeded,
10 cancelled, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from runtime.errors import EdgerunError, one_line

# name -> module; modules are imported only when their command runs.
COMMANDS: dict[str, str] = {
    "run": "apps.cli.run_cmd",
    "chat": "apps.cli.chat_cmd",
    "plan": "apps.cli.plan_cmd",
    "inspect": "apps.cli.inspect_cmd",
    "install": "apps.cli.store_cmd",
    "list": "apps.cli.store_cmd",
    "remove": "apps.cli.store_cmd",
    "rollback": "apps.cli.store_cmd",
    "pack": "apps.cli.store_cmd",
    "convert": "apps.cli.convert_cmd",
    "bench": "apps.cli.bench_cmd",
    "verify": "apps.cli.verify_cmd",
    "doctor": "apps.cli.doctor_cmd",
    "serial-peer": "apps.cli.serial_peer_cmd",
    "serve": "apps.cli.serve_cmd",
    "loadtest": "apps.cli.loadtest_cmd",
    "kiosk": "apps.cli.kiosk_cmd",
    "voice": "apps.cli.voice_cmd",
    "wyoming": "apps.cli.wyoming_cmd",
}


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line: the flag, the value, what is valid (usage is one --help away)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {one_line(message, None, escape=True)} (see {self.prog} --help)\n")


def _usage() -> str:
    lines = ["usage: edgerun COMMAND [options]   (edgerun COMMAND --help for a command's options)", "", "commands:"]
    for name, module in COMMANDS.items():
        lines.append(f"  {name:<12} {_help_line(name, module)}")
    return "\n".join(lines)


def _help_line(name: str, module: str) -> str:
    try:
        mod = importlib.import_module(module)
    except ImportError:  # a command whose module is absent in this install
        return "(not available in this install)"
    helps = getattr(mod, "HELPS", None)
    return helps[name] if helps and name in helps else getattr(mod, "HELP", "")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        try:
            print(_usage())
        except BrokenPipeError:  # `edgerun --help | head`
            pass
        return 0 if argv else 2
    name = argv.pop(0)
    if name not in COMMANDS:
        print(f"edgerun: unknown command {name!r}; valid commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        mod = importlib.import_module(COMMANDS[name])
    except ModuleNotFoundError as exc:
        if not (exc.name and COMMANDS[name].startswith(exc.name)):
            raise
        print(f"edgerun: the {name!r} command is not part of this install", file=sys.stderr)
        return 4
    parser = _Parser(prog=f"edgerun {name}", description=_help_line(name, COMMANDS[name]))
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    if hasattr(mod, "add_command_arguments"):
        mod.add_command_arguments(name, parser)
    else:
        mod.add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0), or a bad flag (2, its one line already printed): returned, for in-process callers
        return int(exc.code or 0)
    args.command = name
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="edgerun: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(mod.main(args) or 0)
    except EdgerunError as exc:
        # the last guard of "one line per error": a backend's multi-line message, or a name with a newline or a
        # terminal escape in it, cannot break it
        print(f"edgerun: {one_line(str(exc), None, escape=True)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("edgerun: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
