"""What a conversion is asked to do: the quant type, the output, the gate."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import BadInput


class Quant(str, enum.Enum):
    """Output weight types. ``ftype`` is llama.cpp's ``llama_ftype`` (and GGUF ``general.file_type``)."""

    F32 = "f32"  # parity tests only: no rounding anywhere
    F16 = "f16"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"
    Q4_K_M = "q4_k_m"

    @property
    def ftype(self) -> int:
        return {"f32": 0, "f16": 1, "q8_0": 7, "q4_0": 2, "q4_k_m": 15}[self.value]

    @property
    def default_max_kl(self) -> float:
        """Default gate on the mean per-token KL(F16 || quant), in nats.

        From measurements on SmolLM2-135M-Instruct (the smallest, hence most
        quantization-sensitive, model we target; bench/results/convert.json:
        q8_0 0.0044, q4_k_m 0.055, q4_0 0.29) with 2-4x headroom: a model
        beyond them has drifted far more than these formats normally cost.
        """
        return {"f32": 1e-3, "f16": 1e-3, "q8_0": 0.02, "q4_0": 0.6, "q4_k_m": 0.2}[self.value]

    @classmethod
    def parse(cls, value: str) -> Quant:
        try:
            return cls(value.lower())
        except ValueError:
            raise BadInput(f"unknown quant type {value!r}; valid: {', '.join(q.value for q in cls)}") from None


@dataclass(frozen=True)
class ConvertOptions:
    checkpoint: Path  # Hugging Face directory: config.json, *.safetensors, tokenizer files
    out: Path  # bundle directory, or a transport file when it ends in .edgerun
    quant: Quant = Quant.Q8_0
    name: str | None = None  # bundle name; default: from the checkpoint directory
    version: str | None = None  # default: the quant type plus "-1"
    eval_text: Path | None = None  # default: converters/data/eval.txt
    max_kl: float | None = None  # default: quant.default_max_kl
    eval_ctx: int = 256  # tokens per evaluation window
    eval_max_tokens: int = 4096  # cap on evaluated tokens (time on a Pi)
    threads: int = 2
    progress: bool | None = None  # None: only when stderr is a terminal
    license: str = "unknown"

    @property
    def gate(self) -> float:
        return self.quant.default_max_kl if self.max_kl is None else self.max_kl

    def check(self) -> None:
        if self.max_kl is not None and not self.max_kl >= 0:
            raise BadInput(f"--max-kl {self.max_kl} must be a non-negative number of nats")
        if self.eval_ctx < 16:
            raise BadInput(f"evaluation context {self.eval_ctx} is too small (at least 16 tokens)")
