"""Image classifiers from vision bundles: resolve, plan, place, load, then labels and scores for images.

The bundle's manifest says how an image becomes the model's input (size, crop,
color order, mean/std, layout, input quantization) and how the output becomes
scores (output dequantization, softmax of logits); :mod:`runtime.classify.preprocess`
applies exactly that. Backends are found by the manifest's backend name and
imported only then.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from devices.backends import BACKENDS, serving
from runtime.backends import open_backend as open_named
from runtime.backends.base import ClassifierBackend, Placed
from runtime.bundle.manifest import Manifest, ModelKind
from runtime.bundle.resolve import ResolvedModel, resolve
from runtime.bundle.specs.tensor import TensorQuant
from runtime.classify import preprocess
from runtime.classify.plan import ClassifierPlan, plan_classifier
from runtime.errors import BadInput

log = logging.getLogger(__name__)
DEFAULT_TOP_K = 5
QUANT_TOLERANCE = 1e-3  # relative: the manifest's scale against the model's own


@dataclass(frozen=True)
class Prediction:
    source: str  # the file (or "image N")
    labels: tuple[preprocess.Label, ...]  # best first

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.source, "labels": [lab.to_dict() for lab in self.labels]}


def open_backend(model: ResolvedModel, plan: ClassifierPlan | None, placement: Placed) -> ClassifierBackend:
    """The bundle's backend on its verified weights (runtime.bundle.checked_open), told ``plan`` and ``placement``."""
    backend = model.manifest.backend
    if model.manifest.kind.value not in BACKENDS[backend].kinds:
        valid = ", ".join(b.value for b in serving(model.manifest.kind.value))
        raise BadInput(f"{model.manifest.ref}: backend {backend.value!r} cannot run a classifier (valid: {valid})")
    return model.load(lambda paths: open_named(backend, paths[0], plan, placement), model.manifest.file("weights").path)


T = TypeVar("T")


def load_classifier(
    ref: str,
    kind: ModelKind,
    wrong_kind: str,
    *,
    plan: Callable[[Manifest], ClassifierPlan],
    build: Callable[[ResolvedModel, ClassifierBackend, Any, ClassifierPlan, list[str], Any], T],
    open_extra: Callable[[ResolvedModel, Any], Any] | None = None,
    threads: int | None,
    target: str,
    require_accelerator: bool,
    busy_threads: int,
) -> T:
    """The load path of every classifier kind (vision, audio), in this order: resolve and check the bundle,
    refuse it by kind (``wrong_kind`` ends the line), ``plan`` its memory (refused before anything is opened),
    resolve the placement, read the labels, open ``open_extra`` (the audio front end: model and placement in,
    something with ``close()`` out), open the backend on the verified weights and measure the placement;
    ``build(model, backend, placement, plan, labels, extra)`` makes the object. Whatever was opened is closed
    when a later step fails."""
    from devices.placement import resolve_placement

    model = resolve(ref)
    manifest = model.manifest
    spec = getattr(manifest, kind.value)
    if manifest.kind is not kind or spec is None:
        raise BadInput(f"{manifest.ref} is a {manifest.kind.value} bundle{wrong_kind}")
    memory_plan = plan(manifest)
    placement = resolve_placement(manifest.backend.value, target, require_accelerator=require_accelerator, threads=threads,
                                  int8=spec.quantization == "int8", busy_threads=busy_threads)
    labels = read_labels(model, spec.labels)
    with contextlib.ExitStack() as undo:
        extra = None
        if open_extra is not None:
            extra = open_extra(model, placement)
            undo.callback(extra.close)
        backend = open_backend(model, memory_plan, placement)
        undo.callback(backend.close)
        placement = placement.loaded(backend.offload(), require_accelerator=require_accelerator)
        log.info("%s", placement.summary())
        loaded = build(model, backend, placement, memory_plan, labels, extra)
        undo.pop_all()
    return loaded


def read_labels(model: ResolvedModel, name: str | None) -> list[str]:
    """The bundle's labels file ``name`` as it was verified; no labels without one."""
    if not name:
        return []
    with model.opened(name) as (path,):
        return preprocess.read_labels(path)


