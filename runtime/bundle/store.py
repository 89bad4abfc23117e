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
import errno
import fcntl
import io
import json
import logging
import os
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from runtime.bundle.manifest import (
    EXTENSION,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Manifest,
    bundle_files,
    check_name,
    check_version,
    read_manifest_dir,
)
from runtime.bundle.stamps import Stamps, record_bundle
from runtime.errors import BadInput
from runtime.files import file_kind, fsync_dir, open_regular, sha256_stream
from runtime.units import fmt_bytes

log = logging.getLogger(__name__)
MAX_TAR_HEADER = 64 << 10  # PAX / GNU long-name header bytes; an edgerun bundle's are a few hundred
FREE_SPACE_MARGIN = 16 << 20  # bytes left free beyond a bundle's files (manifest, fs metadata)


def default_root() -> Path:
    if os.environ.get("EDGERUN_HOME"):
        return Path(os.environ["EDGERUN_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "edgerun"


def check_ref(name: str, version: str | None = None) -> tuple[str, str | None]:
    """The one check of a model name and version before either touches a store path."""
    return check_name(name), None if version is None else check_version(version)


def parse_ref(ref: str) -> tuple[str, str | None]:
    """``name`` or ``name@version``, checked. ``name@`` (an empty version) is refused, not read as "every version"."""
    name, at, version = ref.partition("@")
    return check_ref(name, version if at else None)


@dataclass(frozen=True)
class Installed:
    manifest: Manifest
    directory: Path
    current: bool = False

    @property
    def ref(self) -> str:
        return self.manifest.ref


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def same_files(a: Manifest, b: Manifest) -> bool:
    """Same name, version and files (name, size, SHA-256): the same bundle."""
    key = lambda m: (m.name, m.version, sorted((f.path, f.size, f.sha256) for f in m.files))  # noqa: E731
    return key(a) == key(b)


class Store:
    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.models = self.root / "models"
        self.tmp = self.root / "tmp"
        self.stamps = Stamps(self.root / "verified")

    def _unusable(self, reason: str) -> BadInput:
        return BadInput(f"model store {self.root}: {reason}; set EDGERUN_HOME to a writable folder")

    def _check_root(self) -> None:
        try:
            st = os.stat(self.root)
        except OSError:
            return  # not there yet: the first change creates it
        if not stat.S_ISDIR(st.st_mode):
            raise self._unusable(f"is {file_kind(st.st_mode)}, not a folder")

    # -- reading -------------------------------------------------------------
    def _history(self, name: str) -> list[str]:
        """The versions made current, oldest first: only installed versions, whatever state.json holds.

        state.json is a file in the store, not a checked input: a version in it is kept only if it is
        one of :meth:`_versions` (a valid version, by ``re.fullmatch``, with a manifest), so '../..' or
        '1.0\\n' can never become the current version, nor a path built from it."""
        path = self.models / check_name(name) / "state.json"
        if not path.is_file():
            return []
        try:
            with open_regular(path, "store state file") as fh:  # a FIFO swapped in after is_file() is refused, not waited on
                history = json.loads(fh.read(1 << 20))["history"]  # a list of versions: bounded read
            if not isinstance(history, list):
                raise TypeError
        except (ValueError, KeyError, TypeError, RecursionError):
            raise BadInput(f"{path}: store state is corrupt; remove it to reset {name!r}'s current version") from None
        installed = set(self._versions(name))
        return [v for v in history if isinstance(v, str) and _valid(check_version, v) and v in installed]

    def names(self) -> list[str]:
        self._check_root()
        if not self.models.is_dir():
            return []
        return sorted(p.name for p in self._entries(self.models) if _valid(check_name, p.name) and p.is_dir() and self._versions(p.name))

    def _versions(self, name: str) -> list[str]:
        directory = self.models / check_name(name)
        if not directory.is_dir():
            return []
        return sorted(p.name for p in self._entries(directory) if _valid(check_version, p.name) and (p / MANIFEST).is_file())

    def _entries(self, directory: Path) -> list[Path]:
        try:
            return list(directory.iterdir())
        except OSError as exc:
            raise self._unusable(f"cannot read {directory} ({exc.strerror})") from None

    def list(self) -> list[Installed]:
        """Every installed version. One unreadable bundle is logged by name and skipped, not fatal to the list."""
        out = []
        for name in self.names():
            try:
                history = self._history(name)
            except BadInput as exc:
                log.warning("%s (listed without a current version)", exc)
                history = []
            current = history[-1] if history else None
            for version in self._versions(name):
                directory = self.models / name / version
                try:
                    out.append(Installed(read_manifest_dir(directory), directory, version == current))
                except BadInput as exc:
                    log.warning("%s@%s is damaged, not listed (edgerun remove %s@%s): %s", name, version, name, version, exc)
        return out

    def get(self, name: str, version: str | None = None) -> Installed:
        check_ref(name, version)
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
        self._check_root()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            lock = open(self.root / "lock", "a+")  # noqa: SIM115 (held for the whole block)
        except OSError as exc:
            raise self._unusable(f"cannot write there ({exc.strerror})") from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                # Leftovers of an interrupted install: never visible, safe to drop under the lock.
                if self.tmp.is_dir():
                    for stale in self.tmp.iterdir():
                        shutil.rmtree(stale, ignore_errors=True)
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _staging(self, prefix: str) -> Path:
        try:
            self.tmp.mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(dir=self.tmp, prefix=prefix))
        except OSError as exc:
            raise self._unusable(f"cannot write there ({exc.strerror})") from None

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
        fsync_dir(staging)
        target_parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, target)
        fsync_dir(target_parent)
        history = [v for v in self._history(manifest.name) if v != manifest.version] + [manifest.version]
        _write_atomic(target_parent / "state.json", json.dumps({"history": history}).encode())
        record_bundle(target, manifest, self.stamps)  # hashed while staged: the first run need not hash again
        log.info("installed %s into %s", manifest.ref, target)
        return Installed(manifest, target, True)

    def install_with(self, build: Callable[[Path], Manifest], reuse_same: bool = False) -> Installed:
        """Run ``build(staging_dir) -> Manifest`` and install its output atomically.

        ``build`` writes the bundle's files into the staging directory and returns
        a manifest whose sizes and checksums it computed while writing. With
        ``reuse_same``, a name@version installed meanwhile (another process) with
        the same files is returned instead of refused.
        """
        with self._locked():
            staging = self._staging("install-")
            try:
                try:
                    manifest = build(staging)
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    raise BadInput(f"model store {self.root}: the disk filled up while installing ({exc.strerror})") from None
                check_ref(manifest.name, manifest.version)
                if (self.models / manifest.name / manifest.version).exists():
                    if reuse_same:
                        return self._same_installed(manifest, "the bundle")
                    raise BadInput(f"{manifest.ref} is already installed; remove it first or give the bundle a new version")
                return self._commit(staging, manifest)
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def install(self, bundle: Path | str, reuse_same: bool = False) -> Installed:
        """Install a transport bundle (``.edgerun`` tar) or a bundle directory."""
        bundle = Path(bundle)
        if _is_dir(bundle):
            return self.install_with(lambda staging: _copy_dir(bundle, staging), reuse_same)
        open_regular(bundle, "bundle").close()  # refuses a missing path, a FIFO or a device before tarfile opens it
        return self.install_with(lambda staging: _extract_transport(bundle, staging), reuse_same)

    def install_or_reuse(self, bundle: Path | str) -> Installed:
        """The installed copy of ``bundle`` if the same bundle (name, version, file sizes and hashes)
        is installed, else a fresh install. A different bundle under an installed name@version is refused."""
        bundle = Path(bundle)
        manifest = read_manifest_dir(bundle) if _is_dir(bundle) else transport_manifest(bundle)
        if manifest.version in self._versions(manifest.name):
            return self._same_installed(manifest, bundle)
        return self.install(bundle, reuse_same=True)  # reuse_same: another process may install it meanwhile

    def _same_installed(self, manifest: Manifest, where: object) -> Installed:
        installed = self.get(manifest.name, manifest.version)
        if not same_files(installed.manifest, manifest):
            raise BadInput(f"{where}: {manifest.ref} is already installed with different files; "
                           f"remove it (edgerun remove {manifest.ref}) or give the bundle a new version")
        log.info("%s: the same bundle is installed as %s; using it", where, installed.directory)
        return installed

    def remove(self, name: str, version: str | None = None) -> list[str]:
        check_ref(name, version)
        with self._locked():
            versions = self._versions(name) if version is None else [self.get(name, version).manifest.version]
            if not versions:
                raise BadInput(f"model {name!r} is not installed (installed: {', '.join(self.names()) or 'none'})")
            history = [v for v in self._history(name) if v not in versions]
            for v in versions:
                # Rename first so that a half-deleted directory is never seen as a model.
                doomed = self._staging("remove-")
                os.rename(self.models / name / v, doomed / v)
                self.stamps.drop(self.models / name / v)
                shutil.rmtree(doomed, ignore_errors=True)
            if self._versions(name):
                _write_atomic(self.models / name / "state.json", json.dumps({"history": history}).encode())
            else:
                shutil.rmtree(self.models / name, ignore_errors=True)
            return versions

    def rollback(self, name: str) -> Installed:
        check_ref(name)
        with self._locked():
            history = self._history(name)
            if not history:
                self.get(name)  # raises "not installed" with the list
            if len(history) < 2:
                raise BadInput(f"{name} has no previous version to roll back to (current: {history[-1]})")
            history.pop()
            _write_atomic(self.models / name / "state.json", json.dumps({"history": history}).encode())
        return self.get(name)


