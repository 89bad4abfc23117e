"""LiteRT (TensorFlow Lite) backend: one Interpreter per loaded .tflite model.

The Interpreter is imported from ``ai_edge_litert``; ``tflite_runtime`` is used
only when that is absent (old boards), with a warning: it needs numpy<2, refuses
today's INT4 and dynamic-range models and runs INT8 far slower. The CPU path is
the built-in XNNPACK delegate with ``num_threads`` threads; a placement with a
delegate library (GPU, Edge TPU) loads it with ``load_delegate``.

The offload is counted from the interpreter's own graph: each delegate replaces
the ops it takes by one DELEGATE node whose inputs and outputs bound them. A
delegate library is applied when the Interpreter is built, XNNPACK at the first
``allocate_tensors``, so the DELEGATE nodes present before that are the
library's. An Edge TPU runs only the ``edgetpu-custom-op`` that edgetpu_compiler
writes: a model without one is not handed to the Edge TPU delegate at all.

LiteRT's native code prints an INFO line on stderr when it creates XNNPACK; the
load runs with stderr closed unless logging is at INFO (``-v``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from devices.backends import BACKENDS, BackendName
from runtime.backends.base import ClassifierBackend, Offload, Placed, TensorInfo, bounded_shape
from runtime.errors import BackendError, BadInput, not_installed, one_line
from runtime.formats.model_files import check_tflite

log = logging.getLogger(__name__)
INSTALL = BACKENDS[BackendName.LITERT].install
DELEGATE_OP = "DELEGATE"  # what a delegated partition shows as in the op list
EDGETPU_LIBRARY = "libedgetpu.so.1"
EDGETPU_CUSTOM_OP = b"edgetpu-custom-op"  # the one op edgetpu_compiler writes for the part the Edge TPU runs
XNNPACK = "XNNPACK"


def _interpreter_module():
    try:
        from ai_edge_litert import interpreter

        return interpreter
    except ModuleNotFoundError:
        pass
    try:
        from tflite_runtime import interpreter  # type: ignore[import-not-found]
    except ModuleNotFoundError:
        raise not_installed("ai_edge_litert", INSTALL, purpose="the LiteRT backend") from None
    log.warning("using tflite_runtime: it rejects INT4/dynamic-range models and its INT8 path is ~20x slower; %s", INSTALL)
    return interpreter


def _shape(detail: dict[str, Any], where: str, empty_ok: bool = False) -> tuple[int, ...]:
    """A tensor's shape as the file declares it (-1 where dynamic), bounded (runtime.backends.base.bounded_shape)."""
    signature = detail.get("shape_signature")
    dims = detail["shape"] if signature is None or not len(signature) else signature
    return bounded_shape(where, detail["name"], dims, empty_ok=empty_ok)


def _info(detail: dict[str, Any], where: str) -> TensorInfo:
    scale, zero = detail.get("quantization", (0.0, 0))
    return TensorInfo(detail["name"], _shape(detail, where), np.dtype(detail["dtype"]).name, float(scale), int(zero))


