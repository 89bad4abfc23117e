"""The residency manager's loaders: plan a model against the whole budget, then load it with its share.

Each loader keeps the plan it made for a spec, so the load opens the same verified files and asks its
planner for the same plan (same context, KV type, prefix cache, batch) within ``budget`` = the plan's
total plus that share's reserve; it checks that the loaded object's own plan total equals what was
planned, and closes it and raises BackendError if not: the manager's sum must be the truth.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from devices.backends import BackendName
from runtime.bundle.manifest import ModelKind
from runtime.bundle.resolve import resolve
from runtime.errors import BackendError, BadInput
from runtime.units import fmt_bytes

log = logging.getLogger(__name__)


def _key(spec: Any) -> tuple[Any, ...]:
    return spec.name, spec.ref, spec.kind, tuple(sorted((k, repr(v)) for k, v in spec.options.items()))


COUNTS = ("ctx", "slots", "threads", "batch", "max_queued")  # options that are positive whole numbers


def _options(spec: Any, valid: tuple[str, ...]) -> dict[str, Any]:
    """``spec.options``, checked: known names only, counts positive integers, kv_type and target by name."""
    from runtime.llm.plan import KVType

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
    return opts


def _agrees(spec: Any, obj: Any, planned: int) -> Any:
    got = getattr(getattr(obj, "plan", None), "total_bytes", None)
    if got != planned:
        obj.close()
        raise BackendError(f"{spec.name}: loaded with a plan of {fmt_bytes(got or 0)}, not the {fmt_bytes(planned)} "
                           "it was admitted with; refused")
    return obj


class LLMLoader:
    """kind "llm": a GGUF model as runtime.serving.engine.Engine (continuous batching). Options: ctx (per slot), slots
    (default the engine's), max_queued (requests waiting per priority class), threads, target, kv_type,
    prefix_cache_bytes, speculate (True/False)."""

    OPTIONS = ("ctx", "slots", "max_queued", "threads", "target", "kv_type", "prefix_cache_bytes", "speculate")

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def plan_bytes(self, spec: Any, budget: int) -> int:
        from runtime.formats.gguf_file import read_gguf
        from runtime.llm.plan import KVType, plan_llm
        from runtime.serving.engine import DEFAULT_SLOTS

        opts = _options(spec, self.OPTIONS)
        model = resolve(spec.ref)
        manifest = model.manifest
        if manifest.kind != ModelKind.LLM or manifest.backend != BackendName.LLAMACPP:
            raise BadInput(f"{spec.name}: {manifest.ref} is a {manifest.kind.value} model, not kind 'llm'")
        with model.opened(manifest.file("weights").path) as (weights,):  # the file that was verified (runtime.llm.loader)
            info = read_gguf(weights)
        kv = KVType(opts["kv_type"]) if opts.get("kv_type") is not None else None  # checked by _options
        plan = plan_llm(info, budget, name=manifest.ref, ctx=opts.get("ctx"), kv_type=kv, slots=opts.get("slots") or DEFAULT_SLOTS,
                        prefix_cache_bytes=opts.get("prefix_cache_bytes"))
        self._plans[_key(spec)] = (model, plan)
        return plan.total_bytes

    def shared_bytes(self, spec: Any) -> Mapping[str, int]:
        return {BackendName.LLAMACPP.value: self._plans[_key(spec)][1].runtime_bytes}

    def load(self, spec: Any, budget: int) -> Any:
        from runtime.serving.engine import Engine

        if _key(spec) not in self._plans:
            self.plan_bytes(spec, budget)
        model, plan = self._plans[_key(spec)]
        opts = {k: v for k, v in spec.options.items()
                if k in ("ctx", "threads", "target", "max_queued", "speculate") and v is not None}
        # The planner's own choices, so that it makes this plan again within the smaller budget.
        obj = Engine.load(model, memory=budget, slots=plan.n_slots, kv_type=plan.kv_type,
                          prefix_cache_bytes=plan.prefix_cache_bytes, **opts)
        return _agrees(spec, obj, plan.total_bytes)


class _ClassifierLoader:
    """What the classifier kinds' loaders share: check the options and the bundle's kind, plan (kept for the load
    and the shared runtime term), open the object with ``memory`` = the share it was planned with, check it agrees."""

    KIND: ModelKind
    OPTIONS: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], Any] = {}

    def _plan(self, manifest: Any, opts: dict[str, Any], budget: int) -> Any:
        raise NotImplementedError

    def _open(self, spec: Any, budget: int, opts: dict[str, Any]) -> Any:
        raise NotImplementedError

    def plan_bytes(self, spec: Any, budget: int) -> int:
        opts = _options(spec, self.OPTIONS)
        manifest = resolve(spec.ref).manifest
        if manifest.kind != self.KIND:
            raise BadInput(f"{spec.name}: {manifest.ref} is a {manifest.kind.value} bundle, not kind '{self.KIND.value}'")
        plan = self._plan(manifest, opts, budget)
        self._plans[_key(spec)] = plan
        return plan.total_bytes

    def shared_bytes(self, spec: Any) -> Mapping[str, int]:
        return _classifier_runtime(self._plans[_key(spec)])

    def load(self, spec: Any, budget: int) -> Any:
        if _key(spec) not in self._plans:
            _ClassifierLoader.plan_bytes(self, spec, budget)
        return _agrees(spec, self._open(spec, budget, dict(spec.options)), self._plans[_key(spec)].total_bytes)


DECODE_TERM = "image decode"  # the server's decode slots: one pool whichever vision models it serves, counted once


class VisionLoader(_ClassifierLoader):
    """kind "vision": runtime.classify.classifier.Classifier. Options: batch, threads, target, decode_bytes (what the
    images decoded for it at once may hold: planned with it, under DECODE_TERM, once for every vision model)."""

    KIND = ModelKind.VISION
    OPTIONS = ("batch", "threads", "target", "decode_bytes")

    def plan_bytes(self, spec: Any, budget: int) -> int:
        return super().plan_bytes(spec, budget) + int(spec.options.get("decode_bytes") or 0)

    def shared_bytes(self, spec: Any) -> Mapping[str, int]:
        decode = int(spec.options.get("decode_bytes") or 0)
        return {**super().shared_bytes(spec), **({DECODE_TERM: decode} if decode else {})}

    def _plan(self, manifest: Any, opts: dict[str, Any], budget: int) -> Any:
        from runtime.classify.plan import plan_classifier

        return plan_classifier(manifest, manifest.file("weights").size, budget, batch=int(opts.get("batch", 1)))

    def _open(self, spec: Any, budget: int, opts: dict[str, Any]) -> Any:
        from runtime.classify.classifier import Classifier

        return Classifier.load(spec.ref, memory=budget, batch=int(opts.get("batch", 1)), threads=opts.get("threads"),
                               target=opts.get("target", "auto"))


class AudioLoader(_ClassifierLoader):
    """kind "audio": runtime.classify.audio_classifier.AudioClassifier (planned for one segment, no input files).
    Options: threads, target."""

    KIND = ModelKind.AUDIO
    OPTIONS = ("threads", "target")

    def _plan(self, manifest: Any, opts: dict[str, Any], budget: int) -> Any:
        from runtime.classify.audio_classifier import SEGMENT_WINDOWS, segment_bytes
        from runtime.classify.plan import plan_classifier

        audio = manifest.audio
        if audio is None:
            raise BadInput(f"{manifest.ref} is an audio bundle without an audio section")
        sizes = {f.path: f.size for f in manifest.files}
        weights = manifest.file("weights").size + sum(sizes[name] for name in audio.frontend_files)
        # As AudioClassifier.load plans it (checked after the load by _agrees).
        return plan_classifier(manifest, weights, budget, batch=SEGMENT_WINDOWS, input_bytes=segment_bytes(audio))

    def _open(self, spec: Any, budget: int, opts: dict[str, Any]) -> Any:
        from runtime.classify.audio_classifier import AudioClassifier

        return AudioClassifier.load(spec.ref, memory=budget, threads=opts.get("threads"), target=opts.get("target", "auto"))


class AnomalyLoader(_ClassifierLoader):
    """kind "anomaly": runtime.classify.anomaly.AnomalyDetector (backbone, memory bank and distance search planned together).
    Options: batch, threads, target."""

    KIND = ModelKind.ANOMALY
    OPTIONS = ("batch", "threads", "target")

    def _plan(self, manifest: Any, opts: dict[str, Any], budget: int) -> Any:
        from runtime.classify.anomaly import plan_anomaly

        return plan_anomaly(manifest, budget, batch=int(opts.get("batch", 1)))

    def _open(self, spec: Any, budget: int, opts: dict[str, Any]) -> Any:
        from runtime.classify.anomaly import AnomalyDetector

        return AnomalyDetector.load(spec.ref, memory=budget, batch=int(opts.get("batch", 1)), threads=opts.get("threads"),
                                    target=opts.get("target", "auto"))


def _classifier_runtime(plan: Any) -> dict[str, int]:
    """A classifier plan's runtime term by library: its backend's, plus ONNX Runtime's for an audio front end."""
    from runtime.classify.plan import RUNTIME_BYTES

    backend = BackendName(plan.backend)
    parts = {backend.value: RUNTIME_BYTES[backend]}
    rest = plan.runtime_bytes - RUNTIME_BYTES[backend]
    if rest > 0:
        parts[BackendName.ORT.value] = rest
    return {lib: size for lib, size in parts.items() if size > 0}


class SpeechLoader:
    """kinds "asr" (runtime.speech.asr.ASR), "vad" (runtime.speech.vad.SileroVAD), "tts" (runtime.speech.tts.PiperTTS): speech models
    from their recipes (runtime.speech.models), planned with their measured terms; the library's runtime term
    (CTranslate2, ONNX Runtime) is counted once per process. Options: threads."""

    OPTIONS = ("threads",)

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._plans: dict[tuple[Any, ...], Any] = {}

    def plan_bytes(self, spec: Any, budget: int) -> int:
        from runtime.speech.models import resolve_speech

        _options(spec, self.OPTIONS)
        if self.kind == "asr":
            from runtime.speech.asr import MODEL_FILES, asr_plan

            plan = asr_plan(resolve_speech(spec.ref, "asr", MODEL_FILES))
        elif self.kind == "vad":
            from runtime.speech.vad import MODEL_FILE, vad_plan

            plan = vad_plan(resolve_speech(spec.ref, "vad", (MODEL_FILE,)))
        else:
            from runtime.speech.tts import tts_plan

            files = resolve_speech(spec.ref, "tts", ())
            plan = tts_plan(files, next((n for n in files.files if n.endswith(".onnx")), ""))
        self._plans[_key(spec)] = plan
        return plan.total_bytes

    def shared_bytes(self, spec: Any) -> Mapping[str, int]:
        plan = self._plans[_key(spec)]
        return {plan.library: plan.runtime_bytes}

    def load(self, spec: Any, budget: int) -> Any:
        planned = self.plan_bytes(spec, budget) if _key(spec) not in self._plans else self._plans[_key(spec)].total_bytes
        threads = spec.options.get("threads")
        if self.kind == "asr":
            from runtime.speech.asr import ASR

            obj: Any = ASR.load(spec.ref, threads=threads)
        elif self.kind == "vad":
            from runtime.speech.vad import SileroVAD

            obj = SileroVAD.load(spec.ref, threads=threads or 1)
        else:
            from runtime.speech.tts import load_tts

            obj = load_tts(spec.ref, threads=threads, fallback=False)  # the plan is Piper's: no silent swap
        return _agrees(spec, obj, planned)


def default_loaders() -> dict[str, Any]:
    return {"llm": LLMLoader(), "vision": VisionLoader(), "audio": AudioLoader(), "anomaly": AnomalyLoader(),
            "asr": SpeechLoader("asr"), "vad": SpeechLoader("vad"), "tts": SpeechLoader("tts")}
