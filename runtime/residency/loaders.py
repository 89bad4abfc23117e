"""The residency manager's loaders: plan a model against the whole budget, then load it with its share.

One loader class per :class:`~runtime.residency.spec.ResidentKind`, all in :data:`LOADERS`. Each is a
:class:`PlannedLoader`: it keeps the plan it made for a spec, so the load opens the same verified files and
asks its planner for the same plan (same context, KV type, prefix cache, batch) within ``budget`` = the plan's
total plus that share's reserve; it checks that the loaded object's own plan total equals what was planned,
and closes it and raises BackendError if not: the manager's sum must be the truth.

The loaded objects' modules (the engine, the classifiers, the speech models) are imported when a model of
their kind is planned or loaded, not with this module: importing the manager imports no backend library.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeVar

from devices.backends import BackendName
from runtime.bundle.manifest import Manifest, ModelKind
from runtime.bundle.resolve import ResolvedModel, resolve
from runtime.errors import BackendError, BadInput
from runtime.llm.plan import KVType, MemoryPlan
from runtime.residency.spec import Loader, ModelSpec, ResidentKind
from runtime.units import fmt_bytes

if TYPE_CHECKING:  # the loaded objects' types only: their modules load their backends' libraries
    from runtime.classify.anomaly import AnomalyDetector
    from runtime.classify.audio_classifier import AudioClassifier
    from runtime.classify.classifier import Classifier
    from runtime.classify.plan import ClassifierPlan
    from runtime.serving.engine import Engine
    from runtime.speech.asr import ASR
    from runtime.speech.models import SpeechPlan
    from runtime.speech.tts import PiperTTS
    from runtime.speech.vad import SileroVAD

log = logging.getLogger(__name__)

SpecKey = tuple[str, str, str, tuple[tuple[str, str], ...]]  # name, ref, kind, options (by repr: values may not hash)


def _key(spec: ModelSpec) -> SpecKey:
    return spec.name, spec.ref, spec.kind, tuple(sorted((k, repr(v)) for k, v in spec.options.items()))


COUNTS = ("ctx", "slots", "threads", "batch", "max_queued")  # options that are positive whole numbers


@dataclass(frozen=True)
class LoadOptions:
    """A spec's options, checked by :func:`check_options`; None: not given (the loader's or the model's default)."""

    ctx: int | None = None  # tokens per slot
    slots: int | None = None
    max_queued: int | None = None  # requests waiting per priority class
    threads: int | None = None
    batch: int | None = None
    target: str | None = None  # a placement target (devices.placement); "auto" when not given
    kv_type: KVType | None = None
    prefix_cache_bytes: int | None = None
    decode_bytes: int | None = None
    speculate: bool | None = None


def check_options(spec: ModelSpec, valid: tuple[str, ...]) -> LoadOptions:
    """``spec.options``, checked: known names only (``valid``: LoadOptions fields), counts positive integers,
    kv_type by name. BadInput in one line naming the option otherwise."""
    bad = sorted(set(spec.options) - set(valid))
    if bad:
        raise BadInput(f"{spec.name}: unknown {spec.kind} option {', '.join(map(repr, bad))} (valid: {', '.join(valid)})")
    opts = dict(spec.options)
    for name, value in opts.items():
        if value is None:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if name in COUNTS and not (whole and value > 0):
            raise BadInput(f"{spec.name}: option {name}={value!r} must be a positive whole number")
        if name in ("prefix_cache_bytes", "decode_bytes") and not (whole and value >= 0):
            raise BadInput(f"{spec.name}: option {name}={value!r} must be bytes >= 0")
        if name == "speculate" and not isinstance(value, bool):
            raise BadInput(f"{spec.name}: option speculate={value!r} must be true or false")
        if name == "kv_type" and value not in {k.value for k in KVType}:
            raise BadInput(f"{spec.name}: option kv_type={value!r} is not one of: {', '.join(k.value for k in KVType)}")
    if opts.get("kv_type") is not None:
        opts["kv_type"] = KVType(opts["kv_type"])
    return LoadOptions(**opts)


class Planned(Protocol):
    """A plan: what the manager admits is its total."""

    @property
    def total_bytes(self) -> int: ...


class Resident(Protocol):
    """A loaded model: it closes (the manager's unload); it carries the plan it was loaded with as ``plan``."""

    def close(self) -> None: ...


PlanT = TypeVar("PlanT", bound=Planned)
ModelT = TypeVar("ModelT", bound=Resident)


