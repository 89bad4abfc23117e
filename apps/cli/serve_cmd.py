"""``edgerun serve [MODEL...]``: an OpenAI-compatible server on 127.0.0.1 (see apps/server/)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from apps.cli.flags import integer, size

HELP = "serve models over an OpenAI-compatible HTTP API (127.0.0.1:8080 unless told otherwise)"
log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="*", metavar="MODEL",
                        help="models to serve: a bundle, .gguf file, installed name or recipe, optionally NAME=REF to "
                             "choose the name clients send (default: the default model, served as 'default')")
    parser.add_argument("--memory", type=size(), metavar="SIZE", help="one memory budget for every resident model, e.g. 1G")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1; any other needs --api-key-file)")
    parser.add_argument("--port", type=integer(0, 65535), help="TCP port (default 8080; 0 picks a free one)")
    parser.add_argument("--api-key-file", metavar="FILE",
                        help="API keys, one a line, each optionally followed by the best priority it may use")
    parser.add_argument("--config", metavar="FILE", help="serve.toml: models, limits, keys, CORS, canaries, filters")
    parser.add_argument("--slots", type=integer(1, 256), metavar="N", help="LLM sequences decoded together (default 4)")
    parser.add_argument("--no-speculate", dest="speculate", action="store_false", default=None,
                        help="no speculative decoding (by default each slot drafts from its own text by prompt lookup "
                             "and verifies the draft in the step's batch, adaptively)")


def model_entry(text: str):
    """``REF`` or ``NAME=REF`` as a ModelEntry; the name of a bare REF is its store name, or its file's stem."""
    import os

    from apps.server.config import ModelEntry
    from runtime.bundle.manifest import name_from
    from runtime.bundle.store import check_ref

    name, eq, ref = text.partition("=")
    if not eq:
        ref = text
        if os.sep in ref or ref.endswith((".gguf", ".edgerun")) or os.path.exists(ref):  # a path: named by its file
            stem = ref.rstrip(os.sep).rsplit(os.sep, 1)[-1]
            name = name_from(stem.removesuffix(".gguf").removesuffix(".edgerun"))
        else:  # an installed name[@version] or a recipe
            name = ref.partition("@")[0]
    check_ref(name)
    return ModelEntry(name=name, ref=ref, pinned=True, keep_alive=-1)


def build_config(args: argparse.Namespace):
    from apps.server.config import ModelEntry, load_config
    from runtime.errors import BadInput

    cfg = load_config(args.config)
    cli = [model_entry(m) for m in args.model]
    names = {m.name for m in cli}
    if len(names) != len(cli):
        raise BadInput("the same model name is given twice; name them apart with NAME=REF")
    cfg.models = cli + [m for m in cfg.models if m.name not in names]
    if not cfg.models:
        cfg.models = [ModelEntry(name="default", ref="default", pinned=True, keep_alive=-1)]
    for flag, value in (("host", args.host), ("port", args.port), ("memory", args.memory), ("slots", args.slots),
                        ("speculate", args.speculate)):
        if value is not None:
            setattr(cfg, flag, value)
    if args.api_key_file is not None:
        from pathlib import Path

        cfg.api_keys_file = Path(args.api_key_file)
    return cfg


def main(args: argparse.Namespace) -> int:
    from apps.server.security import check_bind, load_keys

    cfg = build_config(args)
    keys = load_keys(cfg.api_keys_file)
    check_bind(cfg.host, keys)  # before anything binds: one line, exit 2
    from apps.http_limits import uvicorn_config
    from apps.server.app import create_app
    from apps.server.serving import DrainingServer, listen
    from apps.server.state import ServerState

    state = ServerState(cfg, keys)
    state.prepare()  # every model resolved and planned: a bad one is one line now, before the port is taken
    sock = listen(cfg.host, cfg.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"edgerun: serving {', '.join(m.name for m in cfg.models)} on http://{shown}:{port}/v1 "
          f"({'API key required' if keys.required else 'no API key: loopback only'}); /readyz says when loaded",
          file=sys.stderr)
    # connections capped below the descriptor limit, deadlines on headers and bodies (apps/http_limits.py)
    server = DrainingServer(uvicorn_config(create_app(state), log_level="info" if args.verbose else "warning",
                                           access_log=args.verbose, timeout_graceful_shutdown=5), state)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again: after a graceful stop either
    # one ends the command with 0, as a service manager expects.
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        server.run(sockets=[sock])
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("edgerun: server stopped", file=sys.stderr)
    return 0


class _Stop(Exception):
    """SIGTERM, raised again by uvicorn once it has shut down."""


def _stopped(signum: int, frame: object) -> None:
    raise _Stop()
