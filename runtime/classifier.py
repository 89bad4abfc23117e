"""Image classifiers from vision bundles: resolve, plan, place, load, then labels and scores for images.

The bundle's manifest says how an image becomes the model's input (size, crop,
color order, mean/std, layout, input quantization) and how the output becomes
scores (output dequantization, softmax of logits); :mod:`runtime.preprocess`
applies exactly that. Backends are found by the manifest's backend name and
imported only then.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime import preprocess
from runtime.backends.base import ClassifierBackend
from runtime.bundle import BackendName, ModelKind, TensorQuant
from runtime.errors import BadInput
from runtime.resolve import ResolvedModel, resolve
from runtime.vision_plan import ClassifierPlan, plan_classifier

log = logging.getLogger(__name__)
DEFAULT_TOP_K = 5
# backend name -> (module, class); imported only when a bundle asks for it.
BACKENDS = {
    BackendName.LITERT: ("runtime.backends.litert", "LiteRTBackend"),
    BackendName.ORT: ("runtime.backends.ort", "ORTBackend"),
    BackendName.NULL: ("runtime.backends.null", "NullBackend"),
}
QUANT_TOLERANCE = 1e-3  # relative: the manifest's scale against the model's own


@dataclass(frozen=True)
class Prediction:
    source: str  # the file (or "image N")
    labels: tuple[preprocess.Label, ...]  # best first

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.source, "labels": [lab.to_dict() for lab in self.labels]}


def open_backend(model: ResolvedModel, placement: Any) -> ClassifierBackend:
    backend = model.manifest.backend
    if backend not in BACKENDS:
        valid = ", ".join(b.value for b in BACKENDS)
        raise BadInput(f"{model.manifest.ref}: backend {backend.value!r} cannot run a classifier (valid: {valid})")
    module, cls = BACKENDS[backend]
    factory = getattr(importlib.import_module(module), cls)

    def load(paths: list[Path]) -> ClassifierBackend:  # the verified file itself (runtime.checked_open)
        if backend is BackendName.LITERT:
            return factory(paths[0], threads=placement.threads, delegate=placement.delegate)
        if backend is BackendName.ORT:
            return factory(paths[0], threads=placement.threads, providers=placement.providers or ("CPUExecutionProvider",),
                           spin=not placement.shares_cores)
        return factory(paths[0], threads=placement.threads)

    return model.load(load, model.manifest.file("weights").path)


def read_labels(model: ResolvedModel, name: str | None) -> list[str]:
    """The bundle's labels file ``name`` as it was verified; no labels without one."""
    if not name:
        return []
    with model.opened(name) as (path,):
        return preprocess.read_labels(path)


def _check_quant(ref: str, what: str, declared: TensorQuant, dtype: str, scale: float, zero: int) -> None:
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
        _check_quant(model.manifest.ref, "input", spec.input, i.dtype, i.scale, i.zero_point)
        _check_quant(model.manifest.ref, "output", spec.output, o.dtype, o.scale, o.zero_point)
        want = (3, spec.size, spec.size) if spec.layout.value == "nchw" else (spec.size, spec.size, 3)
        if tuple(i.shape[1:]) != want:
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
        from devices.placement import resolve_placement
        from runtime.plan import default_budget

        model = resolve(ref)
        manifest = model.manifest
        if manifest.kind is not ModelKind.VISION:
            raise BadInput(f"{manifest.ref} is a {manifest.kind.value} bundle; Classifier takes vision bundles "
                           "(audio: runtime.audio_classifier.AudioClassifier)")
        budget = memory or default_budget()
        plan = plan_classifier(manifest, manifest.file("weights").size, budget, batch=batch, resident_bytes=resident_bytes)
        placement = resolve_placement(manifest.backend.value, target, require_accelerator=require_accelerator, threads=threads,
                                      int8=manifest.vision.quantization == "int8", busy_threads=busy_threads)
        labels = read_labels(model, manifest.vision.labels)
        backend = open_backend(model, placement)
        try:
            placement = placement.loaded(backend.offload(), require_accelerator=require_accelerator)
            log.info("%s", placement.summary())
            return cls(model, backend, placement, plan, labels)
        except BaseException:
            backend.close()
            raise

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
