"""A classifier model's input or output tensor type, and its quantization (vision and audio sections)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.bundle.fields import is_finite
from runtime.errors import BadInput

TENSOR_DTYPES = ("float32", "int8", "uint8")
ZERO_POINTS = {"float32": (0, 0), "int8": (-128, 127), "uint8": (0, 255)}  # what each dtype can hold


@dataclass(frozen=True)
class TensorQuant:
    """dtype of a model input/output and, for integer tensors, real = scale * (q - zero_point)."""

    dtype: str = "float32"
    scale: float = 0.0  # 0 for float tensors
    zero_point: int = 0

    @classmethod
    def from_dict(cls, data: Any, where: str) -> TensorQuant:
        if not isinstance(data, dict):
            raise BadInput(f"{where} must be an object with dtype, scale, zero_point")
        dtype = data.get("dtype", "float32")
        if dtype not in TENSOR_DTYPES:
            raise BadInput(f"{where}: dtype {dtype!r} is not valid (valid: {', '.join(TENSOR_DTYPES)})")
        scale = data.get("scale", 0.0)
        zp = data.get("zero_point", 0)
        if not is_finite(scale) or scale < 0:
            raise BadInput(f"{where}: scale {scale!r:.80} must be a finite number >= 0")
        low, high = ZERO_POINTS[dtype]
        if not isinstance(zp, int) or isinstance(zp, bool) or not low <= zp <= high:
            raise BadInput(f"{where}: zero_point {zp!r:.80} must be an integer in [{low}, {high}] for {dtype}")
        if dtype != "float32" and scale == 0:
            raise BadInput(f"{where}: an {dtype} tensor needs a positive scale")
        return cls(dtype, float(scale), zp)
