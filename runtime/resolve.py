"""Turn what the user typed into a verified bundle on disk.

A model is named as:

* a path to a bundle directory (``manifest.json`` inside) or a transport bundle
  (``.edgerun``, installed into the store on first use);
* a path to a bare ``.gguf`` file, wrapped on the fly with a manifest built from
  its own metadata and its SHA-256, so that everything below applies to it too;
* ``name`` or ``name@version`` of an installed model, or of a recipe in
  ``models/`` (``default`` is an alias), which is built and installed on first use.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from runtime import recipes
from runtime.bundle import FileEntry, Manifest, read_manifest_dir, sha256_file, verify_dir
from runtime.errors import BadInput
from runtime.gguf_file import read_gguf
from runtime.store import Store

log = logging.getLogger(__name__)
VERIFIED_STAMP = ".verified"


@dataclass(frozen=True)
class ResolvedModel:
    manifest: Manifest
    directory: Path
    origin: str  # "store", "bundle-dir" or "gguf"

    def path(self, role: str = "weights") -> Path:
        return self.directory / self.manifest.file(role).path


def _looks_like_path(ref: str) -> bool:
    return os.sep in ref or ref.startswith(".") or ref.endswith((".gguf", ".edgerun")) or os.path.exists(ref)


def _stamp(directory: Path, manifest: Manifest) -> dict[str, list[int]]:
    out = {}
    for entry in manifest.files:
        st = (directory / entry.path).stat()
        out[entry.path] = [st.st_size, st.st_mtime_ns, st.st_ino]
    return out


def verify_installed(directory: Path, manifest: Manifest) -> None:
    """Full SHA-256 check, skipped when the files are unchanged since the last check."""
    stamp_path = directory / VERIFIED_STAMP
    try:
        if json.loads(stamp_path.read_text()) == _stamp(directory, manifest):
            return
    except (OSError, ValueError):
        pass
    verify_dir(directory, manifest)
    try:
        stamp_path.write_text(json.dumps(_stamp(directory, manifest)))
    except OSError:  # a read-only store is fine: we verify every time
        pass


def wrap_gguf(path: Path) -> ResolvedModel:
    info = read_gguf(path)  # rejects non-GGUF and damaged files before anything else
    sha, size = sha256_file(path)
    stem = re.sub(r"[^a-z0-9._-]+", "-", path.stem.lower()).strip("-._") or "model"
    manifest = recipes.llm_manifest(
        info, stem[:64], f"file-{sha[:12]}", FileEntry(path.name, sha, size), str(info.metadata.get("general.license", "unknown"))
    )
    return ResolvedModel(manifest, path.parent, "gguf")


def resolve(ref: str, store: Store | None = None) -> ResolvedModel:
    store = store or Store()
    if not ref:
        raise BadInput("no model given: name a bundle, a .gguf file, an installed model or a recipe (e.g. 'default')")
    if _looks_like_path(ref):
        path = Path(ref)
        if not path.exists():
            raise BadInput(f"{path}: no such file or directory (give a bundle, a .gguf file, or a model name; see 'edgerun list')")
        if path.is_dir():
            manifest = read_manifest_dir(path)
            verify_dir(path, manifest)
            return ResolvedModel(manifest, path, "bundle-dir")
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic == b"GGUF" or path.suffix == ".gguf":
            return wrap_gguf(path)
        installed = store.install(path)
        log.warning("installed %s from %s into the model store", installed.ref, path)
        return ResolvedModel(installed.manifest, installed.directory, "store")

    name, _, version = ref.partition("@")
    recipe = recipes.find(name)
    if recipe is not None:
        name = recipe.name
    if name in store.names():
        installed = store.get(name, version or None)
        verify_installed(installed.directory, installed.manifest)
        return ResolvedModel(installed.manifest, installed.directory, "store")
    if recipe is None:
        known = sorted(set(store.names()) | set(recipes.recipes()) | {"default"})
        raise BadInput(f"unknown model {ref!r} (installed or buildable: {', '.join(known)}; or give a path)")
    if version and version != recipe.version:
        raise BadInput(f"recipe {recipe.name} builds version {recipe.version}, not {version!r}")
    log.warning("building %s@%s from its recipe (first use)", recipe.name, recipe.version)
    installed = store.install_with(recipe.build)
    verify_installed(installed.directory, installed.manifest)
    return ResolvedModel(installed.manifest, installed.directory, "store")
