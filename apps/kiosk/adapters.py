"""How the pipeline calls one kind of loaded model: a small adapter per bundle kind, chosen by the model's manifest.

``prepare`` turns one part's RGB image into what ``infer`` takes (a BadInput there is that part's corrupt frame,
not the batch's); ``infer`` runs the whole batch in one model call; ``rule`` applies the policy to one output.
Classifier bundles preprocess exactly as their manifest says (:mod:`runtime.classify.preprocess`); anomaly detectors
(:mod:`runtime.classify.anomaly`) take the RGB images and preprocess them themselves, by their manifest.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from apps.kiosk.policy import Policy, Ruling
from runtime.classify import preprocess
from runtime.errors import BadInput


def identity(model: Any) -> tuple[str, str, str]:
    """(name, version, kind) of a loaded model, from its bundle's manifest."""
    manifest = getattr(getattr(model, "model", None), "manifest", None)
    if manifest is None:
        raise BadInput(f"{type(model).__name__} is not a model loaded from a bundle (it has no manifest)")
    kind = getattr(manifest.kind, "value", str(manifest.kind))
    return str(manifest.name), str(manifest.version or ""), kind


def check_image(image: Any) -> None:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 \
            or 0 in image.shape:
        what = f"{image.dtype} {image.shape}" if isinstance(image, np.ndarray) else type(image).__name__
        raise BadInput(f"image is {what}, not uint8 HxWx3 RGB")


class Adapter(Protocol):
    def check(self, model: Any, policy: Policy) -> None: ...

    def prepare(self, model: Any, image: np.ndarray) -> Any: ...

    def infer(self, model: Any, prepared: list[Any]) -> list[Any]: ...

    def rule(self, model: Any, policy: Policy, output: Any) -> tuple[Ruling, np.ndarray | None]: ...


def _labels(model: Any) -> list[str]:
    return list(model.labels) or [f"class {i}" for i in range(int(np.prod(model.backend.output.shape[1:])))]


class ClassifierAdapter:
    """runtime.classify.classifier.Classifier: resize per the manifest per part, normalize + one scores() call per batch."""

    def check(self, model: Any, policy: Policy) -> None:
        name, _, _ = identity(model)
        policy.check_labels(_labels(model), f"model {name}")

    def prepare(self, model: Any, image: np.ndarray) -> Any:
        check_image(image)
        return preprocess.resize_rgb(image, model.spec)

    def infer(self, model: Any, prepared: list[Any]) -> list[Any]:
        # image_tensor's steps, split so that one bad image fails in prepare(), alone
        return list(model.scores(preprocess.normalize(np.stack(prepared), model.spec)))

    def rule(self, model: Any, policy: Policy, output: Any) -> tuple[Ruling, np.ndarray | None]:
        return policy.decide_classes(output, _labels(model)), None


class AnomalyAdapter:
    """runtime.classify.anomaly.AnomalyDetector: ``score(images) -> [(score, heatmap)]``; threshold from the bundle unless the
    policy sets one."""

    def check(self, model: Any, policy: Policy) -> None:
        policy.anomaly_threshold_for(getattr(model, "threshold", None))

    def prepare(self, model: Any, image: np.ndarray) -> Any:
        check_image(image)
        return image

    def infer(self, model: Any, prepared: list[Any]) -> list[Any]:
        return list(model.score(prepared))

    def rule(self, model: Any, policy: Policy, output: Any) -> tuple[Ruling, np.ndarray | None]:
        score, heatmap = output
        return policy.decide_anomaly(float(score), getattr(model, "threshold", None)), heatmap


ADAPTERS: dict[str, Adapter] = {"vision": ClassifierAdapter(), "anomaly": AnomalyAdapter()}


def adapter_for(model: Any) -> Adapter:
    _, _, kind = identity(model)
    adapter = ADAPTERS.get(kind)
    if adapter is None:
        raise BadInput(f"the kiosk decides with vision or anomaly bundles, not a {kind} bundle")
    return adapter
