"""``edgerun chat MODEL``: an interactive conversation on the terminal (or piped lines)."""

from __future__ import annotations

import argparse
import sys

from apps.cli.common import add_load_arguments, add_sampling_arguments, emit, load, sampling
from apps.cli.flags import utf8_problem, utf8_text
from runtime.errors import BadInput
from runtime.llm.chat import ChatSession

HELP = "chat with a model interactively (one user turn per line; /reset, /quit)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_load_arguments(parser)
    parser.add_argument("--system", type=utf8_text, help="system prompt (kept when old turns leave the context)")
    add_sampling_arguments(parser)


def main(args: argparse.Namespace) -> int:
    interactive = sys.stdin.isatty()
    if hasattr(sys.stdin, "reconfigure"):  # bytes that are not UTF-8 arrive as lone surrogates, refused per line below
        sys.stdin.reconfigure(errors="surrogateescape")
    number = 0
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
            number += 1
            text = line.rstrip("\n")
            problem = utf8_problem(text)
            if problem and interactive:  # a typing slip: say so and keep the conversation
                print(f"edgerun: that line {problem}", file=sys.stderr)
                continue
            if problem:
                raise BadInput(f"chat input line {number} {problem}")
            if text in ("/quit", "/exit"):
                break
            if text == "/reset":
                session = ChatSession(llm, args.system, params)
                continue
            if not text.strip():
                continue
            emit(session.send(text), args.json)
    return 0