@contextlib.contextmanager
def _native_stderr_closed() -> Iterator[None]:
    """File descriptor 2 on /dev/null while the block runs, unless logging is at INFO (-v).

    Errors still arrive: LiteRT raises them as Python exceptions with the native message."""
    if log.isEnabledFor(logging.INFO):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class LiteRTBackend(ClassifierBackend):
    name = BackendName.LITERT.value

    def __init__(self, path: Path, plan: Any, placement: Placed) -> None:
        """The .tflite at ``path`` on ``placement``'s threads and delegate library (None: XNNPACK on the CPU);
        ``plan`` sizes nothing here (the interpreter allocates its own arena)."""
        threads, delegate = placement.threads, placement.delegate
        check_tflite(path)  # before the native parser sees the file
        module = _interpreter_module()
        self._delegates: list[Any] = []
        self._delegate, self._why = delegate, None
        if delegate == EDGETPU_LIBRARY and EDGETPU_CUSTOM_OP not in path.read_bytes():
            self._why = "the model was not compiled for the Edge TPU: it has no edgetpu-custom-op (compile it with edgetpu_compiler)"
            log.info("%s: %s; not loading %s", path, self._why, delegate)
        elif delegate:
            try:
                self._delegates.append(module.load_delegate(delegate))
            except (ValueError, OSError, RuntimeError) as exc:
                raise BackendError(f"LiteRT cannot load the delegate {delegate} ({one_line(exc)})") from None
        try:
            with _native_stderr_closed():
                self._it = module.Interpreter(
                    model_path=str(path), num_threads=threads, experimental_delegates=self._delegates or None
                )
                self._library_nodes = self._it._interpreter.NumNodes()  # before XNNPACK joins at allocate_tensors
                for detail in self._it.get_tensor_details():  # every tensor the file declares, before the arena is sized
                    _shape(detail, str(path), empty_ok=True)
                self._it.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise BadInput(f"{path}: LiteRT cannot load the model ({one_line(exc)})") from None
        inputs, outputs = self._it.get_input_details(), self._it.get_output_details()
        if len(inputs) != 1 or len(outputs) != 1:
            raise BadInput(f"{path}: a classifier has one input and one output; this model has {len(inputs)} and {len(outputs)}")
        self._in, self._out = inputs[0]["index"], outputs[0]["index"]
        self.input, self.output = _info(inputs[0], str(path)), _info(outputs[0], str(path))
        self._batch = int(inputs[0]["shape"][0])  # rows the allocated tensors take now

    def _resize(self, n: int) -> int:
        if n == self._batch:
            return n
        try:  # strict=False: litert-torch exports a fixed batch of 1 that XNNPACK can still resize
            self._it.resize_tensor_input(self._in, [n, *self.input.shape[1:]], strict=False)
            self._it.allocate_tensors()
            self._batch = n
        except (ValueError, RuntimeError) as exc:
            rows = max(self.input.shape[0], 1)  # the batch the model was built for
            log.info("LiteRT cannot take a batch of %d (%s); running %d row(s) at a time", n, exc, rows)
            self._it.resize_tensor_input(self._in, [rows, *self.input.shape[1:]], strict=False)
            self._it.allocate_tensors()
            self._batch = rows
        return self._batch

    def _run(self, batch: Any) -> Any:
        self._it.set_tensor(self._in, batch)
        self._it.invoke()
        return self._it.get_tensor(self._out).copy()

    def offload(self) -> Offload:
        ops = self._it._get_ops_details()  # public API has no op list; stable across ai-edge-litert 1.x-2.x
        library, xnnpack = _delegated(ops, self._library_nodes)
        total = sum(1 for op in ops if op["op_name"] != DELEGATE_OP)
        counts = {self._delegate or "": library, XNNPACK: xnnpack, "CPU": total - library - xnnpack}
        return Offload("ops", library, total, by_device=tuple((k, n) for k, n in counts.items() if k and n), why=self._why)

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


def _delegated(ops: list[dict[str, Any]], library_nodes: int) -> tuple[int, int]:
    """(ops taken by the delegate library, ops taken by XNNPACK).

    A DELEGATE node stands for the original ops between its inputs and its outputs: walk back from its
    outputs through the ops that produce them, stopping at its inputs."""
    producer = {int(t): op["index"] for op in ops if op["op_name"] != DELEGATE_OP for t in op["outputs"]}
    by_index = {op["index"]: op for op in ops}
    taken: dict[int, bool] = {}  # original op index -> taken by the library (else by XNNPACK)
    for node in ops:
        if node["op_name"] != DELEGATE_OP:
            continue
        bound = {int(t) for t in node["inputs"]}
        todo = [int(t) for t in node["outputs"]]
        while todo:
            op = producer.get(todo.pop())
            if op is None or op in taken:
                continue
            taken[op] = node["index"] < library_nodes
            todo.extend(int(t) for t in by_index[op]["inputs"] if int(t) not in bound and int(t) >= 0)
    library = sum(taken.values())
    return library, len(taken) - library
