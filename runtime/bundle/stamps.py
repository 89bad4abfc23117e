"""Verification stamps: a full SHA-256 check once, then a stat() per run while nothing changed.

A stamp records, for each file that was hashed, its identity as stat() saw it
*before* hashing: device, inode, size, mtime_ns and ctime_ns, with the checksum
it was checked against. Any write, truncation, replacement (new inode), move of
a link's target or ``touch`` changes one of them (ctime cannot be set back by a
user), so the next run hashes again. Stamps live in the store's own folder
(``verified/``), one small JSON file per bundle directory or bare GGUF, named by
the SHA-256 of its real path: nothing is written beside the user's files, and a
store that cannot be written just means a full check on every run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from runtime.bundle.checked_open import Identity, identity, opened
from runtime.bundle.manifest import Manifest, bundle_files, hash_files
from runtime.bundle.strict_json import parse_json
from runtime.errors import BadInput

log = logging.getLogger(__name__)
MAX_STAMP_BYTES = 1 << 20  # a stamp holds a path and five numbers per file


class Stamps:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, target: Path) -> Path:
        key = hashlib.sha256(os.path.realpath(target).encode("utf-8", "surrogateescape")).hexdigest()[:32]
        return self.directory / f"{key}.json"

    def get(self, target: Path) -> Any:
        """The record stored for ``target``, or None (none, unreadable, or not ours)."""
        path = self._path(target)
        try:
            with open(path, "rb") as fh:
                data = parse_json(fh.read(MAX_STAMP_BYTES), str(path))  # bounded: deep nesting is BadInput, not RecursionError
        except (OSError, BadInput):
            return None
        if not isinstance(data, dict) or data.get("target") != os.path.realpath(target):
            return None
        return data.get("record")

    def put(self, target: Path, record: Any) -> None:
        """Store ``record`` for ``target`` atomically; a store that cannot be written is not an error."""
        path = self._path(target)
        data = json.dumps({"target": os.path.realpath(target), "record": record}).encode()
        tmp = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".stamp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            log.info("cannot keep a verification stamp in %s (%s); the next run checks every file again", self.directory, exc)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def drop(self, target: Path) -> None:
        with contextlib.suppress(OSError):
            self._path(target).unlink()


def _identities(files: dict[str, Path]) -> dict[str, Identity]:
    return {name: identity(path) for name, path in files.items()}


def _record(files: dict[str, Path], manifest: Manifest, identities: dict[str, Identity]) -> dict[str, list[Any]]:
    return {e.path: [str(files[e.path]), *identities[e.path], e.size, e.sha256] for e in manifest.files}


def check_bundle(directory: Path, manifest: Manifest, stamps: Stamps | None,
                 full: bool = False) -> tuple[dict[str, Path], dict[str, Identity]]:
    """Verify a bundle directory, hashing only when ``full`` or when a file changed since its stamp.

    Returns the real paths that were checked (:func:`runtime.bundle.manifest.bundle_files`) and the identity each
    had when checked: loaders open them through :mod:`runtime.bundle.checked_open`, which refuses any other file.
    """
    files = bundle_files(directory, manifest)  # type, place and size: every run, no reading
    identities = _identities(files)  # before hashing: a change during the hash voids the stamp and refuses the load
    record = _record(files, manifest, identities)
    if not full and stamps is not None and stamps.get(directory) == record:
        log.info("%s: unchanged since its last full check (size, mtime, ctime, inode); not hashed again", directory)
        return files, identities
    names = [e.path for e in manifest.files]
    with opened([(files[n], identities[n]) for n in names]) as paths:  # hash the very files whose identity is recorded
        hash_files(dict(zip(names, paths, strict=True)), manifest, directory)
    if stamps is not None:
        stamps.put(directory, record)
    return files, identities


def record_bundle(directory: Path, manifest: Manifest, stamps: Stamps) -> None:
    """Stamp a bundle whose files were hashed as they were written (a store install)."""
    files = bundle_files(directory, manifest)
    stamps.put(directory, _record(files, manifest, _identities(files)))
