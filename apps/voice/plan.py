"""The one memory plan of the voice assistant: every resident model, planned before anything loads.

The models (wake word, VAD, ASR, the LLM with its bounded KV cache, TTS) are planned by the residency manager's own
loaders (runtime.residency.loaders), each against the whole budget, and summed as the manager sums them: each
model's own memory, each library's runtime term once (llama.cpp, ONNX Runtime, CTranslate2...), plus the budget's
5 % reserve. When the sum passes the budget the assistant does not start: DoesNotFit names the model to shrink,
the largest one's own memory, and by how much. When it fits, :func:`open_residency` registers the same specs,
pinned, in a :class:`~runtime.residency.manager.ResidencyManager`, which checks the same sum again.

espeak-ng (the fallback voice) is a subprocess: it holds no memory of this process and is not in the plan.

Measured against the assistant's own process (``scripts/speech_memory.py --assistant``), so that the plan bounds the
peak without counting anything twice:

* the LLM holds no prefix cache (``prefix_cache_bytes`` 0): the conversation is one slot, and each turn's prompt
  extends the last one, so the live KV cache already serves it; a saved prefix state would never be used, and would
  hold up to the planner's default bound (64 MiB) of copies of that KV cache in a long session;
* the wake word is planned as the assistant runs it (:class:`WakeLoader`): a few windows scored each 160 ms hop, not
  ``edgerun classify``'s 30 s segments, and its libraries as the speech models' are (runtime.speech.models): what
  importing and starting them adds to the assistant's process, whose interpreter, numpy and edgerun are the LLM's
  runtime term already. A library's classifier term (runtime.classify.plan) is measured over a bare numpy process,
  so it holds them once more.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.errors import BadInput, DoesNotFit
from runtime.llm.plan import RESERVE_FRACTION
from runtime.residency.loaders import LoadOptions, PlannedLoader, default_loaders
from runtime.residency.manager import Loader, ModelSpec, ResidencyManager, ResidentKind, summed_bytes
from runtime.units import fmt_bytes

if TYPE_CHECKING:  # the type only: its module loads the classifier backends
    from runtime.classify.audio_classifier import AudioClassifier

log = logging.getLogger(__name__)

ESPEAK = "espeak-ng"  # the TTS ref that is a subprocess, not a resident model
WAKE = "wake"  # the assistant's own model kind (WakeLoader), beside the residency manager's ResidentKind
DEFAULT_CTX = 1024  # tokens of conversation memory (the LLM's one slot)
# The wake-word detector scores every 5 frames of 32 ms, 160 ms (openWakeWord steps 80 ms; a wake word lasts ~0.6 s):
# the hop fixes the windows one score holds (hop_windows), so it is part of the plan (apps/voice/models.py runs it).
WAKE_HOP_FRAMES = 5
SHRINK_HINTS = {ResidentKind.LLM: "a smaller --llm, or a smaller --ctx", ResidentKind.ASR: "a smaller --asr model",
                ResidentKind.TTS: "--tts espeak-ng", WAKE: "another --wake-word, or none",
                ResidentKind.VAD: "(the VAD is already tiny)"}
# What importing ai-edge-litert adds to the assistant's process (2.3.0, x86_64, scripts/speech_memory.py --assistant:
# 8.1 MiB); its interpreter's arena and the model are the wake row's own.
LITERT_RUNTIME_BYTES = 10 << 20


@dataclass(frozen=True)
class VoiceModels:
    """Which models the assistant runs. ``wake`` None: no wake word (every utterance is a turn)."""

    llm: str = "default"
    asr: str = "default"
    vad: str = "default"
    tts: str = "default"
    wake: str | None = None
    ctx: int = DEFAULT_CTX
    threads: int | None = None  # the LLM's and ASR's CPU threads (default: their placements')

    def specs(self) -> list[ModelSpec]:
        threads = {"threads": self.threads} if self.threads else {}
        specs = [ModelSpec("vad", self.vad, ResidentKind.VAD, pinned=True, keep_alive_s=None),
                 ModelSpec("asr", self.asr, ResidentKind.ASR, pinned=True, keep_alive_s=None, options=threads),
                 ModelSpec("llm", self.llm, ResidentKind.LLM, pinned=True, keep_alive_s=None,
                           options={"ctx": self.ctx, "slots": 1, "prefix_cache_bytes": 0, **threads})]  # see above
        if self.tts != ESPEAK:
            specs.append(ModelSpec("tts", self.tts, ResidentKind.TTS, pinned=True, keep_alive_s=None))
        if self.wake is not None:
            specs.insert(0, ModelSpec("wake", self.wake, WAKE, pinned=True, keep_alive_s=None))
        return specs


@dataclass(frozen=True)
class WakePlan:
    """The wake word's plan: its own memory plus its libraries' terms over the assistant's process."""

    total_bytes: int
    libraries: Mapping[str, int]  # library -> runtime bytes


