"""Turn what the user typed into a verified bundle on disk.

A model is named as:

* a path to a bundle directory (``manifest.json`` inside) or a transport bundle
  (``.edgerun``, installed into the store on first use; later uses take the
  installed copy when it is the same bundle: name, version, file sizes and hashes);
* a path to a bare ``.gguf`` file, wrapped on the fly with a manifest built from
  its own metadata and its SHA-256, so that everything below applies to it too;
* ``name`` or ``name@version`` of an installed model, or of a recipe in
  ``models/`` (``default`` is an alias), which is built and installed on first use.

Every file is hashed in full once; a stamp (:mod:`runtime.bundle.stamps`) then spares
the hash while stat() shows the files unchanged. ``full_check`` (``edgerun
verify``) hashes regardless. The result carries the real path of each checked
file, inside the bundle, and the identity it had when checked: loaders open the
files through :meth:`ResolvedModel.opened` (:mod:`runtime.bundle.checked_open`), so a
file replaced, rewritten or re-linked after the check is refused, not loaded,
and a link out of the bundle is refused.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from runtime.bundle import recipes
from runtime.bundle.checked_open import Closable, Identity, identity, load_verified, opened
from runtime.bundle.manifest import FileEntry, Manifest, name_from, read_manifest_dir
from runtime.bundle.stamps import Stamps, check_bundle
from runtime.bundle.store import Store, parse_ref
from runtime.errors import BadInput
from runtime.files import file_kind, open_regular, sha256_file
from runtime.formats.gguf_file import read_gguf

log = logging.getLogger(__name__)
T = TypeVar("T", bound=Closable)


@dataclass(frozen=True)
class ResolvedModel:
    manifest: Manifest
    directory: Path
    origin: str  # "store", "bundle-dir" or "gguf"
    # Each manifest file name -> the real file that was checked (inside the bundle): what loaders open.
    files: Mapping[str, Path] = field(default_factory=dict)
    # Each manifest file name -> its identity (dev, inode, size, mtime_ns, ctime_ns) when it was checked.
    identities: Mapping[str, Identity] = field(default_factory=dict)

    def path(self, role: str = "weights") -> Path:
        return self.file(self.manifest.file(role).path)

    def file(self, name: str) -> Path:
        """The checked real path of the bundle file ``name`` (``directory / name`` for a hand-made ResolvedModel)."""
        if not self.files:
            return self.directory / name
        if name not in self.files:
            raise BadInput(f"bundle {self.manifest.ref} has no file {name!r} (files: {', '.join(self.files)})")
        return self.files[name]

    def _checked(self, names: tuple[str, ...]) -> list[tuple[Path, Identity | None]]:
        return [(self.file(n), self.identities.get(n)) for n in names]

    def opened(self, *names: str) -> AbstractContextManager[list[Path]]:
        """Paths to the bundle files ``names`` as they were verified, valid inside the ``with`` block
        (:func:`runtime.bundle.checked_open.opened`); a file changed since its check is refused with one line."""
        return opened(self._checked(names))

    def load(self, load: Callable[[list[Path]], T], *names: str) -> T:
        """``load(paths)`` on the verified files ``names``: a backend or front end, closed again if refused."""
        return load_verified(self._checked(names), load)


def _looks_like_path(ref: str) -> bool:
    return os.sep in ref or ref.startswith(".") or ref.endswith((".gguf", ".edgerun")) or os.path.exists(ref)


def _verified(manifest: Manifest, directory: Path, store: Store, origin: str, full: bool) -> ResolvedModel:
    return ResolvedModel(manifest, directory, origin, *check_bundle(directory, manifest, store.stamps, full))


def wrap_gguf(path: Path, stamps: Stamps | None = None, full: bool = False) -> ResolvedModel:
    """A bare GGUF as a one-file bundle. Its SHA-256 (the manifest's version) is computed once and
    kept in a stamp that any change to the file voids (:mod:`runtime.bundle.stamps`)."""
    real = Path(os.path.realpath(path))  # the user named this file: follow their link once, then use the real path
    try:
        ident = identity(real)  # before reading: a change while hashing voids the stamp and refuses the load
    except OSError as exc:
        raise BadInput(f"{path}: cannot read this model file ({exc.strerror})") from None
    record = stamps.get(real) if stamps is not None and not full else None
    stamped = isinstance(record, dict) and record.get("identity") == list(ident) and isinstance(record.get("sha256"), str)
    with opened([(real, ident)]) as (checked,):  # the header and the hash are read from the file whose identity is kept
        info = read_gguf(checked)  # rejects non-GGUF and damaged files before anything else
        if stamped:
            sha, size = record["sha256"], ident[2]  # type: ignore[index]
            log.info("%s: unchanged since its last full check; not hashed again", real)
        else:
            sha, size = sha256_file(checked)
    if stamps is not None and not stamped:
        stamps.put(real, {"identity": ident, "sha256": sha})
    license_ = str(info.metadata.get("general.license", "unknown"))
    manifest = recipes.llm_manifest(info, name_from(path.stem), f"file-{sha[:12]}", FileEntry(path.name, sha, size), license_)
    return ResolvedModel(manifest, real.parent, "gguf", {path.name: real}, {path.name: ident})


def resolve(ref: str, store: Store | None = None, *, full_check: bool = False) -> ResolvedModel:
    """What ``ref`` names, verified: a full SHA-256 check the first time (or with ``full_check``),
    then only a stat() of each file while a stamp says nothing changed."""
    store = store or Store()
    if not ref:
        raise BadInput("no model given: name a bundle, a .gguf file, an installed model or a recipe (e.g. 'default')")
    if _looks_like_path(ref):
        path = Path(ref)
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise BadInput(f"{path}: no such file or directory "
                           "(give a bundle, a .gguf file, or a model name; see 'edgerun list')") from None
        if stat.S_ISDIR(mode):
            return _verified(read_manifest_dir(path), path, store, "bundle-dir", full_check)
        if not stat.S_ISREG(mode):
            raise BadInput(f"{path}: is {file_kind(mode)}; give a bundle directory, a .edgerun or .gguf file, or a model name")
        with open_regular(path, "model file") as fh:
            magic = fh.read(4)
        if magic == b"GGUF" or path.suffix == ".gguf":
            return wrap_gguf(path, store.stamps, full_check)
        installed = store.install_or_reuse(path)  # a .edgerun: installed on first use, the installed copy after
        return _verified(installed.manifest, installed.directory, store, "store", full_check)

    base, at, rest = ref.partition("@")
    recipe = recipes.find(base)  # "default" is an alias of a recipe's name
    name, version = parse_ref((recipe.name if recipe else base) + at + rest)  # one line for a bad name, before any path
    if name in store.names():
        installed = store.get(name, version)
        return _verified(installed.manifest, installed.directory, store, "store", full_check)
    if recipe is None:
        known = sorted(set(store.names()) | set(recipes.recipes()) | {"default"})
        raise BadInput(f"unknown model {ref!r} (installed or buildable: {', '.join(known)}; or give a path)")
    if version is not None and version != recipe.version:
        raise BadInput(f"recipe {recipe.name} builds version {recipe.version}, not {version!r}")
    log.warning("building %s@%s from its recipe (first use)", recipe.name, recipe.version)
    installed = store.install_with(recipe.build)
    return _verified(installed.manifest, installed.directory, store, "store", full_check)
