"""A read-only view of a machine's file tree, rooted anywhere.

Every detection reader in :mod:`devices` takes a root path and reads through
this class, so the same code reads the live system (``root="/"``) or a
captured tree of another board (``tests/devices/fixtures/pi5``). Readers get
``None`` for a file that is absent or unreadable: on real machines many of
these files exist only on some boards or need privileges we do not have, and
"not there" is an answer, not an error.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass

from runtime.errors import BadInput

log = logging.getLogger(__name__)

# Files in /proc and /sys are small; a cap stops a mistaken path (a device
# node, a huge log) from being read whole.
_MAX_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class RootFS:
    """Paths are given as absolute system paths (``/proc/meminfo``) and read under ``root``."""

    root: str = "/"

    @classmethod
    def at(cls, root: str | os.PathLike[str]) -> "RootFS":
        """Validate ``root`` (must be an existing directory) and return a view of it."""
        path = os.fspath(root)
        if not os.path.isdir(path):
            raise BadInput(f"root {path!r} is not a directory; give a directory such as '/' or a captured board tree")
        return cls(os.path.abspath(path))

    @property
    def is_live(self) -> bool:
        """True when this view is the running system, so commands may be run and devices probed."""
        return os.path.realpath(self.root) == "/"

    def path(self, system_path: str) -> str:
        """The host path of ``system_path`` under this root."""
        return os.path.join(self.root, system_path.lstrip("/"))

    def exists(self, system_path: str) -> bool:
        return os.path.lexists(self.path(system_path))

    def read_bytes(self, system_path: str) -> bytes | None:
        try:
            with open(self.path(system_path), "rb") as fh:
                return fh.read(_MAX_READ_BYTES)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as exc:  # permission denied, EINVAL from some sysfs attributes
            log.debug("cannot read %s: %s", system_path, exc)
            return None

    def read_text(self, system_path: str) -> str | None:
        """The file's text, or None. Device-tree strings end in NUL; it is dropped."""
        data = self.read_bytes(system_path)
        if data is None:
            return None
        return data.decode("utf-8", errors="replace").rstrip("\x00")

    def read_int(self, system_path: str) -> int | None:
        """A file holding one decimal integer (sysfs style), or None when absent or not a number."""
        text = self.read_text(system_path)
        if text is None:
            return None
        try:
            return int(text.strip())
        except ValueError:
            return None

    def glob(self, pattern: str) -> list[str]:
        """System paths (not host paths) matching ``pattern`` under this root, sorted."""
        hits = glob.glob(self.path(pattern))
        if self.root == "/":
            return sorted(hits)
        return sorted("/" + os.path.relpath(hit, self.root) for hit in hits)

    def listdir(self, system_path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(system_path)))
        except OSError:
            return []