class WakeLoader(PlannedLoader[WakePlan, "AudioClassifier"]):
    """kind "wake": an openWakeWord detector bundle (runtime.classify.audio_classifier.AudioClassifier) as the assistant's
    detector runs it (apps/voice/models.py): its files, its front end's arena, the head's arena for the windows one
    hop scores, and its libraries' terms over the assistant's process (module docstring). Options: threads."""

    KIND = WAKE
    OPTIONS = ("threads",)

    def _plan(self, spec: ModelSpec, opts: LoadOptions, budget: int) -> WakePlan:
        from devices.backends import BackendName
        from runtime.bundle.manifest import ModelKind
        from runtime.bundle.resolve import resolve
        from runtime.classify.plan import plan_classifier
        from runtime.speech.models import ORT_RUNTIME_BYTES

        manifest = resolve(spec.ref).manifest
        if manifest.kind != ModelKind.AUDIO or manifest.audio is None:
            raise BadInput(f"--wake-word {spec.ref}: {manifest.ref} is a {manifest.kind.value} bundle, not an audio "
                           "(wake-word) bundle")
        sizes = {f.path: f.size for f in manifest.files}
        weights = manifest.file("weights").size + sum(sizes[n] for n in manifest.audio.frontend_files)
        plan = plan_classifier(manifest, weights, budget, batch=hop_windows())
        libraries = {BackendName.ORT.value: ORT_RUNTIME_BYTES}  # the front end runs on ONNX Runtime
        if manifest.backend is BackendName.LITERT:
            libraries[BackendName.LITERT.value] = LITERT_RUNTIME_BYTES
        own = plan.total_bytes - plan.runtime_bytes
        return WakePlan(own + sum(libraries.values()), libraries)

    def _shared(self, plan: WakePlan) -> Mapping[str, int]:
        return plan.libraries

    def _open(self, spec: ModelSpec, opts: LoadOptions, plan: WakePlan, budget: int) -> AudioClassifier:
        from runtime.classify.audio_classifier import AudioClassifier

        return AudioClassifier.load(spec.ref, threads=opts.threads)

    def _admit(self, spec: ModelSpec, obj: AudioClassifier, plan: WakePlan) -> AudioClassifier:
        # AudioClassifier plans classify's 30 s segments against its memory, not the hop this plan is for: its own
        # plan total differs by design, and this plan is the one the manager holds.
        return obj


def hop_windows() -> int:
    """The head's windows one step of the assistant's detector scores: an embedding every 80 ms / PHASES over one
    hop of WAKE_HOP_FRAMES (apps/voice/models.py, apps/voice/wake.py)."""
    import math

    from apps.voice.types import FRAME_SAMPLES, SAMPLE_RATE
    from apps.voice.wake import PHASES

    return math.ceil(WAKE_HOP_FRAMES * FRAME_SAMPLES / SAMPLE_RATE / 0.08 * PHASES) + 1


def voice_loaders(loaders: Mapping[str, Loader] | None = None) -> dict[str, Loader]:
    """``loaders`` (default: the residency manager's) with the assistant's wake-word loader."""
    if loaders is None:
        loaders = default_loaders()
    return dict(loaders) if WAKE in loaders else {**loaders, WAKE: WakeLoader()}


@dataclass(frozen=True)
class Row:
    spec: ModelSpec
    planned: int  # the model's plan total, its runtime included
    shared: Mapping[str, int]  # library -> runtime bytes (counted once over all rows)

    @property
    def own(self) -> int:
        return self.planned - sum(self.shared.values())


