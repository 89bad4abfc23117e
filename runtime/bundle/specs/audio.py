"""The manifest's ``audio`` section: how a WAV file becomes the model's inputs and its outputs become labels."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.bundle.fields import FILE_RE, count_field, enum_field, flag_field, is_finite, required_field, text_field
from runtime.bundle.specs.tensor import TensorQuant
from runtime.errors import BadInput
from runtime.llm.sampling import INT32_MAX


@dataclass(frozen=True)
class AudioSpec:
    """How the runtime turns a WAV file into the model's inputs and its outputs into labels.

    ``frontend`` names the feature front end (:mod:`runtime.classify.audio_frontend`); its model
    files, if any, are bundle files listed in ``frontend_files`` in order.
    A one-output model is a detector: its score is a probability and counts as
    detected at ``threshold``.
    """

    sample_rate: int
    frontend: str
    input_shape: tuple[int, ...]  # one window, without the batch dimension
    frontend_files: tuple[str, ...] = ()
    input: TensorQuant = field(default_factory=TensorQuant)
    output: TensorQuant = field(default_factory=TensorQuant)
    output_is_logits: bool = False
    threshold: float = 0.5
    labels: str | None = None
    quantization: str = ""
    arena_bytes: int = 0
    frontend_arena_bytes: int = 0  # the front end's activation peak per call (ONNX Runtime)

    @classmethod
    def from_dict(cls, data: Any) -> AudioSpec:
        from runtime.classify.audio_frontend import FrontEnd

        where = "manifest audio"
        if not isinstance(data, dict):
            raise BadInput("manifest: field 'audio' must be an object")
        rate = required_field(data, "sample_rate", int, where)
        if not 1000 <= rate <= 384_000:
            raise BadInput(f"{where}: sample_rate {rate} must be 1000..384000 Hz")
        shape = required_field(data, "input_shape", list, where)
        if not 0 < len(shape) <= 8 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape) \
                or math.prod(shape) > INT32_MAX:  # the backends' dimensions and element counts are 32-bit
            raise BadInput(f"{where}: input_shape {shape!r:.80} must be 1 to 8 positive integers, "
                           f"at most {INT32_MAX} elements in all")
        files = required_field(data, "frontend_files", list, where) if "frontend_files" in data else []
        labels = data.get("labels")
        for name in [*files, "labels" if labels is None else labels]:
            if not isinstance(name, str) or not FILE_RE.fullmatch(name):
                raise BadInput(f"{where}: file name {name!r} is not a flat bundle file name")
        threshold = data.get("threshold", 0.5)
        if not is_finite(threshold) or not 0.0 < threshold < 1.0:
            raise BadInput(f"{where}: threshold {threshold!r:.80} must be between 0 and 1")
        arena = count_field(data, "arena_bytes", where)
        return cls(
            sample_rate=rate,
            frontend=enum_field(FrontEnd, required_field(data, "frontend", str, where), "audio frontend").value,
            input_shape=tuple(shape),
            frontend_files=tuple(files),
            input=TensorQuant.from_dict(data.get("input", {}), f"{where} input"),
            output=TensorQuant.from_dict(data.get("output", {}), f"{where} output"),
            output_is_logits=flag_field(data, "output_is_logits", False, where),
            threshold=float(threshold),
            labels=labels,
            quantization=text_field(data, "quantization", "", where),
            arena_bytes=arena,
            frontend_arena_bytes=count_field(data, "frontend_arena_bytes", where),
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(input_shape=list(self.input_shape), frontend_files=list(self.frontend_files))
        return data
