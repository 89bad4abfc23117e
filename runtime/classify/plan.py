"""Memory planning for classifier bundles (LiteRT, ONNX Runtime), in resident bytes.

* ``weights``: the model file, read whole by both runtimes (LiteRT maps it, ORT
  copies initializers into its own buffers: counted once either way);
* ``arena``: activation tensors, computed by the converter at batch 1 and
  stored in the manifest (``arena_bytes``); it grows linearly with the batch.
  TFLite: all non-constant tensors (an upper bound; XNNPACK's packed weights
  and workspaces make the tighter live-tensor peak under-count). ONNX: the peak
  of tensors alive at once (:func:`peak_live_bytes`), doubled because ORT's
  arena allocator rounds up. Measured with bench/classifier_memory.py. Without a measurement the
  estimate is 32 input tensors' worth per row (MobileNet-class networks measure
  20-30 here);
* ``runtime``: the backend library itself once imported and initialized (measured, see RUNTIME_BYTES).

Several resident models share one budget: ``resident_bytes`` is what the others'
plans already hold. A plan fits when its total plus the others' plus a 5 %
reserve is within the budget.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from devices.backends import BackendName, serving
from runtime.bundle.manifest import Manifest
from runtime.errors import BadInput, DoesNotFit
from runtime.llm.plan import RESERVE_FRACTION  # one reserve for every kind of model
from runtime.units import fmt_bytes

# Per classifier backend (devices.backends.serving("vision")), tests/devices/test_backends.py checks each has both.
# The backend library once imported, initialized and run once: RSS over a numpy-only process, measured on
# x86_64 with a 10 KiB model (ai-edge-litert 2.3.0: 25 MiB, onnxruntime 1.32.0: 65 MiB).
RUNTIME_BYTES = {BackendName.LITERT: 26 << 20, BackendName.ORT: 66 << 20, BackendName.NULL: 0}  # null: numpy only
ARENA_FACTOR = {BackendName.LITERT: 1.0, BackendName.ORT: 2.0, BackendName.NULL: 1.0}
UNMEASURED_ARENA_INPUTS = 32


@dataclass(frozen=True)
class ClassifierPlan:
    model: str
    backend: str
    batch: int
    weights_bytes: int
    arena_bytes: int
    runtime_bytes: int
    resident_bytes: int  # other models already loaded under the same budget
    budget_bytes: int
    arena_measured: bool
    input_bytes: int = 0  # audio: the clips at the model's rate, reading one of them, and one segment's working set

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.arena_bytes + self.runtime_bytes + self.input_bytes

    @property
    def reserve_bytes(self) -> int:
        return int(self.budget_bytes * RESERVE_FRACTION)

    @property
    def fits(self) -> bool:
        return self.total_bytes + self.resident_bytes + self.reserve_bytes <= self.budget_bytes

    def libraries(self) -> dict[str, int]:
        """The runtime term by library (what the residency manager counts once per process): the backend's, plus
        ONNX Runtime's for an audio front end when the classifier runs elsewhere. Libraries of 0 bytes are left out."""
        backend = BackendName(self.backend)
        parts = {backend.value: RUNTIME_BYTES[backend]}
        rest = self.runtime_bytes - RUNTIME_BYTES[backend]
        if rest > 0:
            parts[BackendName.ORT.value] = rest
        return {lib: size for lib, size in parts.items() if size > 0}

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(total_bytes=self.total_bytes, reserve_bytes=self.reserve_bytes, fits=self.fits)
        return data

    def table(self) -> str:
        rows = [
            ("weights (model files)", self.weights_bytes),
            (f"arena (batch {self.batch}{'' if self.arena_measured else ', estimated'})", self.arena_bytes),
            ("inputs (audio: clips, one segment; anomaly: bank, search)", self.input_bytes),
            (f"runtime ({self.backend}{'' if self.runtime_bytes == RUNTIME_BYTES[BackendName(self.backend)] else ' + ort'})",
             self.runtime_bytes),
            ("total", self.total_bytes),
            ("other resident models", self.resident_bytes),
            ("reserve (5% of budget)", self.reserve_bytes),
            ("budget", self.budget_bytes),
        ]
        lines = [f"plan for {self.model}"] + [f"  {n:<38} {fmt_bytes(v):>11}" for n, v in rows]
        lines.append(f"  fits: {'yes' if self.fits else 'no'}")
        return "\n".join(lines)


