"""Bundle format v1: one versioned, checksummed artifact for any model kind.

Two forms hold the same content:

* **installed form** (a directory): ``manifest.json`` plus the files it lists.
  This is what the store keeps and what backends load.
* **transport form** (one file, ``NAME-VERSION.edgerun``): an uncompressed POSIX
  tar whose first member is ``manifest.json`` followed by exactly the files the
  manifest lists (weights do not compress; tar keeps them streamable and
  inspectable with standard tools).

``manifest.json`` is UTF-8 JSON. Its ``format`` is ``"edgerun.bundle"`` and its
``schema_version`` is :data:`SCHEMA_VERSION`; a reader rejects any other value.
Each file entry carries its size in bytes and its SHA-256; nothing is made
visible (installed) before every checksum has been verified.
"""

from __future__ import annotations

import enum
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devices.backends import BACKENDS, BackendName
from runtime.bundle.fields import FILE_RE, enum_field, object_field, required_field, text_field
from runtime.bundle.specs.anomaly import AnomalySpec
from runtime.bundle.specs.audio import AudioSpec
from runtime.bundle.specs.llm import LLMSpec
from runtime.bundle.specs.tensor import TensorQuant
from runtime.bundle.specs.vision import ColorOrder, Layout, ResizeMode, VisionSpec
from runtime.bundle.strict_json import parse_json
from runtime.errors import BadInput
from runtime.files import open_regular, sha256_file, stat_regular

# The model kinds' sections live in runtime/bundle/specs/; they are named here too, for the code that reads a
# manifest and its sections together (from runtime.bundle.manifest import Manifest, VisionSpec).
__all__ = [
    "EXTENSION", "FORMAT", "MANIFEST", "MAX_MANIFEST_BYTES", "NAME_RE", "SCHEMA_VERSION", "VERSION_RE",
    "AnomalySpec", "AudioSpec", "ColorOrder", "FileEntry", "LLMSpec", "Layout", "Manifest", "ModelFormat", "ModelKind", "ResizeMode",
    "TensorQuant", "VisionSpec", "BACKEND_FORMAT",
    "bundle_files", "check_name", "check_version", "hash_files", "is_file_name", "name_from", "read_manifest_dir",
    "verify_dir",
]

FORMAT = "edgerun.bundle"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
EXTENSION = ".edgerun"
MAX_MANIFEST_BYTES = 4 << 20  # a manifest with a chat template and a report is a few KiB
# Whole-string patterns: use them with fullmatch only (match with "$" accepts a trailing newline).
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
ROLE_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")  # weights, labels, frontend, report, plot: a word, not text


class ModelKind(str, enum.Enum):
    LLM = "llm"
    VISION = "vision"
    AUDIO = "audio"
    ANOMALY = "anomaly"  # a PatchCore-style detector: a feature backbone (vision section) and a memory bank

    @property
    def noun(self) -> str:
        """The kind in a sentence: "an LLM", "a vision model"."""
        return "an LLM" if self is ModelKind.LLM else f"a {self.value} model"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise BadInput(f"model name {name!r} is not valid: use 1-64 of a-z 0-9 . _ - starting with a letter or digit"[:300])
    return name


def name_from(text: str) -> str:
    """A valid model name made from ``text`` (a file stem, a checkpoint folder's name): lowercased,
    each run of other characters one '-', leading/trailing '-._' stripped, at most 64; 'model' if nothing is left."""
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")[:64] or "model"


def check_version(version: str) -> str:
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        raise BadInput(f"model version {version!r} is not valid: use 1-64 of A-Z a-z 0-9 . _ + - starting with a letter or digit"[:300])
    return version


def is_file_name(name: object) -> bool:
    """A flat bundle file name (no directories, no '..', no control characters)."""
    return isinstance(name, str) and FILE_RE.fullmatch(name) is not None and name != MANIFEST


@dataclass(frozen=True)
class FileEntry:
    path: str
    sha256: str
    size: int  # bytes
    role: str = "weights"

    @classmethod
    def from_dict(cls, data: Any, i: int) -> FileEntry:
        where = f"manifest files[{i}]"
        if not isinstance(data, dict):
            raise BadInput(f"{where} must be an object")
        path = required_field(data, "path", str, where)
        if not is_file_name(path):
            raise BadInput(f"{where}: file name {path!r} is not valid (a plain name, no directories)")
        sha = required_field(data, "sha256", str, where)
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise BadInput(f"{where}: sha256 {sha!r} is not 64 lowercase hex digits")
        size = required_field(data, "size", int, where)
        if size < 0:
            raise BadInput(f"{where}: size {size} is negative")
        role = text_field(data, "role", "weights", where)  # str() of a list or of 4 MB was taken for a role before
        if not ROLE_RE.fullmatch(role):
            raise BadInput(f"{where}: role {role!r:.80} is not valid: use 1-32 of a-z 0-9 _ - starting with a letter"
                           " (weights, labels, report, ...)")
        return cls(path, sha, size, role)


