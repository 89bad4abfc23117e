"""Quantization recipes and output formats, and the choice of recipe for a model.

Full-integer static INT8 makes CNNs ~3.5x smaller everywhere; whether it makes them faster depends on the
CPU: 0.39-0.53x float latency on an x86 CPU with VNNI, about 1x on one without 8-bit dot products (README,
vision benchmark). So no recipe promises a speed-up: every conversion measures float and quantized latency on
the machine that converts and reports both, their ratio and the CPU (converters.vision.gate). Dynamic-range
and INT4-weight recipes make CNNs smaller but slower than float, while for MatMul/FullyConnected-heavy models
INT4 weights pay (an MLP went 5.8 -> 1.2 ms). ``auto`` follows that.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import BadInput

CONV_OPS = {"CONV_2D", "DEPTHWISE_CONV_2D", "Conv", "ConvTranspose", "TRANSPOSE_CONV"}
MATMUL_OPS = {"FULLY_CONNECTED", "BATCH_MATMUL", "MatMul", "Gemm"}
# every conversion measures float and quantized latency here (the report's latency_ratio): no speed is promised
MEASURED = "see the latency measured here"


class QuantScheme(str, enum.Enum):
    """A vision/audio quantization recipe (what is quantized, how). Not converters.llm.options.Quant, a GGUF weight type."""

    AUTO = "auto"
    INT8 = "int8"  # full-integer static: int8 weights (per channel) and activations, calibrated
    INT4W = "int4w"  # 4-bit weights (per channel / block), float activations
    FP16 = "fp16"  # float16 weights


class Rounding(str, enum.Enum):
    GPTQ = "gptq"  # INT8 weights rounded to keep each layer's output on the calibration set (converters.vision.rounding)
    NEAREST = "nearest"  # each weight to its nearest INT8 step, as the quantizers do on their own


class Format(str, enum.Enum):
    TFLITE = "tflite"
    ONNX = "onnx"


def parse(cls: type[enum.Enum], value: str, what: str):
    try:
        return cls(value)
    except ValueError:
        raise BadInput(f"{what} {value!r} is not valid (valid: {', '.join(m.value for m in cls)})") from None  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Choice:
    quant: QuantScheme
    why: str
    rounding: dict[str, Any] = field(default_factory=lambda: {"method": Rounding.NEAREST.value})
    equalization: dict[str, Any] = field(default_factory=lambda: {"applied": False, "why": "not an INT8 recipe"})


def choose(requested: QuantScheme, ops: dict[str, int]) -> Choice:
    conv = sum(n for op, n in ops.items() if op in CONV_OPS)
    matmul = sum(n for op, n in ops.items() if op in MATMUL_OPS)
    census = f"{conv} convolution and {matmul} matmul/fully-connected ops"
    if requested is not QuantScheme.AUTO:
        hint = ""
        if requested is QuantScheme.INT8 and conv == 0 and matmul:
            hint = ("; this model is fully-connected: int4w would be smaller, and whether either is faster than float "
                    f"depends on the CPU ({MEASURED})")
        if requested is QuantScheme.INT4W and conv > matmul:
            hint = ("; this model is convolutional: int4w weights make it smaller, and were slower than float on the CPUs "
                    f"benchmarked; int8 is faster than float only on CPUs with 8-bit dot products ({MEASURED})")
        return Choice(requested, f"requested ({census}){hint}")
    if conv >= matmul:
        return Choice(QuantScheme.INT8, f"auto: {census}: full-integer static INT8 (~3.5x smaller; faster than float only on CPUs "
                                  f"with 8-bit dot products: {MEASURED})")
    return Choice(QuantScheme.INT4W, f"auto: {census}: 4-bit weights shrink matmul-heavy models (whether they run faster than float "
                               f"depends on the CPU: {MEASURED})")