def plan_classifier(manifest: Manifest, model_bytes: int, budget: int, *, batch: int = 1, resident_bytes: int = 0,
                    input_bytes: int = 0) -> ClassifierPlan:
    """The plan for ``manifest`` at ``batch``; raises DoesNotFit (nothing loaded) when it does not fit."""
    spec = manifest.vision or manifest.audio
    if spec is None:
        raise BadInput(f"{manifest.ref} is a {manifest.kind.value} bundle; the classifier planner takes vision and audio bundles")
    if manifest.backend not in serving(manifest.kind.value):  # the table (devices.backends) says who serves a kind
        valid = ", ".join(b.value for b in serving(manifest.kind.value))
        raise BadInput(f"{manifest.ref}: backend {manifest.backend.value!r} is not a classifier backend (valid: {valid})")
    if batch < 1 or budget < 1 or resident_bytes < 0:
        raise BadInput(f"plan: batch {batch}, budget {budget} and resident {resident_bytes} bytes must be positive")
    measured = spec.arena_bytes > 0
    itemsize = 4 if spec.input.dtype == "float32" else 1
    elements = 3 * spec.size * spec.size if manifest.vision is not None else int(np.prod(manifest.audio.input_shape))  # type: ignore[union-attr]
    per_row = spec.arena_bytes if measured else UNMEASURED_ARENA_INPUTS * elements * itemsize
    plan = ClassifierPlan(
        model=manifest.ref,
        backend=manifest.backend.value,
        batch=batch,
        weights_bytes=model_bytes,
        arena_bytes=int(per_row * batch * ARENA_FACTOR[manifest.backend]) + _frontend_arena(manifest),
        runtime_bytes=RUNTIME_BYTES[manifest.backend] + _frontend_runtime(manifest),
        resident_bytes=resident_bytes,
        budget_bytes=budget,
        input_bytes=input_bytes,
        arena_measured=measured,
    )
    if not plan.fits:
        short = plan.total_bytes + plan.resident_bytes + plan.reserve_bytes - budget
        raise DoesNotFit(f"{manifest.ref} needs {fmt_bytes(plan.total_bytes)} at batch {batch} and does not fit the "
                         f"{fmt_bytes(budget)} budget ({fmt_bytes(resident_bytes)} already resident): "
                         f"short by {fmt_bytes(short)}\n{plan.table()}")
    return plan


def _frontend_arena(manifest: Manifest) -> int:
    """An audio front end's activations per call (fixed chunks, not the batch), with ORT's rounding."""
    return 0 if manifest.audio is None else int(manifest.audio.frontend_arena_bytes * ARENA_FACTOR[BackendName.ORT])


def _frontend_runtime(manifest: Manifest) -> int:
    """An audio front end's models run on ONNX Runtime: its library counts too when the classifier runs elsewhere."""
    if manifest.audio is None or not manifest.audio.frontend_files or manifest.backend is BackendName.ORT:
        return 0
    return RUNTIME_BYTES[BackendName.ORT]


def peak_live_bytes(steps: list[tuple[list[Any], list[Any]]], sizes: dict[Any, int], inputs: list[Any], outputs: list[Any]) -> int:
    """Peak bytes alive at once when ``steps`` ((inputs, outputs) per op, in execution order) run one after another.

    ``sizes`` holds the activation tensors only (constants are not in the arena); a tensor lives from the op that
    writes it (or the start, for graph inputs) to the last op that reads it (or the end, for graph outputs).
    """
    last: dict[Any, int] = {}
    for i, (ins, _) in enumerate(steps):
        for t in ins:
            last[t] = i
    keep = set(outputs)
    live = {t: sizes[t] for t in inputs if t in sizes}
    peak = sum(live.values())
    for i, (ins, outs) in enumerate(steps):
        for t in outs:
            if t in sizes:
                live[t] = sizes[t]
        peak = max(peak, sum(live.values()))
        for t in ins:
            if last.get(t) == i and t not in keep:
                live.pop(t, None)
    return peak
