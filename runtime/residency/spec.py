"""What the residency manager is asked to hold: a :class:`ModelSpec` of a :class:`ResidentKind`, and the
:class:`Loader` contract each kind's loader keeps.

This module imports nothing of the manager nor of the loaders, so that both can import it: the manager
(runtime.residency.manager) takes specs and calls loaders; the loaders (runtime.residency.loaders) are typed
against the spec; neither imports the other at module level.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

DEFAULT_KEEP_ALIVE_S = 300.0  # Ollama's default keep_alive: 5 minutes


class ResidentKind(enum.StrEnum):
    """The kinds of model the default loaders hold, one loader each (runtime.residency.loaders.LOADERS).
    A member is its string: ``ModelSpec(..., kind="llm")`` and ``kind=ResidentKind.LLM`` are the same spec."""

    LLM = "llm"  # a GGUF model as runtime.serving.engine.Engine
    VISION = "vision"  # runtime.classify.classifier.Classifier
    AUDIO = "audio"  # runtime.classify.audio_classifier.AudioClassifier
    ANOMALY = "anomaly"  # runtime.classify.anomaly.AnomalyDetector
    ASR = "asr"  # runtime.speech.asr.ASR
    VAD = "vad"  # runtime.speech.vad.SileroVAD
    TTS = "tts"  # runtime.speech.tts.PiperTTS


@dataclass(frozen=True)
class ModelSpec:
    """A model the manager may load. ``name``: the public name callers acquire (a valid store name);
    ``ref``: what :func:`runtime.bundle.resolve.resolve` takes (installed name[@version], bundle dir, .gguf);
    ``kind``: a loader's key (a :class:`ResidentKind` with the default loaders: "llm", "vision", "audio", ...);
    ``keep_alive_s``: seconds idle before :meth:`~runtime.residency.manager.ResidencyManager.sweep` unloads it
    (None: never; 0: at once); ``options``: the loader's (llm: ctx per slot, slots, max_queued, threads, target,
    kv_type, prefix_cache_bytes; vision: batch, threads, target; audio: threads, target; see
    :mod:`runtime.residency.loaders`)."""

    name: str
    ref: str
    kind: str
    pinned: bool = False
    keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S
    options: Mapping[str, Any] = field(default_factory=dict)


class Loader(Protocol):
    """Plans and loads one kind of model. ``plan_bytes``: the model's plan total in bytes within ``budget``
    (DoesNotFit/BadInput when it cannot be planned); ``load``: the loaded object (it has ``close()``),
    given ``budget`` = the planned bytes plus that share's reserve. Optionally ``shared_bytes(spec)``:
    the parts of the plan that are process-wide libraries, ``{library: bytes}``, counted once."""

    def plan_bytes(self, spec: ModelSpec, budget: int) -> int: ...

    def load(self, spec: ModelSpec, budget: int) -> Any: ...
