"""The local model store: installed bundles, several versions each, atomic changes.

Layout under the store root (``$EDGERUN_HOME``, else ``$XDG_DATA_HOME/edgerun``,
else ``~/.local/share/edgerun``)::

    models/<name>/<version>/manifest.json + files   an installed bundle
    models/<name>/state.json                        {"history": [v1, v2, ...]}: last is current
    tmp/                                            staging; never visible as a model
    lock                                            flock held by every change

An install writes into ``tmp/``, verifies every checksum, fsyncs, and only then
renames the directory into ``models/``: killed at any point, the store is as it
was (a leftover staging directory is removed by the next change).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from runtime.bundle import MANIFEST, MAX_MANIFEST_BYTES, Manifest, check_name, check_version, read_manifest_dir, sha256_stream
from runtime.errors import BadInput

log = logging.getLogger(__name__)


def default_root() -> Path:
    if os.environ.get("EDGERUN_HOME"):
        return Path(os.environ["EDGERUN_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "edgerun"


@dataclass(frozen=True)
class Installed:
    manifest: Manifest
    directory: Path
    current: bool = False

    @property
    def ref(self) -> str:
        return self.manifest.ref


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class Store:
    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.models = self.root / "models"
        self.tmp = self.root / "tmp"

    # -- reading -------------------------------------------------------------
    def _history(self, name: str) -> list[str]:
        path = self.models / name / "state.json"
        if not path.is_file():
            return []
        try:
            history = json.loads(path.read_text())["history"]
        except (ValueError, KeyError, TypeError):
            raise BadInput(f"{path}: store state is corrupt; remove it to reset {name!r}'s current version") from None
        return [v for v in history if (self.models / name / v / MANIFEST).is_file()]

    def names(self) -> list[str]:
        if not self.models.is_dir():
            return []
        return sorted(p.name for p in self.models.iterdir() if p.is_dir() and self._versions(p.name))

    def _versions(self, name: str) -> list[str]:
        directory = self.models / name
        if not directory.is_dir():
            return []
        return sorted(p.name for p in directory.iterdir() if (p / MANIFEST).is_file())

    def list(self) -> list[Installed]:
        out = []
        for name in self.names():
            history = self._history(name)
            current = history[-1] if history else None
            for version in self._versions(name):
                directory = self.models / name / version
                out.append(Installed(read_manifest_dir(directory), directory, version == current))
        return out

    def get(self, name: str, version: str | None = None) -> Installed:
        check_name(name)
        versions = self._versions(name)
        if not versions:
            installed = ", ".join(self.names()) or "none"
            raise BadInput(f"model {name!r} is not installed (installed: {installed})")
        history = self._history(name)
        current = history[-1] if history else versions[-1]
        if version is None:
            version = current
        elif version not in versions:
            raise BadInput(f"{name} has no version {version!r} (installed: {', '.join(versions)})")
        directory = self.models / name / version
        return Installed(read_manifest_dir(directory), directory, version == current)

    # -- changing ------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                # Leftovers of an interrupted install: never visible, safe to drop under the lock.
                if self.tmp.is_dir():
                    for stale in self.tmp.iterdir():
                        shutil.rmtree(stale, ignore_errors=True)
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _commit(self, staging: Path, manifest: Manifest) -> Installed:
        """Make a verified staging directory visible as name/version and current."""
        target_parent = self.models / manifest.name
        target = target_parent / manifest.version
        if target.exists():
            raise BadInput(f"{manifest.ref} is already installed; remove it first or give the bundle a new version")
        _write_atomic(staging / MANIFEST, manifest.to_json())
        for path in staging.iterdir():  # mkstemp/mkdtemp made them private; models are readable by services
            path.chmod(0o644)
        staging.chmod(0o755)
        _fsync_dir(staging)
        target_parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, target)
        _fsync_dir(target_parent)
        history = [v for v in self._history(manifest.name) if v != manifest.version] + [manifest.version]
        _write_atomic(target_parent / "state.json", json.dumps({"history": history}).encode())
        log.info("installed %s into %s", manifest.ref, target)
        return Installed(manifest, target, True)

    def install_with(self, build: Callable[[Path], Manifest]) -> Installed:
        """Run ``build(staging_dir) -> Manifest`` and install its output atomically.

        ``build`` writes the bundle's files into the staging directory and returns
        a manifest whose sizes and checksums it computed while writing.
        """
        with self._locked():
            self.tmp.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=self.tmp, prefix="install-"))
            try:
                manifest = build(staging)
                if (self.models / manifest.name / manifest.version).exists():
                    raise BadInput(f"{manifest.ref} is already installed; remove it first or give the bundle a new version")
                return self._commit(staging, manifest)
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def install(self, bundle: Path | str) -> Installed:
        """Install a transport bundle (``.edgerun`` tar) or a bundle directory."""
        bundle = Path(bundle)
        if not bundle.exists():
            raise BadInput(f"{bundle}: no such bundle")
        if bundle.is_dir():
            return self.install_with(lambda staging: _copy_dir(bundle, staging))
        return self.install_with(lambda staging: _extract_transport(bundle, staging))

    def remove(self, name: str, version: str | None = None) -> list[str]:
        with self._locked():
            versions = self._versions(name) if version is None else [self.get(name, version).manifest.version]
            if not versions:
                raise BadInput(f"model {name!r} is not installed (installed: {', '.join(self.names()) or 'none'})")
            history = [v for v in self._history(name) if v not in versions]
            for v in versions:
                # Rename first so that a half-deleted directory is never seen as a model.
                doomed = self.tmp / f"remove-{name}-{v}"
                self.tmp.mkdir(parents=True, exist_ok=True)
                os.rename(self.models / name / v, doomed)
                shutil.rmtree(doomed, ignore_errors=True)
            if self._versions(name):
                _write_atomic(self.models / name / "state.json", json.dumps({"history": history}).encode())
            else:
                shutil.rmtree(self.models / name, ignore_errors=True)
            return versions

    def rollback(self, name: str) -> Installed:
        with self._locked():
            history = self._history(name)
            if not history:
                self.get(name)  # raises "not installed" with the list
            if len(history) < 2:
                raise BadInput(f"{name} has no previous version to roll back to (current: {history[-1]})")
            history.pop()
            _write_atomic(self.models / name / "state.json", json.dumps({"history": history}).encode())
        return self.get(name)


def _copy_dir(src: Path, staging: Path) -> Manifest:
    manifest = read_manifest_dir(src)
    for entry in manifest.files:
        path = src / entry.path
        if not path.is_file():
            raise BadInput(f"{src}: file {entry.path!r} listed in the manifest is missing")
        with open(path, "rb") as fin, open(staging / entry.path, "wb") as fout:
            digest, size = sha256_stream(fin, fout)
            fout.flush()
            os.fsync(fout.fileno())
        _check_entry(src, entry.path, entry.sha256, entry.size, digest, size)
    return manifest


def _check_entry(where: Path, name: str, want_sha: str, want_size: int, sha: str, size: int) -> None:
    if size != want_size:
        raise BadInput(f"{where}: {name} is {size} bytes, the manifest says {want_size} (truncated or altered)")
    if sha != want_sha:
        raise BadInput(f"{where}: checksum mismatch for {name} (sha256 {sha[:16]}..., manifest {want_sha[:16]}...)")


def _extract_transport(path: Path, staging: Path) -> Manifest:
    try:
        tar = tarfile.open(path, "r:")  # uncompressed only, by design
    except (tarfile.TarError, OSError) as exc:
        raise BadInput(f"{path}: not an edgerun bundle (expected an uncompressed tar with manifest.json first: {exc})") from None
    with tar:
        try:
            first = tar.next()
            if first is None or first.name != MANIFEST or not first.isfile():
                raise BadInput(f"{path}: not an edgerun bundle: the first member must be {MANIFEST}")
            if first.size > MAX_MANIFEST_BYTES:
                raise BadInput(f"{path}: manifest is {first.size} bytes (at most {MAX_MANIFEST_BYTES})")
            raw = tar.extractfile(first).read()  # type: ignore[union-attr]
            manifest = Manifest.from_bytes(raw, str(path))
            check_name(manifest.name)
            check_version(manifest.version)
            expected = {f.path: f for f in manifest.files}
            seen: set[str] = set()
            while (member := tar.next()) is not None:
                entry = expected.get(member.name)
                if entry is None or not member.isfile():
                    raise BadInput(f"{path}: unexpected member {member.name!r} (the manifest lists: {', '.join(expected)})")
                if member.name in seen:
                    raise BadInput(f"{path}: member {member.name!r} appears twice")
                seen.add(member.name)
                src = tar.extractfile(member)
                assert src is not None
                with open(staging / entry.path, "wb") as out:
                    digest, size = sha256_stream(src, out)
                    out.flush()
                    os.fsync(out.fileno())
                _check_entry(path, entry.path, entry.sha256, entry.size, digest, size)
        except (tarfile.TarError, EOFError) as exc:
            raise BadInput(f"{path}: bundle is damaged or truncated ({exc})") from None
    missing = sorted(set(expected) - seen)
    if missing:
        raise BadInput(f"{path}: bundle is incomplete: missing {', '.join(missing)}")
    return manifest


def pack(directory: Path, out: Path) -> Path:
    """Write the transport form of a bundle directory, atomically (temp + rename)."""
    manifest = read_manifest_dir(directory)
    if out.exists():
        raise BadInput(f"{out} already exists; choose another output path or remove it")
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    os.close(fd)
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(directory / MANIFEST, arcname=MANIFEST)
            for entry in manifest.files:
                tar.add(directory / entry.path, arcname=entry.path)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return out
