"""Load the files that were verified, not whatever their paths name by then.

Verification (:mod:`runtime.bundle.stamps`, :mod:`runtime.bundle.resolve`) records each file's
identity as stat() saw it before hashing: device, inode, size, mtime_ns and
ctime_ns. Anyone who can write a bundle could, after that check, rename another
file over a checked one (a new inode), rewrite it in place (a new ctime), or
swap a folder inside the bundle for a symlink to elsewhere (a new device or
inode). So every reader of a checked file goes through :func:`opened`: each file
is opened once, without following a final symlink and without blocking on a
FIFO, fstat() must show a regular file with the recorded identity, and the
caller gets ``/proc/self/fd/N``, a path to that open file whatever happens to
the bundle's paths meanwhile.

llama.cpp (mmap), LiteRT (mmap) and ONNX Runtime (a read copy) open the path
while loading and never again, so the descriptors close when the load is done.
Where ``/proc/self/fd`` does not exist, the caller gets the real paths and each
one is stat()ed again after the load: a changed identity refuses the load.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from runtime.errors import BadInput, EdgerunError
from runtime.files import file_kind

Identity = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns
PROC_FD = "/proc/self/fd"
_PROC_PATH = re.compile(re.escape(PROC_FD) + r"/(\d+)")


class Closable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closable)


def identity_of(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def identity(path: Path | str) -> Identity:
    """The identity of the file ``path`` names (links followed)."""
    return identity_of(os.stat(path))


def _changed(path: Path | str) -> BadInput:
    return BadInput(f"{path}: changed since it was verified (replaced, rewritten or moved); nothing was loaded. "
                    "Run the command again to verify the bundle as it is now")


def open_verified(path: Path | str, expected: Identity | None, what: str = "bundle file") -> int:
    """A read-only descriptor of ``path``: never a symlink (O_NOFOLLOW), never a blocking open (O_NONBLOCK),
    a regular file, and, when ``expected`` is given, the very file verification saw."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadInput(f"{path}: is now a symbolic link; the {what} that was verified is not there any more") from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise BadInput(f"{path}: the verified {what} is gone (moved or deleted since it was checked)") from None
        raise BadInput(f"{path}: cannot read this {what} ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{path}: is now {file_kind(st.st_mode)}, not the regular {what} that was verified")
        if expected is not None and identity_of(st) != tuple(expected):
            raise _changed(path)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def opened(files: Sequence[tuple[Path, Identity | None]]) -> Iterator[list[Path]]:
    """Paths to the verified ``files`` (real path, recorded identity), valid inside the block.

    Each is ``/proc/self/fd/N`` of a descriptor checked by :func:`open_verified` and closed when the block
    ends; an error raised inside names the real path, not the descriptor. Without ``/proc/self/fd`` the real
    paths are given, and each is checked again (no link followed) when the block ends."""
    with contextlib.ExitStack() as stack:
        fds = []
        for path, expected in files:
            fds.append(open_verified(path, expected))
            stack.callback(os.close, fds[-1])
        by_fd = {str(fd): path for fd, (path, _) in zip(fds, files, strict=True)}
        via_proc = os.path.isdir(PROC_FD)
        try:
            yield [Path(PROC_FD, str(fd)) for fd in fds] if via_proc else [path for path, _ in files]
        except EdgerunError as exc:  # "/proc/self/fd/7: ..." means nothing to the user: name the file
            message = _PROC_PATH.sub(lambda m: str(by_fd.get(m[1], m[0])), str(exc))
            if message == str(exc):
                raise
            raise type(exc)(message) from None
        if not via_proc:
            for path, expected in files:
                if expected is None:
                    continue
                try:
                    now = identity_of(os.stat(path, follow_symlinks=False))
                except OSError:
                    raise _changed(path) from None
                if now != tuple(expected):
                    raise _changed(path)


def load_verified(files: Sequence[tuple[Path, Identity | None]], load: Callable[[list[Path]], T]) -> T:
    """``load(paths)`` on the verified ``files`` (see :func:`opened`); what it returned is closed again
    if the files turn out to have changed under it (the re-check without ``/proc/self/fd``)."""
    with contextlib.ExitStack() as undo:
        with opened(files) as paths:
            obj = load(paths)
            undo.callback(obj.close)
        undo.pop_all()
    return obj