class PlannedLoader(Generic[PlanT, ModelT]):
    """Plan once, keep the plan, load with it, check the loaded object agrees: the one implementation of the
    residency manager's :class:`~runtime.residency.spec.Loader` contract.

    ``plan_bytes`` checks the options (``OPTIONS``), plans and keeps the plan by spec; ``shared_bytes`` is the
    kept plan's library terms; ``load`` plans first if the spec was not planned here, opens the model within
    ``budget`` (the plan's total plus its share's reserve) and refuses it (closed, BackendError) when its own
    plan total is not the one admitted. A kind writes the private half: ``_plan``, ``_open``, ``_shared``."""

    KIND: ClassVar[str]  # the ModelSpec.kind this loader serves (a ResidentKind for the default loaders)
    OPTIONS: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self._plans: dict[SpecKey, PlanT] = {}

    def plan_bytes(self, spec: ModelSpec, budget: int) -> int:
        plan = self._plan(spec, check_options(spec, self.OPTIONS), budget)
        self._plans[_key(spec)] = plan
        return plan.total_bytes

    def shared_bytes(self, spec: ModelSpec) -> Mapping[str, int]:
        return self._shared(self._plans[_key(spec)])

    def load(self, spec: ModelSpec, budget: int) -> ModelT:
        if _key(spec) not in self._plans:
            self.plan_bytes(spec, budget)
        plan = self._plans[_key(spec)]
        return self._admit(spec, self._open(spec, check_options(spec, self.OPTIONS), plan, budget), plan)

    def _admit(self, spec: ModelSpec, obj: ModelT, plan: PlanT) -> ModelT:
        """``obj`` if it was loaded with the plan it was admitted with; else closed, and BackendError."""
        got = getattr(getattr(obj, "plan", None), "total_bytes", None)
        if got != plan.total_bytes:
            obj.close()
            raise BackendError(f"{spec.name}: loaded with a plan of {fmt_bytes(got or 0)}, not the "
                               f"{fmt_bytes(plan.total_bytes)} it was admitted with; refused")
        return obj

    # -- the kind's half -------------------------------------------------------------------------------------
    def _plan(self, spec: ModelSpec, opts: LoadOptions, budget: int) -> PlanT:
        raise NotImplementedError

    def _open(self, spec: ModelSpec, opts: LoadOptions, plan: PlanT, budget: int) -> ModelT:
        raise NotImplementedError

    def _shared(self, plan: PlanT) -> Mapping[str, int]:
        raise NotImplementedError


@dataclass(frozen=True)
class LLMPlan:
    """An LLM's kept plan: the verified model it was planned from and the planner's plan."""

    model: ResolvedModel
    plan: MemoryPlan

    @property
    def total_bytes(self) -> int:
        return self.plan.total_bytes


class LLMLoader(PlannedLoader[LLMPlan, "Engine"]):
    """kind "llm": a GGUF model as runtime.serving.engine.Engine (continuous batching). Options: ctx (per slot), slots
    (default the engine's), max_queued (requests waiting per priority class), threads, target, kv_type,
    prefix_cache_bytes, speculate (True/False)."""

    KIND = ResidentKind.LLM
    OPTIONS = ("ctx", "slots", "max_queued", "threads", "target", "kv_type", "prefix_cache_bytes", "speculate")

    def _plan(self, spec: ModelSpec, opts: LoadOptions, budget: int) -> LLMPlan:
        from runtime.formats.gguf_file import read_gguf
        from runtime.llm.plan import plan_llm
        from runtime.serving.engine import DEFAULT_SLOTS

        model = resolve(spec.ref)
        manifest = model.manifest
        if manifest.kind != ModelKind.LLM or manifest.backend != BackendName.LLAMACPP:
            raise BadInput(f"{spec.name}: {manifest.ref} is a {manifest.kind.value} model, not kind 'llm'")
        with model.opened(manifest.file("weights").path) as (weights,):  # the file that was verified (runtime.llm.loader)
            info = read_gguf(weights)
        plan = plan_llm(info, budget, name=manifest.ref, ctx=opts.ctx, kv_type=opts.kv_type, slots=opts.slots or DEFAULT_SLOTS,
                        prefix_cache_bytes=opts.prefix_cache_bytes)
        return LLMPlan(model, plan)

    def _shared(self, plan: LLMPlan) -> Mapping[str, int]:
        return {BackendName.LLAMACPP.value: plan.plan.runtime_bytes}

    def _open(self, spec: ModelSpec, opts: LoadOptions, plan: LLMPlan, budget: int) -> Engine:
        from runtime.serving.engine import Engine

        given = {"ctx": opts.ctx, "threads": opts.threads, "target": opts.target, "max_queued": opts.max_queued,
                 "speculate": opts.speculate}
        # The planner's own choices, so that it makes this plan again within the smaller budget; the engine's
        # defaults for what the spec does not give.
        return Engine.load(plan.model, memory=budget, slots=plan.plan.n_slots, kv_type=plan.plan.kv_type,
                           prefix_cache_bytes=plan.plan.prefix_cache_bytes,
                           **{name: value for name, value in given.items() if value is not None})


