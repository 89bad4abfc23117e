"""The one memory plan of the voice assistant: every resident model, planned before anything loads.

The models (wake word, VAD, ASR, the LLM with its bounded KV cache, TTS) are planned by the residency manager's own
loaders (runtime.residency_loaders), each against the whole budget, and summed as the manager sums them: each
model's own memory, each library's runtime term once (llama.cpp, ONNX Runtime, CTranslate2...), plus the budget's
5 % reserve. When the sum passes the budget the assistant does not start: DoesNotFit names the model to shrink,
the largest one's own memory, and by how much. When it fits, :func:`open_residency` registers the same specs,
pinned, in a :class:`~runtime.residency.ResidencyManager`, which checks the same sum again.

espeak-ng (the fallback voice) is a subprocess: it holds no memory of this process and is not in the plan.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import DoesNotFit
from runtime.plan import RESERVE_FRACTION
from runtime.residency import ModelSpec, ResidencyManager, summed_bytes
from runtime.units import fmt_bytes

log = logging.getLogger(__name__)

ESPEAK = "espeak-ng"  # the TTS ref that is a subprocess, not a resident model
DEFAULT_CTX = 1024  # tokens of conversation memory (the LLM's one slot)
SHRINK_HINTS = {"llm": "a smaller --llm, or a smaller --ctx", "asr": "a smaller --asr model", "tts": "--tts espeak-ng",
                "audio": "another --wake-word, or none", "vad": "(the VAD is already tiny)"}


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
        specs = [ModelSpec("vad", self.vad, "vad", pinned=True, keep_alive_s=None),
                 ModelSpec("asr", self.asr, "asr", pinned=True, keep_alive_s=None, options=threads),
                 ModelSpec("llm", self.llm, "llm", pinned=True, keep_alive_s=None,
                           options={"ctx": self.ctx, "slots": 1, **threads})]
        if self.tts != ESPEAK:
            specs.append(ModelSpec("tts", self.tts, "tts", pinned=True, keep_alive_s=None))
        if self.wake is not None:
            specs.insert(0, ModelSpec("wake", self.wake, "audio", pinned=True, keep_alive_s=None))
        return specs


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


def plan_voice(models: VoiceModels, budget: int, loaders: Mapping[str, Any] | None = None) -> VoicePlan:
    """Plan every model (nothing is loaded). A model that cannot be planned even alone raises its planner's error
    (DoesNotFit names it); whether the sum fits is :attr:`VoicePlan.fits`."""
    if loaders is None:
        from runtime.residency_loaders import default_loaders

        loaders = default_loaders()
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


def open_residency(plan: VoicePlan, loaders: Mapping[str, Any] | None = None) -> ResidencyManager:
    """The residency manager holding ``plan``'s models, pinned (loaded on first acquire); DoesNotFit (naming the
    model to shrink) when the plan does not fit."""
    if not plan.fits:
        raise plan.refusal()
    manager = ResidencyManager(plan.budget, loaders=loaders)
    try:
        for r in plan.rows:
            manager.add(r.spec)
    except BaseException:
        manager.close()
        raise
    return manager
