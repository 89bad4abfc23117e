"""Store commands: install, list, remove, rollback, pack."""

from __future__ import annotations

import argparse
from pathlib import Path

from apps.cli.common import print_json
from apps.cli.terminal import printable
from runtime.bundle.store import Store, check_pack_out, pack, parse_ref
from runtime.errors import BadInput
from runtime.units import fmt_bytes

HELPS = {
    "install": "verify a bundle's checksums and install it atomically into the model store",
    "list": "list installed models and versions (* marks the current one)",
    "remove": "remove NAME (every version) or NAME@VERSION from the store",
    "rollback": "make the previously current version of NAME current again",
    "pack": "write the single-file transport form (.edgerun) of a bundle directory or model",
}


def add_command_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "install":
        parser.add_argument("bundle", help="a .edgerun file or a bundle directory")
    elif name in ("remove", "rollback"):
        parser.add_argument("model", help="NAME" + (" or NAME@VERSION" if name == "remove" else ""))
    elif name == "pack":
        parser.add_argument("model", help="bundle directory, installed name[@version], or .gguf")
        parser.add_argument("--out", required=True, help="output file (.edgerun)")
    parser.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    store = Store()
    cmd = args.command
    if cmd == "install":
        installed = store.install(Path(args.bundle))
        out = {"installed": installed.ref, "directory": str(installed.directory)}
        print_json(out) if args.json else print(f"installed {installed.ref}")
    elif cmd == "list":
        rows = store.list()
        if args.json:
            print_json(
                [
                    {
                        "name": r.manifest.name,
                        "version": r.manifest.version,
                        "current": r.current,
                        "kind": r.manifest.kind.value,
                        "size_bytes": sum(f.size for f in r.manifest.files),
                        "license": r.manifest.license,
                    }
                    for r in rows
                ]
            )
        elif not rows:
            print(f"no models installed in {store.root} (the first 'edgerun run default' builds the default one)")
        for r in rows if not args.json else ():
            size = fmt_bytes(sum(f.size for f in r.manifest.files))
            terms = printable(r.manifest.license)  # the bundle author's text: no escape sequence reaches the terminal
            mark = "*" if r.current else " "
            print(f"{mark} {r.manifest.name:<28} {r.manifest.version:<20} {r.manifest.kind.value:<6} {size:>10}  {terms}")
    elif cmd == "remove":
        name, version = parse_ref(args.model)  # "name@" is refused, not read as every version
        removed = store.remove(name, version)
        print_json({"removed": [f"{name}@{v}" for v in removed]}) if args.json else print(
            "removed " + ", ".join(f"{name}@{v}" for v in removed)
        )
    elif cmd == "rollback":
        if "@" in args.model:
            raise BadInput(f"rollback takes a model NAME, not {args.model!r}")
        current = store.rollback(args.model)
        print_json({"current": current.ref}) if args.json else print(f"{args.model}: current version is now {current.manifest.version}")
    elif cmd == "pack":
        from runtime.bundle.resolve import resolve

        out = Path(args.out)
        check_pack_out(out)  # before resolving, which may build the model
        model = resolve(args.model)
        if model.origin == "gguf":
            raise BadInput(f"{args.model} is a bare GGUF; install or wrap it in a bundle directory first")
        pack(model.directory, out)
        print_json({"packed": model.manifest.ref, "out": str(out)}) if args.json else print(f"wrote {out}")
    return 0
