"""LiteRT (TensorFlow Lite) backend: one Interpreter per loaded .tflite model.

The Interpreter is imported from ``ai_edge_litert``; ``tflite_runtime`` is used
only when that is absent (old boards), with a warning: it needs numpy<2, refuses
today's INT4 and dynamic-range models and runs INT8 far slower. The CPU path is
the built-in XNNPACK delegate with ``num_threads`` threads; a placement with a
delegate library (GPU, Edge TPU) loads it with ``load_delegate`` and counts the
ops the delegate took.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from runtime.backends.base import ClassifierBackend, TensorInfo
from runtime.errors import BackendError, BadInput, MissingDependency
from runtime.model_files import check_tflite

log = logging.getLogger(__name__)
INSTALL = "pip install ai-edge-litert==2.3.0"
DELEGATE_OP = "DELEGATE"  # what a delegated partition shows as in the op list


def _interpreter_module():
    try:
        from ai_edge_litert import interpreter

        return interpreter
    except ModuleNotFoundError:
        pass
    try:
        from tflite_runtime import interpreter  # type: ignore[import-not-found]
    except ModuleNotFoundError:
        raise MissingDependency(f"the LiteRT backend needs 'ai_edge_litert'; install it with: {INSTALL}") from None
    log.warning("using tflite_runtime: it rejects INT4/dynamic-range models and its INT8 path is ~20x slower; %s", INSTALL)
    return interpreter


def _info(detail: dict[str, Any]) -> TensorInfo:
    shape = tuple(int(d) for d in detail.get("shape_signature", detail["shape"]))
    scale, zero = detail.get("quantization", (0.0, 0))
    return TensorInfo(detail["name"], shape, np.dtype(detail["dtype"]).name, float(scale), int(zero))


class LiteRTBackend(ClassifierBackend):
    name = "litert"

    def __init__(self, path: Path, *, threads: int, delegate: str | None = None) -> None:
        check_tflite(path)  # before the native parser sees the file
        module = _interpreter_module()
        self._delegates: list[Any] = []
        if delegate:
            try:
                self._delegates.append(module.load_delegate(delegate))
            except (ValueError, OSError, RuntimeError) as exc:
                raise BackendError(f"LiteRT cannot load the delegate {delegate} ({exc})") from None
        try:
            self._it = module.Interpreter(
                model_path=str(path), num_threads=threads, experimental_delegates=self._delegates or None
            )
            self._it.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise BadInput(f"{path}: LiteRT cannot load the model ({str(exc).strip()[:400]})") from None
        inputs, outputs = self._it.get_input_details(), self._it.get_output_details()
        if len(inputs) != 1 or len(outputs) != 1:
            raise BadInput(f"{path}: a classifier has one input and one output; this model has {len(inputs)} and {len(outputs)}")
        self._in, self._out = inputs[0]["index"], outputs[0]["index"]
        self.input, self.output = _info(inputs[0]), _info(outputs[0])
        self._batch = int(inputs[0]["shape"][0])  # rows the allocated tensors take now

    def _resize(self, n: int) -> bool:
        if n == self._batch:
            return True
        try:  # strict=False: litert-torch exports a fixed batch of 1 that XNNPACK can still resize
            self._it.resize_tensor_input(self._in, [n, *self.input.shape[1:]], strict=False)
            self._it.allocate_tensors()
            self._batch = n
            return True
        except (ValueError, RuntimeError) as exc:
            log.info("LiteRT cannot take a batch of %d (%s); running rows one at a time", n, exc)
            self._it.resize_tensor_input(self._in, [1, *self.input.shape[1:]], strict=False)
            self._it.allocate_tensors()
            self._batch = 1
            return False

    def _run(self, batch: Any) -> Any:
        self._it.set_tensor(self._in, batch)
        self._it.invoke()
        return self._it.get_tensor(self._out).copy()

    def offload(self) -> Any:
        from devices.placement import Offload

        ops = self._it._get_ops_details()  # public API has no op list; stable across ai-edge-litert 1.x-2.x
        on = sum(1 for op in ops if op.get("op_name") == DELEGATE_OP) if self._delegates else 0
        return Offload("ops", on, len(ops))

    def tensor_bytes(self) -> int:
        """Bytes of all non-constant tensors at the current batch (the arena's upper bound)."""
        constants = self._constants()
        return sum(int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize
                   for t in self._it.get_tensor_details() if t["index"] not in constants)

    def _constants(self) -> set[int]:
        ops = self._it._get_ops_details()
        produced = {i for op in ops for i in op["outputs"]} | {self._in}
        return {t["index"] for t in self._it.get_tensor_details()} - produced

    def close(self) -> None:
        # The interpreter must go before the delegates it uses.
        self._it = None  # type: ignore[assignment]
        self._delegates.clear()
