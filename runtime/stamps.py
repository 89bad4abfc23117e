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

from runtime.bundle import Manifest, bundle_files, hash_files

log = logging.getLogger(__name__)


def identity(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


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
                data = json.loads(fh.read(1 << 20))
        except (OSError, ValueError):
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


def _record(files: dict[str, Path], manifest: Manifest) -> dict[str, list[Any]]:
    return {e.path: [str(files[e.path]), *identity(files[e.path]), e.size, e.sha256] for e in manifest.files}


def check_bundle(directory: Path, manifest: Manifest, stamps: Stamps | None, full: bool = False) -> dict[str, Path]:
    """Verify a bundle directory, hashing only when ``full`` or when a file changed since its stamp.

    Returns the real paths that were checked (:func:`runtime.bundle.bundle_files`): load those.
    """
    files = bundle_files(directory, manifest)  # type, place and size: every run, no reading
    record = _record(files, manifest)  # identities before hashing: a change during the hash voids the stamp
    if not full and stamps is not None and stamps.get(directory) == record:
        log.info("%s: unchanged since its last full check (size, mtime, ctime, inode); not hashed again", directory)
        return files
    hash_files(files, manifest, directory)
    if stamps is not None:
        stamps.put(directory, record)
    return files


def record_bundle(directory: Path, manifest: Manifest, stamps: Stamps) -> None:
    """Stamp a bundle whose files were hashed as they were written (a store install)."""
    stamps.put(directory, _record(bundle_files(directory, manifest), manifest))
