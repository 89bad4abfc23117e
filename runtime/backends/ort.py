"""ONNX Runtime backend: one InferenceSession per loaded .onnx model.

Threads are ORT's intra-op threads; the execution providers come from the
placement (CUDA/TensorRT, OpenVINO, QNN, then CPU). After load the session is
asked which providers it really kept; ORT does not report node counts per
provider through Python, so the offload is all nodes on the first provider when
that provider is an accelerator's, else none.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runtime.backends.base import ClassifierBackend, TensorInfo
from runtime.errors import BadInput, MissingDependency
from runtime.model_files import check_onnx

log = logging.getLogger(__name__)
INSTALL = "pip install onnxruntime==1.32.0"
ORT_DTYPES = {"tensor(float)": "float32", "tensor(int8)": "int8", "tensor(uint8)": "uint8"}


def _ort():
    try:
        import onnxruntime
    except ModuleNotFoundError:
        raise MissingDependency(f"the ONNX Runtime backend needs 'onnxruntime'; install it with: {INSTALL}") from None
    return onnxruntime


def _info(arg: Any, path: Path) -> TensorInfo:
    dtype = ORT_DTYPES.get(arg.type)
    if dtype is None:
        raise BadInput(f"{path}: tensor {arg.name!r} has type {arg.type}; classifiers take {', '.join(ORT_DTYPES)}")
    shape = tuple(d if isinstance(d, int) and d > 0 else -1 for d in arg.shape)
    return TensorInfo(arg.name, shape, dtype)


class ORTBackend(ClassifierBackend):
    name = "ort"

    def __init__(self, path: Path, *, threads: int, providers: Sequence[str] = ("CPUExecutionProvider",)) -> None:
        check_onnx(path)  # before the native parser sees the file
        ort = _ort()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: ORT's warnings go to stderr bypassing logging
        # x86 CPUs without VNNI (AVX2, AVX-512 before VNNI) multiply uint8 activations by int8 weights with
        # VPMADDUBSW, whose 16-bit pair sums saturate: MobileNetV2 INT8 fell from 79 % to 65.5 % top-1
        # agreement with float on such a machine. This makes ORT use exact uint8 x uint8 kernels there
        # (slower); it changes nothing on VNNI or ARM CPUs, where the fast kernels are already exact.
        options.add_session_config_entry("session.x64quantprecision", "1")
        try:
            self._session = ort.InferenceSession(str(path), options, providers=list(providers) or ["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, NotImplemented)
            raise BadInput(f"{path}: ONNX Runtime cannot load the model ({type(exc).__name__}: {str(exc)[:400]})") from None
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1:
            raise BadInput(f"{path}: a classifier has one input and one output; this model has {len(inputs)} and {len(outputs)}")
        self.input, self.output = _info(inputs[0], path), _info(outputs[0], path)
        self.providers = tuple(self._session.get_providers())
        self._nodes = _count_nodes(path)

    def _run(self, batch: Any) -> Any:
        return self._session.run([self.output.name], {self.input.name: batch})[0]

    def offload(self) -> Any:
        from devices.placement import Offload

        on = self._nodes if self.providers and self.providers[0] != "CPUExecutionProvider" else 0
        return Offload("nodes", on, self._nodes)

    def close(self) -> None:
        self._session = None  # type: ignore[assignment]


def _count_nodes(path: Path) -> int:
    """Nodes in the main graph, from the protobuf wire format (no onnx package needed on the device)."""
    from runtime.model_files import ONNX_GRAPH_FIELD, _varint

    buf = path.read_bytes()
    where = str(path)

    def fields(start: int, end: int):
        at = start
        while at < end:
            key, at = _varint(buf, at, where)
            number, wire = key >> 3, key & 7
            if wire == 2:
                length, at = _varint(buf, at, where)
                yield number, at, at + length
                at += length
            elif wire == 0:
                _, at = _varint(buf, at, where)
            else:
                at += 8 if wire == 1 else 4

    for number, start, end in fields(0, len(buf)):
        if number == ONNX_GRAPH_FIELD:
            return sum(1 for n, _, _ in fields(start, end) if n == 1)  # GraphProto.node = 1
    return 0