def takes(model: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Whether a model input of dimensions ``model`` (-1 where dynamic) takes rows of shape ``want``."""
    return len(model) == len(want) and all(m in (-1, w) for m, w in zip(model, want, strict=True))


def check_quant(ref: str, what: str, declared: TensorQuant, dtype: str, scale: float, zero: int) -> None:
    if declared.dtype != dtype:
        raise BadInput(f"{ref}: the manifest says the {what} is {declared.dtype}, the model file says {dtype}")
    if dtype != "float32" and (abs(declared.scale - scale) > QUANT_TOLERANCE * scale or declared.zero_point != zero):
        raise BadInput(f"{ref}: {what} quantization in the manifest (scale {declared.scale}, zero point {declared.zero_point}) "
                       f"differs from the model's (scale {scale}, zero point {zero})")


class Classifier:
    def __init__(self, model: ResolvedModel, backend: ClassifierBackend, placement: Any, plan: ClassifierPlan, labels: list[str]) -> None:
        self.model, self.backend, self.placement, self.plan, self.labels = model, backend, placement, plan, labels
        spec = model.manifest.vision
        assert spec is not None
        self.spec = spec
        i, o = backend.input, backend.output
        check_quant(model.manifest.ref, "input", spec.input, i.dtype, i.scale, i.zero_point)
        check_quant(model.manifest.ref, "output", spec.output, o.dtype, o.scale, o.zero_point)
        want = (3, spec.size, spec.size) if spec.layout.value == "nchw" else (spec.size, spec.size, 3)
        if not takes(i.shape[1:], want):
            raise BadInput(f"{model.manifest.ref}: the model takes {i.shape}, "
                           f"the manifest's {spec.layout.value} {spec.size}px says (N, {', '.join(map(str, want))})")

    @classmethod
    def load(
        cls,
        ref: str,
        *,
        threads: int | None = None,
        target: str = "auto",
        require_accelerator: bool = False,
        memory: int | None = None,
        batch: int = 1,
        resident_bytes: int = 0,
        busy_threads: int = 0,
    ) -> Classifier:
        """``resident_bytes``, ``busy_threads``: the memory and the CPU threads of models already resident in this
        process (a llama.cpp model's), planned beside this one; ORT's threads do not spin beside busy ones."""
        from runtime.llm.plan import default_budget

        return load_classifier(
            ref, ModelKind.VISION, "; Classifier takes vision bundles (audio: runtime.classify.audio_classifier.AudioClassifier)",
            plan=lambda m: plan_classifier(m, m.file("weights").size, memory or default_budget(), batch=batch,
                                           resident_bytes=resident_bytes),
            build=lambda model, backend, placement, plan, labels, _: cls(model, backend, placement, plan, labels),
            threads=threads, target=target, require_accelerator=require_accelerator, busy_threads=busy_threads)

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Float batch in model layout (before input quantization) -> class scores, one row per input."""
        raw = self.backend.run(preprocess.quantize(x, self.spec.input))
        y = preprocess.dequantize(raw, self.spec.output).reshape(len(x), -1)
        return preprocess.softmax(y) if self.spec.output_is_logits else y

    def predict(self, images: list[np.ndarray], k: int = DEFAULT_TOP_K, names: list[str] | None = None) -> list[Prediction]:
        if not images:
            raise BadInput("no images to classify")
        scores = self.scores(preprocess.image_tensor(images, self.spec))
        names = names or [f"image {i}" for i in range(len(images))]
        return [Prediction(names[i], tuple(preprocess.top_k(row, self.labels, k))) for i, row in enumerate(scores)]

    def classify_files(self, paths: list[Path | str], k: int = DEFAULT_TOP_K) -> list[Prediction]:
        images = [preprocess.load_rgb(p) for p in paths]  # every file decodes before any runs
        return self.predict(images, k, [str(p) for p in paths])

    def latency(self, x: np.ndarray, runs: int, warmup: int = 3) -> list[float]:
        """Seconds per backend call on ``x`` (already in model layout and dtype), after ``warmup`` calls."""
        return time_calls(self.backend, x, runs, warmup)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> Classifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def time_calls(backend: Any, x: np.ndarray, runs: int, warmup: int = 3) -> list[float]:
    """Seconds per ``backend.run(x)`` over ``runs`` calls, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        backend.run(x)
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        backend.run(x)
        out.append(time.perf_counter() - start)
    return out
