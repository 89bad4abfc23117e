"""Reading files a user or a bundle names: regular files only, never a blocking open, hashed in bounded reads."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

from runtime.errors import BadInput

HASH_CHUNK = 1 << 20


def sha256_stream(src: BinaryIO, dst: BinaryIO | None = None, limit: int | None = None) -> tuple[str, int]:
    """Hash (and optionally copy) a stream; returns (hex digest, bytes read).

    ``limit`` bounds the bytes read: give a file's declared size + 1, and a longer
    file stops at that byte instead of being read (and copied) to its end.
    """
    digest = hashlib.sha256()
    n = 0
    while True:
        want = HASH_CHUNK if limit is None else min(HASH_CHUNK, limit - n)
        if want <= 0:
            break
        block = src.read(want)
        if not block:
            break
        digest.update(block)
        if dst is not None:
            dst.write(block)
        n += len(block)
    return digest.hexdigest(), n


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def file_kind(mode: int) -> str:
    """What a stat mode names, for messages: 'a regular file', 'a FIFO', ..."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else "not a file")


def stat_regular(path: Path | str, what: str = "file") -> os.stat_result:
    """stat() a path (following links) and refuse anything but a regular file, without opening it."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise BadInput(f"{path}: no such {what}") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read this {what} ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise BadInput(f"{path}: is {file_kind(st.st_mode)}, not a regular file; give a regular {what}")
    return st


def open_regular(path: Path | str, what: str = "file") -> BinaryIO:
    """Open a regular file for reading. A FIFO or device is refused after stat(), before any
    blocking open; O_NONBLOCK covers a swap between the two, and fstat() checks what was opened."""
    stat_regular(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read this {what} ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BadInput(f"{path}: is {file_kind(mode)}, not a regular file; give a regular {what}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def sha256_file(path: Path, limit: int | None = None) -> tuple[str, int]:
    with open_regular(path) as fh:
        return sha256_stream(fh, limit=limit)


def fsync_dir(path: Path) -> None:
    """Make the names in the folder ``path`` durable (a rename or a new file in it survives a power cut)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