class _BundleLoader(PlannedLoader["ClassifierPlan", ModelT]):
    """What the classifier kinds' loaders share: check the bundle's kind, plan it with runtime.classify.plan (kept
    for the load and the library terms), open the object with ``memory`` = the share it was planned with."""

    BUNDLE: ClassVar[ModelKind]  # the bundles this loader takes

    def _plan(self, spec: ModelSpec, opts: LoadOptions, budget: int) -> ClassifierPlan:
        manifest = resolve(spec.ref).manifest
        if manifest.kind != self.BUNDLE:
            raise BadInput(f"{spec.name}: {manifest.ref} is a {manifest.kind.value} bundle, not kind '{self.BUNDLE.value}'")
        return self._plan_bundle(manifest, opts, budget)

    def _plan_bundle(self, manifest: Manifest, opts: LoadOptions, budget: int) -> ClassifierPlan:
        raise NotImplementedError

    def _shared(self, plan: ClassifierPlan) -> Mapping[str, int]:
        return plan.libraries()


DECODE_TERM = "image decode"  # the server's decode slots: one pool whichever vision models it serves, counted once


class VisionLoader(_BundleLoader["Classifier"]):
    """kind "vision": runtime.classify.classifier.Classifier. Options: batch, threads, target, decode_bytes (what the
    images decoded for it at once may hold: planned with it, under DECODE_TERM, once for every vision model)."""

    KIND = ResidentKind.VISION
    BUNDLE = ModelKind.VISION
    OPTIONS = ("batch", "threads", "target", "decode_bytes")

    def plan_bytes(self, spec: ModelSpec, budget: int) -> int:
        return super().plan_bytes(spec, budget) + _decode_bytes(spec)

    def shared_bytes(self, spec: ModelSpec) -> Mapping[str, int]:
        decode = _decode_bytes(spec)
        return {**super().shared_bytes(spec), **({DECODE_TERM: decode} if decode else {})}

    def _plan_bundle(self, manifest: Manifest, opts: LoadOptions, budget: int) -> ClassifierPlan:
        from runtime.classify.plan import plan_classifier

        return plan_classifier(manifest, manifest.file("weights").size, budget, batch=opts.batch or 1)

    def _open(self, spec: ModelSpec, opts: LoadOptions, plan: ClassifierPlan, budget: int) -> Classifier:
        from runtime.classify.classifier import Classifier

        return Classifier.load(spec.ref, memory=budget, batch=opts.batch or 1, threads=opts.threads, target=opts.target or "auto")


def _decode_bytes(spec: ModelSpec) -> int:
    return check_options(spec, VisionLoader.OPTIONS).decode_bytes or 0


class AudioLoader(_BundleLoader["AudioClassifier"]):
    """kind "audio": runtime.classify.audio_classifier.AudioClassifier (planned for one segment, no input files).
    Options: threads, target."""

    KIND = ResidentKind.AUDIO
    BUNDLE = ModelKind.AUDIO
    OPTIONS = ("threads", "target")

    def _plan_bundle(self, manifest: Manifest, opts: LoadOptions, budget: int) -> ClassifierPlan:
        from runtime.classify.audio_classifier import SEGMENT_WINDOWS, segment_bytes
        from runtime.classify.plan import plan_classifier

        audio = manifest.audio
        if audio is None:
            raise BadInput(f"{manifest.ref} is an audio bundle without an audio section")
        sizes = {f.path: f.size for f in manifest.files}
        weights = manifest.file("weights").size + sum(sizes[name] for name in audio.frontend_files)
        # As AudioClassifier.load plans it (checked after the load by _admit).
        return plan_classifier(manifest, weights, budget, batch=SEGMENT_WINDOWS, input_bytes=segment_bytes(audio))

    def _open(self, spec: ModelSpec, opts: LoadOptions, plan: ClassifierPlan, budget: int) -> AudioClassifier:
        from runtime.classify.audio_classifier import AudioClassifier

        return AudioClassifier.load(spec.ref, memory=budget, threads=opts.threads, target=opts.target or "auto")


