"""``edgerun chat MODEL``: an interactive conversation on the terminal (or piped lines)."""

from __future__ import annotations

import argparse
import sys

from runtime.chat import ChatSession
from runtime.cli.common import add_load_arguments, add_sampling_arguments, emit, load, sampling

HELP = "chat with a model interactively (one user turn per line; /reset, /quit)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_load_arguments(parser)
    parser.add_argument("--system", help="system prompt (kept when old turns leave the context)")
    add_sampling_arguments(parser)


def main(args: argparse.Namespace) -> int:
    interactive = sys.stdin.isatty()
    with load(args) as llm:
        params = sampling(llm, args)
        session = ChatSession(llm, args.system, params)
        print(f"edgerun: {llm.placement.summary()}", file=sys.stderr)
        if interactive:
            print(f"{llm.model.manifest.ref}: {llm.n_ctx}-token context. /reset starts over, /quit or Ctrl-D ends.", file=sys.stderr)
        while True:
            if interactive:
                sys.stderr.write("> ")
                sys.stderr.flush()
            line = sys.stdin.readline()
            if not line:
                break
            text = line.rstrip("\n")
            if text in ("/quit", "/exit"):
                break
            if text == "/reset":
                session = ChatSession(llm, args.system, params)
                continue
            if not text.strip():
                continue
            emit(session.send(text), args.json)
    return 0