def _valid(check: Callable[[str], str], value: str) -> bool:
    try:
        check(value)
    except BadInput:
        return False
    return True


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def _check_space(staging: Path, manifest: Manifest, where: Path) -> None:
    need = sum(f.size for f in manifest.files) + FREE_SPACE_MARGIN
    free = shutil.disk_usage(staging).free
    if free < need:
        raise BadInput(f"{where}: {manifest.ref} needs {fmt_bytes(need)} free in {staging.parent}, only {fmt_bytes(free)} is free")


def _copy_dir(src: Path, staging: Path) -> Manifest:
    manifest = read_manifest_dir(src)
    files = bundle_files(src, manifest)  # types, places and sizes, from stat(): nothing is read before these pass
    _check_space(staging, manifest, src)
    for entry in manifest.files:
        with open_regular(files[entry.path]) as fin, open(staging / entry.path, "wb") as fout:
            digest, size = sha256_stream(fin, fout, limit=entry.size + 1)  # a file grown since stat() stops at size + 1
            fout.flush()
            os.fsync(fout.fileno())
        _check_entry(src, entry.path, entry.sha256, entry.size, digest, size)
    return manifest


def _check_entry(where: Path, name: str, want_sha: str, want_size: int, sha: str, size: int) -> None:
    if size != want_size:
        raise BadInput(f"{where}: {name} is {'more than ' if size > want_size else ''}{size} bytes, the manifest says {want_size} "
                       "(truncated or altered)")
    if sha != want_sha:
        raise BadInput(f"{where}: checksum mismatch for {name} (sha256 {sha[:16]}..., manifest {want_sha[:16]}...)")


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses an extended (PAX) or GNU long-name/sparse header before tarfile reads its body.

    tarfile reads such a body whole into memory, so a header declaring a huge size
    is a MemoryError (or gigabytes read) before any member is seen. Sparse members
    (GNU type 'S') are refused here too: their map makes a few KB expand to gigabytes.
    """

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise tarfile.HeaderError(f"member {self.name!r} is a GNU sparse file; bundle members are plain files")
        if self.type in _EXTENDED and not 0 <= self.size <= MAX_TAR_HEADER:
            raise tarfile.HeaderError(f"an extended header declares {self.size} bytes (at most {MAX_TAR_HEADER})")
        return super()._proc_member(tarfile_)  # type: ignore[misc]

    def _refuse_sparse(self, *_: object) -> None:
        raise tarfile.HeaderError("a member is a PAX sparse file; bundle members are plain files")

    # GNU sparse maps in PAX headers (formats 0.0, 0.1, 1.0): refused before tarfile parses the map.
    _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _refuse_sparse


_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_PLAIN = (tarfile.REGTYPE, tarfile.AREGTYPE)
# What a hostile or damaged tar makes tarfile raise besides TarError: a huge or malformed number, a bad
# encoding, a header past the end of the file, an allocation for a declared size.
_TAR_FAULTS = (tarfile.TarError, EOFError, ValueError, OverflowError, MemoryError, UnicodeError, OSError)


@contextlib.contextmanager
def _open_transport(path: Path) -> Iterator[tarfile.TarFile]:
    with open_regular(path, "bundle") as fh:  # a FIFO or device is refused before tarfile reads anything
        try:
            tar = tarfile.open(fileobj=fh, mode="r:", tarinfo=_BoundedTarInfo)  # uncompressed only, by design
        except _TAR_FAULTS as exc:
            raise BadInput(f"{path}: not an edgerun bundle (expected an uncompressed tar with manifest.json first: {exc})"[:400]) from None
        with tar:
            yield tar


def _read_manifest_member(path: Path, tar: tarfile.TarFile) -> Manifest:
    first = tar.next()
    if first is None or first.name != MANIFEST or first.type not in _PLAIN or first.sparse is not None:
        raise BadInput(f"{path}: not an edgerun bundle: the first member must be {MANIFEST}")
    if first.size > MAX_MANIFEST_BYTES:
        raise BadInput(f"{path}: manifest is {first.size} bytes (at most {MAX_MANIFEST_BYTES})")
    raw = tar.extractfile(first).read(MAX_MANIFEST_BYTES + 1)  # type: ignore[union-attr]
    return Manifest.from_bytes(raw, str(path))


def transport_manifest(path: Path) -> Manifest:
    """The manifest of a transport bundle, read without reading the files after it."""
    with _open_transport(path) as tar:
        try:
            return _read_manifest_member(path, tar)
        except _TAR_FAULTS as exc:
            raise BadInput(f"{path}: bundle is damaged or truncated ({exc})"[:400]) from None


def check_transport(path: Path) -> Manifest:
    """Check every member of a transport bundle against its manifest, writing nothing."""
    return _extract_transport(path, None)


def _extract_transport(path: Path, staging: Path | None) -> Manifest:
    """Stream a transport bundle's members into ``staging`` (None: hash only), each checked
    against the manifest: its type and size before any byte is copied, its SHA-256 after."""
    with _open_transport(path) as tar:
        try:
            manifest = _read_manifest_member(path, tar)
            if staging is not None:
                _check_space(staging, manifest, path)
            expected = {f.path: f for f in manifest.files}
            seen: set[str] = set()
            while (member := tar.next()) is not None:
                entry = expected.get(member.name)
                if entry is None:
                    raise BadInput(f"{path}: unexpected member {member.name!r} (the manifest lists: {', '.join(expected)})"[:400])
                sparse = member.sparse is not None or any(k.startswith("GNU.sparse.") for k in member.pax_headers)
                if sparse or member.type not in _PLAIN:
                    kind = "a sparse file" if sparse else f"tar type {member.type!r}"
                    raise BadInput(f"{path}: member {member.name!r} is {kind}; bundle members are plain files")
                if member.name in seen:
                    raise BadInput(f"{path}: member {member.name!r} appears twice")
                if member.size != entry.size:  # before copying: a small tar may declare a huge member
                    raise BadInput(f"{path}: member {member.name!r} is {member.size} bytes, the manifest says {entry.size}")
                seen.add(member.name)
                src = tar.extractfile(member)
                assert src is not None
                if staging is None:
                    digest, size = sha256_stream(src, limit=entry.size + 1)
                else:
                    with open(staging / entry.path, "wb") as out:
                        digest, size = sha256_stream(src, out, limit=entry.size + 1)
                        out.flush()
                        os.fsync(out.fileno())
                _check_entry(path, entry.path, entry.sha256, entry.size, digest, size)
        except _TAR_FAULTS as exc:
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # the store's disk, not the bundle: install_with says so
            raise BadInput(f"{path}: bundle is damaged or truncated ({exc})"[:400]) from None
    missing = sorted(set(expected) - seen)
    if missing:
        raise BadInput(f"{path}: bundle is incomplete: missing {', '.join(missing)}")
    return manifest


def check_pack_out(out: Path) -> None:
    """Refuse an output path that pack cannot write, before any work."""
    if os.path.lexists(out):
        raise BadInput(f"{out} already exists; choose another output path or remove it")
    if not _is_dir(out.parent):
        raise BadInput(f"{out}: the folder {out.parent} does not exist; create it first or choose another --out")


def publish(staging: Path, out: Path) -> Path:
    """Make the finished bundle directory ``staging`` visible at ``out``, durably, for every converter.

    ``out`` ending in the bundle extension: the ``.edgerun`` file is written by :func:`pack` (temp file,
    fsync, rename). Otherwise ``staging`` (which must sit beside ``out``, on the same file system) has
    its files and itself fsynced and is renamed to ``out``. Either way the folder holding ``out`` is
    fsynced after, so a power cut leaves the old state or the whole bundle, never a part.
    """
    if out.suffix == EXTENSION:
        pack(staging, out)
    else:
        for path in staging.iterdir():
            if path.is_file() and not path.is_symlink():
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
        fsync_dir(staging)
        os.rename(staging, out)
    fsync_dir(out.parent)
    return out


def pack(directory: Path, out: Path) -> Path:
    """Write the transport form of a bundle directory, atomically (temp + rename)."""
    manifest = read_manifest_dir(directory)
    files = bundle_files(directory, manifest)  # the real files: a link inside the bundle is packed as the file it names
    check_pack_out(out)
    try:
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    except OSError as exc:
        raise BadInput(f"{out}: cannot write in {out.parent} ({exc.strerror})") from None
    os.close(fd)
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(_member(MANIFEST, manifest.to_json()), io.BytesIO(manifest.to_json()))
            for entry in manifest.files:
                with open_regular(files[entry.path]) as fh:
                    info = _member(entry.path, b"")
                    info.size = entry.size
                    tar.addfile(info, fh)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except OSError as exc:  # a disk that filled up, or a bundle file that changed while being packed
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise BadInput(f"{out}: not written ({exc})") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return out


def _member(name: str, data: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    return info
