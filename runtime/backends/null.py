"""The null backend: the classifier interface with no native library and no hardware.

Its "model" is a small JSON file naming the input and output tensors::

    {"input": {"shape": [-1, 8, 8, 3], "dtype": "float32"}, "output": {"shape": [-1, 10], "dtype": "float32"}}

(integer tensors add "scale" and "zero_point", as the real backends report them). Each output row is drawn
from a generator seeded by the SHA-256 of its input row, so the same input always gives the same output on
every machine, and a batch gives the rows of single calls. The whole stack (bundle, resolve, plan,
placement, preprocessing, scores, CLI) can then be tested without LiteRT or ONNX Runtime.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from devices.backends import BackendName
from runtime.backends.base import ClassifierBackend, Offload, Placed, TensorInfo
from runtime.errors import BadInput
from runtime.files import open_regular

MAX_MODEL_BYTES = 64 << 10  # two tensor descriptions
DTYPES = ("float32", "int8", "uint8")
MAX_ELEMENTS = 1 << 24  # per row: a description, not a model, so keep what it can ask for small


def _tensor(data: Any, role: str, where: str) -> TensorInfo:
    if not isinstance(data, dict):
        raise BadInput(f"{where}: {role!r} must be an object with shape and dtype")
    shape, dtype = data.get("shape"), data.get("dtype")
    if (not isinstance(shape, list) or len(shape) < 2 or shape[0] != -1
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape[1:])):
        raise BadInput(f"{where}: {role} shape {shape!r} must be [-1, d1, ...] with positive integer dimensions")
    if math.prod(shape[1:]) > MAX_ELEMENTS:  # Python ints: np.prod wraps at 2**64 ([2**32, 2**32] gave 0)
        raise BadInput(f"{where}: {role} shape {shape!r} has more than {MAX_ELEMENTS} elements per row")
    if dtype not in DTYPES:
        raise BadInput(f"{where}: {role} dtype {dtype!r} is not valid (valid: {', '.join(DTYPES)})")
    scale, zero = data.get("scale", 0.0), data.get("zero_point", 0)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not isinstance(zero, int) or isinstance(zero, bool):
        raise BadInput(f"{where}: {role} scale must be a number and zero_point an integer")
    if dtype != "float32" and not (np.isfinite(scale) and scale > 0 and np.iinfo(dtype).min <= zero <= np.iinfo(dtype).max):
        raise BadInput(f"{where}: {role} is {dtype}: it needs a positive scale and a zero_point in the {dtype} range")
    return TensorInfo(role, tuple(shape), dtype, float(scale), zero)


class NullBackend(ClassifierBackend):
    name = BackendName.NULL.value

    def __init__(self, path: Path, plan: Any, placement: Placed) -> None:
        """The description at ``path``; ``plan`` and ``placement`` change nothing (the threads are only kept)."""
        where = str(path)
        try:
            with open_regular(path, "null model") as fh:  # a FIFO is refused, not waited on; a huge file is not read whole
                raw = fh.read(MAX_MODEL_BYTES + 1)
        except OSError as exc:
            raise BadInput(f"{where}: cannot read the model ({exc.strerror})") from None
        if len(raw) > MAX_MODEL_BYTES:
            raise BadInput(f"{where}: a null model is a JSON description of at most {MAX_MODEL_BYTES} bytes")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise BadInput(f"{where}: not a null model (JSON: {exc})") from None
        if not isinstance(data, dict):
            raise BadInput(f"{where}: a null model is a JSON object with 'input' and 'output'")
        self.input, self.output = _tensor(data.get("input"), "input", where), _tensor(data.get("output"), "output", where)
        self.threads = placement.threads

    def _run(self, batch: Any) -> Any:
        out = np.empty((len(batch), *self.output.shape[1:]), self.output.dtype)
        for i, row in enumerate(batch):
            rng = np.random.default_rng(int.from_bytes(hashlib.sha256(row.tobytes()).digest()[:8], "little"))
            if self.output.dtype == "float32":
                out[i] = rng.standard_normal(out.shape[1:], np.float32)
            else:
                info = np.iinfo(self.output.dtype)
                out[i] = rng.integers(info.min, info.max, out.shape[1:], dtype=self.output.dtype, endpoint=True)
        return out

    def offload(self) -> Offload:
        return Offload("ops", 0, 0)

    @staticmethod
    def describe(input: TensorInfo, output: TensorInfo) -> bytes:
        """The model file for these tensors (what a null bundle carries as its weights)."""
        def tensor(t: TensorInfo) -> dict[str, Any]:
            return {"shape": [-1, *t.shape[1:]], "dtype": t.dtype, "scale": t.scale, "zero_point": t.zero_point}

        return json.dumps({"input": tensor(input), "output": tensor(output)}).encode()
