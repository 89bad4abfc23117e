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
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devices.backends import BACKENDS, BackendName
from runtime.errors import BadInput
from runtime.files import open_regular, sha256_file, stat_regular
from runtime.manifest_json import parse_json
from runtime.sampling import INT32_MAX, SamplingParams

FORMAT = "edgerun.bundle"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
EXTENSION = ".edgerun"
MAX_MANIFEST_BYTES = 4 << 20  # a manifest with a chat template and a report is a few KiB
# Whole-string patterns: use them with fullmatch only (match with "$" accepts a trailing newline).
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # flat: no directories, no '..'
ROLE_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")  # weights, labels, frontend, report, plot: a word, not text


class ModelKind(str, enum.Enum):
    LLM = "llm"
    VISION = "vision"
    AUDIO = "audio"


def _enum(cls: type[enum.Enum], value: Any, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        valid = ", ".join(m.value for m in cls)  # type: ignore[attr-defined]
        raise BadInput(f"manifest: {what} {value!r:.80} is not valid (valid: {valid})") from None


def _require(data: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str = "manifest") -> Any:
    if key not in data:
        raise BadInput(f"{where}: required field {key!r} is missing")
    value = data[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise BadInput(f"{where}: field {key!r} must be {names}, got {type(value).__name__} {value!r}"[:300])
    return value


INT64_MAX = 2**63 - 1  # the largest byte count any file or allocation here can have


def _count(data: dict[str, Any], key: str, where: str, most: int = INT64_MAX) -> int:
    value = data.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
        raise BadInput(f"{where}: {key} {value!r:.80} must be an integer in [0, {most}]")
    return value


def _text(data: dict[str, Any], key: str, default: str, where: str) -> str:
    """An optional string field: absent gives ``default``; another type is refused, not str()-ed."""
    value = data.get(key, default)
    if not isinstance(value, str):
        raise BadInput(f"{where}: field {key!r} must be str, got {type(value).__name__} {value!r:.80}")
    return value


def _flag(data: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):  # bool("false") is True: a string is refused, not coerced
        raise BadInput(f"{where}: field {key!r} must be true or false, got {type(value).__name__} {value!r:.80}")
    return value


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
        path = _require(data, "path", str, where)
        if not is_file_name(path):
            raise BadInput(f"{where}: file name {path!r} is not valid (a plain name, no directories)")
        sha = _require(data, "sha256", str, where)
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise BadInput(f"{where}: sha256 {sha!r} is not 64 lowercase hex digits")
        size = _require(data, "size", int, where)
        if size < 0:
            raise BadInput(f"{where}: size {size} is negative")
        role = _text(data, "role", "weights", where)  # str() of a list or of 4 MB was taken for a role before
        if not ROLE_RE.fullmatch(role):
            raise BadInput(f"{where}: role {role!r:.80} is not valid: use 1-32 of a-z 0-9 _ - starting with a letter"
                           " (weights, labels, report, ...)")
        return cls(path, sha, size, role)


@dataclass(frozen=True)
class LLMSpec:
    """What the runtime needs to run a GGUF language model offline."""

    architecture: str
    context_length: int  # tokens the model was trained for
    chat_template: str | None = None
    quantization: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)  # default sampling settings, as SamplingParams names them

    def __post_init__(self) -> None:
        # Typed and bounded here, whoever builds the spec: a bad default never reaches llama.cpp.
        SamplingParams.check_defaults(self.sampling, "manifest llm.sampling")

    @classmethod
    def from_dict(cls, data: Any) -> LLMSpec:
        where = "manifest llm"
        if not isinstance(data, dict):
            raise BadInput("manifest: field 'llm' must be an object")
        ctx = _require(data, "context_length", int, where)
        if not 0 < ctx <= INT32_MAX:  # llama.cpp's context fields are 32-bit
            raise BadInput(f"{where}: context_length {ctx!r:.80} must be in [1, {INT32_MAX}] tokens")
        template = data.get("chat_template")
        if template is not None and not isinstance(template, str):
            raise BadInput(f"{where}: chat_template must be a string or null")
        return cls(
            architecture=_require(data, "architecture", str, where),
            context_length=ctx,
            chat_template=template,
            quantization=_text(data, "quantization", "", where),
            sampling=data.get("sampling", {}),
        )


class Layout(str, enum.Enum):
    NHWC = "nhwc"
    NCHW = "nchw"


class ColorOrder(str, enum.Enum):
    RGB = "rgb"
    BGR = "bgr"


class ResizeMode(str, enum.Enum):
    STRETCH = "stretch"  # resize the whole image to size x size, ignoring aspect
    CENTER_CROP = "center-crop"  # shorter side to size / crop_fraction, then the central size x size


TENSOR_DTYPES = ("float32", "int8", "uint8")
ZERO_POINTS = {"float32": (0, 0), "int8": (-128, 127), "uint8": (0, 255)}  # what each dtype can hold


def _finite(value: Any) -> bool:
    """A number that is a finite float: not a bool, not NaN or +-inf, not an integer past the float range."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _floats(data: dict[str, Any], key: str, default: tuple[float, ...], where: str) -> tuple[float, ...]:
    value = data.get(key, list(default))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or len(value) not in (1, 3) or not all(_finite(v) for v in value):
        raise BadInput(f"{where}: {key} must be 1 or 3 numbers, all finite, got {value!r:.80}")
    return tuple(float(v) for v in value)


@dataclass(frozen=True)
class TensorQuant:
    """dtype of a model input/output and, for integer tensors, real = scale * (q - zero_point)."""

    dtype: str = "float32"
    scale: float = 0.0  # 0 for float tensors
    zero_point: int = 0

    @classmethod
    def from_dict(cls, data: Any, where: str) -> TensorQuant:
        if not isinstance(data, dict):
            raise BadInput(f"{where} must be an object with dtype, scale, zero_point")
        dtype = data.get("dtype", "float32")
        if dtype not in TENSOR_DTYPES:
            raise BadInput(f"{where}: dtype {dtype!r} is not valid (valid: {', '.join(TENSOR_DTYPES)})")
        scale = data.get("scale", 0.0)
        zp = data.get("zero_point", 0)
        if not _finite(scale) or scale < 0:
            raise BadInput(f"{where}: scale {scale!r:.80} must be a finite number >= 0")
        low, high = ZERO_POINTS[dtype]
        if not isinstance(zp, int) or isinstance(zp, bool) or not low <= zp <= high:
            raise BadInput(f"{where}: zero_point {zp!r:.80} must be an integer in [{low}, {high}] for {dtype}")
        if dtype != "float32" and scale == 0:
            raise BadInput(f"{where}: an {dtype} tensor needs a positive scale")
        return cls(dtype, float(scale), zp)


@dataclass(frozen=True)
class VisionSpec:
    """How the runtime turns an image into the model's input and its output into labels.

    Normalization follows TFLite metadata: input = (pixel - mean) / std with pixels
    in 0..255 and one value or one per channel (in ``color_order``).
    """

    size: int  # square input side, pixels
    layout: Layout = Layout.NCHW
    color_order: ColorOrder = ColorOrder.RGB
    resize: ResizeMode = ResizeMode.CENTER_CROP
    crop_fraction: float = 0.875  # CENTER_CROP: the crop is this fraction of the resized shorter side
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    input: TensorQuant = field(default_factory=TensorQuant)
    output: TensorQuant = field(default_factory=TensorQuant)
    output_is_logits: bool = True  # softmax before reporting scores
    labels: str | None = None  # bundle file (role "labels"), one label per line
    quantization: str = ""  # the recipe: int8, int4w, fp16, float
    arena_bytes: int = 0  # measured activation/tensor bytes at batch 1 (0: unknown)

    @classmethod
    def from_dict(cls, data: Any) -> VisionSpec:
        where = "manifest vision"
        if not isinstance(data, dict):
            raise BadInput("manifest: field 'vision' must be an object")
        size = _require(data, "size", int, where)
        if not 8 <= size <= 4096:
            raise BadInput(f"{where}: size {size} must be 8..4096 pixels")
        std = _floats(data, "std", (1.0,), where)
        if any(s <= 0 for s in std):
            raise BadInput(f"{where}: std {list(std)} must be positive")
        crop = data.get("crop_fraction", 0.875)
        if not _finite(crop) or not 0.1 <= crop <= 1.0:
            raise BadInput(f"{where}: crop_fraction {crop!r:.80} must be in 0.1..1.0")
        labels = data.get("labels")
        if labels is not None and (not isinstance(labels, str) or not FILE_RE.fullmatch(labels)):
            raise BadInput(f"{where}: labels {labels!r} must be a bundle file name or null")
        arena = _count(data, "arena_bytes", where)
        return cls(
            size=size,
            layout=_enum(Layout, data.get("layout", "nchw"), "vision layout"),
            color_order=_enum(ColorOrder, data.get("color_order", "rgb"), "vision color_order"),
            resize=_enum(ResizeMode, data.get("resize", "center-crop"), "vision resize"),
            crop_fraction=float(crop),
            mean=_floats(data, "mean", (0.0,), where),
            std=std,
            input=TensorQuant.from_dict(data.get("input", {}), f"{where} input"),
            output=TensorQuant.from_dict(data.get("output", {}), f"{where} output"),
            output_is_logits=_flag(data, "output_is_logits", True, where),
            labels=labels,
            quantization=_text(data, "quantization", "", where),
            arena_bytes=arena,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(layout=self.layout.value, color_order=self.color_order.value, resize=self.resize.value,
                    mean=list(self.mean), std=list(self.std))
        return data


@dataclass(frozen=True)
class AudioSpec:
    """How the runtime turns a WAV file into the model's inputs and its outputs into labels.

    ``frontend`` names the feature front end (:mod:`runtime.audio`); its model
    files, if any, are bundle files listed in ``frontend_files`` in order.
    A one-output model is a detector: its score is a probability and counts as
    detected at ``threshold``.
    """

    sample_rate: int
    frontend: str
    input_shape: tuple[int, ...]  # one window, without the batch dimension
    frontend_files: tuple[str, ...] = ()
    input: TensorQuant = field(default_factory=TensorQuant)
    output: TensorQuant = field(default_factory=TensorQuant)
    output_is_logits: bool = False
    threshold: float = 0.5
    labels: str | None = None
    quantization: str = ""
    arena_bytes: int = 0
    frontend_arena_bytes: int = 0  # the front end's activation peak per call (ONNX Runtime)

    @classmethod
    def from_dict(cls, data: Any) -> AudioSpec:
        from runtime.audio import FrontEnd

        where = "manifest audio"
        if not isinstance(data, dict):
            raise BadInput("manifest: field 'audio' must be an object")
        rate = _require(data, "sample_rate", int, where)
        if not 1000 <= rate <= 384_000:
            raise BadInput(f"{where}: sample_rate {rate} must be 1000..384000 Hz")
        shape = _require(data, "input_shape", list, where)
        if not 0 < len(shape) <= 8 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape) \
                or math.prod(shape) > INT32_MAX:  # the backends' dimensions and element counts are 32-bit
            raise BadInput(f"{where}: input_shape {shape!r:.80} must be 1 to 8 positive integers, "
                           f"at most {INT32_MAX} elements in all")
        files = _require(data, "frontend_files", list, where) if "frontend_files" in data else []
        labels = data.get("labels")
        for name in [*files, "labels" if labels is None else labels]:
            if not isinstance(name, str) or not FILE_RE.fullmatch(name):
                raise BadInput(f"{where}: file name {name!r} is not a flat bundle file name")
        threshold = data.get("threshold", 0.5)
        if not _finite(threshold) or not 0.0 < threshold < 1.0:
            raise BadInput(f"{where}: threshold {threshold!r:.80} must be between 0 and 1")
        arena = _count(data, "arena_bytes", where)
        return cls(
            sample_rate=rate,
            frontend=_enum(FrontEnd, _require(data, "frontend", str, where), "audio frontend").value,
            input_shape=tuple(shape),
            frontend_files=tuple(files),
            input=TensorQuant.from_dict(data.get("input", {}), f"{where} input"),
            output=TensorQuant.from_dict(data.get("output", {}), f"{where} output"),
            output_is_logits=_flag(data, "output_is_logits", False, where),
            threshold=float(threshold),
            labels=labels,
            quantization=_text(data, "quantization", "", where),
            arena_bytes=arena,
            frontend_arena_bytes=_count(data, "frontend_arena_bytes", where),
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(input_shape=list(self.input_shape), frontend_files=list(self.frontend_files))
        return data


class ModelFormat(str, enum.Enum):
    """The model file formats the backends load."""

    GGUF = "gguf"
    TFLITE = "tflite"
    ONNX = "onnx"
    NULL = "null"  # runtime/backends/null.py: a JSON description of the input and output tensors


BACKEND_FORMAT = {name: ModelFormat(spec.model_format) for name, spec in BACKENDS.items()}  # the one format each backend loads

def _object(data: dict[str, Any], key: str, where: str = "manifest") -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise BadInput(f"{where}: field {key!r} must be an object, got {type(value).__name__} {value!r:.80}")
    return value


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
            data["llm"] = asdict(self.llm)
        if self.vision is not None:
            data["vision"] = self.vision.to_dict()
        if self.audio is not None:
            data["audio"] = self.audio.to_dict()
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
        schema = _require(data, "schema_version", int)
        if schema != SCHEMA_VERSION:
            raise BadInput(f"manifest: schema_version {schema} is not supported (this edgerun reads {SCHEMA_VERSION})")
        kind = _enum(ModelKind, _require(data, "kind", str), "kind")
        files_raw = _require(data, "files", list)
        if not files_raw:
            raise BadInput("manifest: 'files' is empty; a bundle holds at least one file")
        files = tuple(FileEntry.from_dict(f, i) for i, f in enumerate(files_raw))
        seen = [f.path for f in files]
        if len(set(seen)) != len(seen):
            raise BadInput(f"manifest: a file is listed twice in {seen}")
        llm = LLMSpec.from_dict(data["llm"]) if "llm" in data else None
        if kind == ModelKind.LLM and llm is None:
            raise BadInput("manifest: kind 'llm' requires an 'llm' section (architecture, context_length)")
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
        backend = _enum(BackendName, _require(data, "backend", str), "backend")
        model_format = _enum(ModelFormat, _require(data, "model_format", str), "model_format")
        expected = BACKEND_FORMAT.get(backend)
        if expected is not None and model_format is not expected:
            raise BadInput(f"manifest: backend {backend.value!r} loads {expected.value} models, "
                           f"not model_format {model_format.value!r}")
        return cls(
            kind=kind,
            backend=backend,
            model_format=model_format.value,
            name=check_name(_require(data, "name", str)),
            version=check_version(_require(data, "version", str)),
            files=files,
            license=_text(data, "license", "unknown", "manifest"),
            llm=llm,
            vision=vision,
            audio=audio,
            source=_object(data, "source"),
            reports=_object(data, "reports"),
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