class ModelFormat(str, enum.Enum):
    """The model file formats the backends load."""

    GGUF = "gguf"
    TFLITE = "tflite"
    ONNX = "onnx"
    NULL = "null"  # runtime/backends/null.py: a JSON description of the input and output tensors


BACKEND_FORMAT = {name: ModelFormat(spec.model_format) for name, spec in BACKENDS.items()}  # the one format each backend loads


@dataclass(frozen=True)
class Manifest:
    kind: ModelKind
    backend: BackendName
    model_format: str
    name: str
    version: str
    files: tuple[FileEntry, ...]
    license: str = "unknown"
    llm: LLMSpec | None = None
    vision: VisionSpec | None = None
    audio: AudioSpec | None = None
    anomaly: AnomalySpec | None = None
    source: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, Any] = field(default_factory=dict)  # conversion quality reports travel here
    schema_version: int = SCHEMA_VERSION

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def file(self, role: str) -> FileEntry:
        for entry in self.files:
            if entry.role == role:
                return entry
        raise BadInput(f"bundle {self.ref} has no {role} file (files: {', '.join(f.path for f in self.files)})")

    def to_dict(self) -> dict[str, Any]:
        data = {
            "format": FORMAT,
            "schema_version": self.schema_version,
            "kind": self.kind.value,
            "backend": self.backend.value,
            "model_format": self.model_format,
            "name": self.name,
            "version": self.version,
            "license": self.license,
            "files": [asdict(f) for f in self.files],
            "source": self.source,
            "reports": self.reports,
        }
        if self.llm is not None:
            data["llm"] = self.llm.to_dict()
        if self.vision is not None:
            data["vision"] = self.vision.to_dict()
        if self.audio is not None:
            data["audio"] = self.audio.to_dict()
        if self.anomaly is not None:
            data["anomaly"] = self.anomaly.to_dict()
        return data

    def to_json(self) -> bytes:
        """The manifest as parse_json reads it: a NaN or infinity (which no reader accepts) is a ValueError here."""
        return (json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n").encode()

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        if not isinstance(data, dict):
            raise BadInput("manifest: top level must be a JSON object")
        fmt = data.get("format")
        if fmt != FORMAT:
            raise BadInput(f"manifest: format is {fmt!r}, expected {FORMAT!r}")
        schema = required_field(data, "schema_version", int)
        if schema != SCHEMA_VERSION:
            raise BadInput(f"manifest: schema_version {schema} is not supported (this edgerun reads {SCHEMA_VERSION})")
        kind = enum_field(ModelKind, required_field(data, "kind", str), "kind")
        files_raw = required_field(data, "files", list)
        if not files_raw:
            raise BadInput("manifest: 'files' is empty; a bundle holds at least one file")
        files = tuple(FileEntry.from_dict(f, i) for i, f in enumerate(files_raw))
        seen = [f.path for f in files]
        if len(set(seen)) != len(seen):
            raise BadInput(f"manifest: a file is listed twice in {seen}")
        llm = LLMSpec.from_dict(data["llm"]) if "llm" in data else None
        if kind == ModelKind.LLM and llm is None:
            raise BadInput("manifest: kind 'llm' requires an 'llm' section (architecture, context_length)")
        if llm is not None and llm.draft is not None and llm.draft not in seen:
            raise BadInput(f"manifest llm: draft file {llm.draft!r} is not among the bundle files {seen}")
        vision = VisionSpec.from_dict(data["vision"]) if "vision" in data else None
        if kind == ModelKind.VISION and vision is None:
            raise BadInput("manifest: kind 'vision' requires a 'vision' section (size, layout, mean, std, ...)")
        if vision is not None and vision.labels is not None and vision.labels not in seen:
            raise BadInput(f"manifest vision: labels file {vision.labels!r} is not among the bundle files {seen}")
        audio = AudioSpec.from_dict(data["audio"]) if "audio" in data else None
        if kind == ModelKind.AUDIO and audio is None:
            raise BadInput("manifest: kind 'audio' requires an 'audio' section (sample_rate, frontend, input_shape, ...)")
        if audio is not None:
            missing = [f for f in (*audio.frontend_files, *([audio.labels] if audio.labels else [])) if f not in seen]
            if missing:
                raise BadInput(f"manifest audio: files {missing} are not among the bundle files {seen}")
        anomaly = AnomalySpec.from_dict(data["anomaly"]) if "anomaly" in data else None
        if kind == ModelKind.ANOMALY and (anomaly is None or vision is None):
            raise BadInput("manifest: kind 'anomaly' requires an 'anomaly' section (grid, channels, bank, threshold, ...) "
                           "and a 'vision' section (the backbone's input)")
        if anomaly is not None:
            missing = [f for f in (anomaly.bank, *([anomaly.head] if anomaly.head else [])) if f not in seen]
            if missing:
                raise BadInput(f"manifest anomaly: files {missing} are not among the bundle files {seen}")
        backend = enum_field(BackendName, required_field(data, "backend", str), "backend")
        model_format = enum_field(ModelFormat, required_field(data, "model_format", str), "model_format")
        expected = BACKEND_FORMAT.get(backend)
        if expected is not None and model_format is not expected:
            raise BadInput(f"manifest: backend {backend.value!r} loads {expected.value} models, "
                           f"not model_format {model_format.value!r}")
        return cls(
            kind=kind,
            backend=backend,
            model_format=model_format.value,
            name=check_name(required_field(data, "name", str)),
            version=check_version(required_field(data, "version", str)),
            files=files,
            license=text_field(data, "license", "unknown", "manifest"),
            llm=llm,
            vision=vision,
            audio=audio,
            anomaly=anomaly,
            source=object_field(data, "source"),
            reports=object_field(data, "reports"),
            schema_version=schema,
        )

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> Manifest:
        if len(raw) > MAX_MANIFEST_BYTES:
            raise BadInput(f"{where}: manifest is {len(raw)} bytes (at most {MAX_MANIFEST_BYTES})")
        data = parse_json(raw, where)
        try:
            return cls.from_dict(data)
        except BadInput as exc:
            raise BadInput(f"{where}: {exc}") from None


def read_manifest_dir(directory: Path) -> Manifest:
    path = directory / MANIFEST
    if not os.path.lexists(path):
        raise BadInput(f"{directory}: not a bundle directory (no {MANIFEST})")
    size = stat_regular(path, "manifest").st_size
    if size > MAX_MANIFEST_BYTES:  # refused before reading any of it
        raise BadInput(f"{path}: manifest is {size} bytes (at most {MAX_MANIFEST_BYTES})")
    with open_regular(path, "manifest") as fh:
        raw = fh.read(MAX_MANIFEST_BYTES + 1)  # bounded even if the file grew since stat()
    return Manifest.from_bytes(raw, str(directory))


def bundle_files(directory: Path, manifest: Manifest) -> dict[str, Path]:
    """Each listed file's real path, checked without reading any of them.

    A file is a regular file (a FIFO or device is never opened), of the size the
    manifest says, and lies inside the bundle: a symlink may point elsewhere
    inside the bundle, never out of it. Loading these paths, not ``directory /
    name``, means a link swapped after the check cannot redirect the load.
    """
    root = Path(os.path.realpath(directory))
    out = {}
    for entry in manifest.files:
        link = directory / entry.path
        if not os.path.lexists(link):
            raise BadInput(f"{directory}: file {entry.path!r} listed in the manifest is missing")
        real = Path(os.path.realpath(link))
        if not real.is_relative_to(root):
            raise BadInput(f"{directory}: {entry.path} is a link to {real}, outside the bundle; bundle files must lie inside it")
        size = stat_regular(real, "bundle file").st_size
        if size != entry.size:
            raise BadInput(f"{directory}: {entry.path} is {size} bytes, the manifest says {entry.size} (truncated or altered)")
        out[entry.path] = real
    return out


def hash_files(files: dict[str, Path], manifest: Manifest, where: Path | str) -> None:
    """Check each file's SHA-256 against the manifest; reads at most size + 1 bytes of each."""
    for entry in manifest.files:
        digest, size = sha256_file(files[entry.path], limit=entry.size + 1)
        if size != entry.size:
            raise BadInput(f"{where}: {entry.path} is now {'longer' if size > entry.size else 'shorter'} than the manifest's "
                           f"{entry.size} bytes (changed while being checked)")
        if digest != entry.sha256:
            raise BadInput(f"{where}: checksum mismatch for {entry.path} (sha256 {digest[:16]}..., manifest {entry.sha256[:16]}...)")


def verify_dir(directory: Path, manifest: Manifest) -> dict[str, Path]:
    """Check every listed file's type, place, size and SHA-256; returns the real paths that were checked."""
    files = bundle_files(directory, manifest)
    hash_files(files, manifest, directory)
    return files