@dataclass(frozen=True)
class VoicePlan:
    budget: int
    rows: list[Row]
    libraries: dict[str, int] = field(default_factory=dict)  # library -> runtime bytes, once

    @property
    def reserve(self) -> int:
        return int(self.budget * RESERVE_FRACTION)

    @property
    def total(self) -> int:
        """Summed as the residency manager sums: own memory + each library once (the reserve not included)."""
        return summed_bytes(self.rows)  # type: ignore[arg-type]  # Row has the fields summed_bytes reads

    @property
    def fits(self) -> bool:
        return self.total + self.reserve <= self.budget

    def largest(self) -> Row:
        return max(self.rows, key=lambda r: r.own)

    def refusal(self) -> DoesNotFit:
        over = self.total + self.reserve - self.budget
        big = self.largest()
        return DoesNotFit(f"the voice models need {fmt_bytes(self.total)} plus a {fmt_bytes(self.reserve)} reserve, "
                          f"{fmt_bytes(over)} over the {fmt_bytes(self.budget)} budget; shrink {big.spec.name} "
                          f"({big.spec.ref}, {fmt_bytes(big.own)} of its own): {SHRINK_HINTS.get(big.spec.kind, '')}, "
                          f"or give a larger --memory")

    def lines(self) -> list[str]:
        out = [f"{'model':<6} {'kind':<6} {'ref':<28} {'own':>11}  runtime (counted once per library)"]
        for r in self.rows:
            libs = ", ".join(f"{lib} {fmt_bytes(b)}" for lib, b in r.shared.items()) or "-"
            out.append(f"{r.spec.name:<6} {r.spec.kind:<6} {r.spec.ref[:28]:<28} {fmt_bytes(r.own):>11}  {libs}")
        out.append(f"{'libraries':<42} {fmt_bytes(sum(self.libraries.values())):>11}  "
                   + ", ".join(f"{lib} {fmt_bytes(b)}" for lib, b in self.libraries.items()))
        out.append(f"{'reserve (5 %)':<42} {fmt_bytes(self.reserve):>11}")
        out.append(f"{'total':<42} {fmt_bytes(self.total + self.reserve):>11}  of {fmt_bytes(self.budget)} budget: "
                   + ("fits" if self.fits else "DOES NOT FIT"))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget, "reserve_bytes": self.reserve, "total_bytes": self.total, "fits": self.fits,
                "libraries": dict(self.libraries),
                "models": [{"name": r.spec.name, "kind": r.spec.kind, "ref": r.spec.ref, "planned_bytes": r.planned,
                            "own_bytes": r.own, "runtime": dict(r.shared)} for r in self.rows]}


def plan_voice(models: VoiceModels, budget: int, loaders: Mapping[str, Loader] | None = None) -> VoicePlan:
    """Plan every model (nothing is loaded). A model that cannot be planned even alone raises its planner's error
    (DoesNotFit names it); whether the sum fits is :attr:`VoicePlan.fits`."""
    loaders = voice_loaders(loaders)
    rows = []
    for spec in models.specs():
        loader = loaders[spec.kind]
        try:
            planned = int(loader.plan_bytes(spec, budget))
        except DoesNotFit as exc:
            raise DoesNotFit(f"{spec.name} ({spec.ref}) alone does not fit: {exc}; shrink it: "
                             f"{SHRINK_HINTS.get(spec.kind, '')}, or give a larger --memory") from None
        shared = dict(loader.shared_bytes(spec)) if hasattr(loader, "shared_bytes") else {}
        rows.append(Row(spec, planned, shared))
    libraries: dict[str, int] = {}
    for r in rows:
        for lib, size in r.shared.items():
            libraries[lib] = max(libraries.get(lib, 0), size)
    return VoicePlan(budget, rows, libraries)


def open_residency(plan: VoicePlan, loaders: Mapping[str, Loader] | None = None) -> ResidencyManager:
    """The residency manager holding ``plan``'s models, pinned (loaded on first acquire); DoesNotFit (naming the
    model to shrink) when the plan does not fit."""
    if not plan.fits:
        raise plan.refusal()
    manager = ResidencyManager(plan.budget, loaders=voice_loaders(loaders))
    try:
        for r in plan.rows:
            manager.add(r.spec)
    except BaseException:
        manager.close()
        raise
    return manager