class AnomalyLoader(_BundleLoader["AnomalyDetector"]):
    """kind "anomaly": runtime.classify.anomaly.AnomalyDetector (backbone, memory bank and distance search planned together).
    Options: batch, threads, target."""

    KIND = ResidentKind.ANOMALY
    BUNDLE = ModelKind.ANOMALY
    OPTIONS = ("batch", "threads", "target")

    def _plan_bundle(self, manifest: Manifest, opts: LoadOptions, budget: int) -> ClassifierPlan:
        from runtime.classify.anomaly import plan_anomaly

        return plan_anomaly(manifest, budget, batch=opts.batch or 1)

    def _open(self, spec: ModelSpec, opts: LoadOptions, plan: ClassifierPlan, budget: int) -> AnomalyDetector:
        from runtime.classify.anomaly import AnomalyDetector

        return AnomalyDetector.load(spec.ref, memory=budget, batch=opts.batch or 1, threads=opts.threads,
                                    target=opts.target or "auto")


class _SpeechLoader(PlannedLoader["SpeechPlan", ModelT]):
    """What the speech kinds' loaders share: models from their recipes (runtime.speech.models), planned with their
    measured terms; the library's runtime term (CTranslate2, ONNX Runtime) is counted once per process. Options:
    threads. A speech model plans itself from its files, so its load takes no ``memory``."""

    OPTIONS = ("threads",)

    def _shared(self, plan: SpeechPlan) -> Mapping[str, int]:
        return {plan.library: plan.runtime_bytes}


class ASRLoader(_SpeechLoader["ASR"]):
    """kind "asr": runtime.speech.asr.ASR."""

    KIND = ResidentKind.ASR

    def _plan(self, spec: ModelSpec, opts: LoadOptions, budget: int) -> SpeechPlan:
        from runtime.speech.asr import MODEL_FILES, asr_plan
        from runtime.speech.models import resolve_speech

        return asr_plan(resolve_speech(spec.ref, self.KIND, MODEL_FILES))

    def _open(self, spec: ModelSpec, opts: LoadOptions, plan: SpeechPlan, budget: int) -> ASR:
        from runtime.speech.asr import ASR

        return ASR.load(spec.ref, threads=opts.threads)


class VADLoader(_SpeechLoader["SileroVAD"]):
    """kind "vad": runtime.speech.vad.SileroVAD (one thread unless told)."""

    KIND = ResidentKind.VAD

    def _plan(self, spec: ModelSpec, opts: LoadOptions, budget: int) -> SpeechPlan:
        from runtime.speech.models import resolve_speech
        from runtime.speech.vad import MODEL_FILE, vad_plan

        return vad_plan(resolve_speech(spec.ref, self.KIND, (MODEL_FILE,)))

    def _open(self, spec: ModelSpec, opts: LoadOptions, plan: SpeechPlan, budget: int) -> SileroVAD:
        from runtime.speech.vad import SileroVAD

        return SileroVAD.load(spec.ref, threads=opts.threads or 1)


class TTSLoader(_SpeechLoader["PiperTTS"]):
    """kind "tts": runtime.speech.tts.PiperTTS, never swapped for espeak-ng (the plan is Piper's)."""

    KIND = ResidentKind.TTS

    def _plan(self, spec: ModelSpec, opts: LoadOptions, budget: int) -> SpeechPlan:
        from runtime.speech.models import resolve_speech
        from runtime.speech.tts import tts_plan

        files = resolve_speech(spec.ref, self.KIND, ())
        return tts_plan(files, next((n for n in files.files if n.endswith(".onnx")), ""))

    def _open(self, spec: ModelSpec, opts: LoadOptions, plan: SpeechPlan, budget: int) -> PiperTTS:
        from runtime.speech.tts import load_tts

        return load_tts(spec.ref, threads=opts.threads, fallback=False)  # the plan is Piper's: no silent swap


# The one table: kind -> loader class. A kind is added by adding its class here (tests/runtime/test_residency_kinds.py
# checks that every ResidentKind has one, typed against ModelSpec).
LOADERS: Mapping[ResidentKind, type[PlannedLoader]] = MappingProxyType({
    cls.KIND: cls for cls in (LLMLoader, VisionLoader, AudioLoader, AnomalyLoader, ASRLoader, VADLoader, TTSLoader)})


def default_loaders() -> dict[ResidentKind, Loader]:
    """A fresh loader of every kind (each keeps its own plans), as the manager uses by default."""
    return {kind: cls() for kind, cls in LOADERS.items()}

