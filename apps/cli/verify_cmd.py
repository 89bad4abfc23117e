"""``edgerun verify MODEL``: a full SHA-256 check of every file, whatever the stamps say.

A run hashes a model once and then trusts a stamp while stat() shows its files
unchanged (runtime/bundle/stamps.py). ``verify`` is the forced check: after a restore
from backup, on a suspect SD card, or before shipping. A ``.edgerun`` file is
checked member by member against its manifest without being installed.
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from apps.cli.common import print_json
from runtime.bundle.manifest import EXTENSION
from runtime.bundle.resolve import resolve
from runtime.bundle.store import check_transport

HELP = "check every file of a model against its SHA-256 now (runs trust a stamp while files are unchanged)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="bundle directory, .edgerun file, .gguf file, or installed name[@version]")
    parser.add_argument("--json", action="store_true")


def _is_transport(ref: str) -> bool:
    try:
        return ref.endswith(EXTENSION) and stat.S_ISREG(os.stat(ref).st_mode)
    except OSError:
        return False


def main(args: argparse.Namespace) -> int:
    if _is_transport(args.model):
        manifest, where = check_transport(Path(args.model)), args.model
    else:
        model = resolve(args.model, full_check=True)
        manifest, where = model.manifest, str(model.directory)
    size = sum(f.size for f in manifest.files)
    if args.json:
        print_json({"verified": manifest.ref, "location": where, "files": len(manifest.files), "bytes": size})
    else:
        print(f"{manifest.ref}: {len(manifest.files)} file(s), {size} bytes, every SHA-256 matches ({where})")
    return 0
