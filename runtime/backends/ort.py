"""ONNX Runtime backend: one InferenceSession per loaded .onnx model.

Threads are ORT's intra-op threads; the execution providers come from the
placement (CUDA/TensorRT, OpenVINO, QNN, then CPU). After load the session
itself reports which provider each node of its optimized graph was assigned to
(``session.record_ep_graph_assignment_info``): the offload is counted from
that, per provider, whatever was asked for.

ORT's own telemetry (a device id and an event database under
``~/.cache/Microsoft/``, and uploads) is turned off by ``runtime/__init__.py``,
which sets ``ORT_DISABLE_TELEMETRY`` before anything imports onnxruntime.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from devices.backends import BACKENDS, BackendName
from runtime.backends.base import DYNAMIC, ClassifierBackend, CpuFeatures, Offload, Placed, TensorInfo, bounded_shape
from runtime.backends.ort_shapes import check_declared_shapes
from runtime.errors import BadInput, not_installed, one_line
from runtime.formats.model_files import check_onnx

log = logging.getLogger(__name__)
INSTALL = BACKENDS[BackendName.ORT].install
ORT_DTYPES = {"tensor(float)": "float32", "tensor(int8)": "int8", "tensor(uint8)": "uint8"}
CPU_PROVIDER = "CPUExecutionProvider"
# Session config keys (onnxruntime_session_options_config_keys.h).
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"
EXACT_U8S8 = "session.x64quantprecision"
SPIN_KEYS = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")
ORT_ERRORS_ONLY, ORT_FATAL_ONLY = 3, 4  # OrtLoggingLevel


def _ort():
    try:
        import onnxruntime
    except ModuleNotFoundError:
        raise not_installed("onnxruntime", INSTALL, purpose="the ONNX Runtime backend") from None
    return onnxruntime


def _info(arg: Any, path: Path) -> TensorInfo:
    dtype = ORT_DTYPES.get(arg.type)
    if dtype is None:
        raise BadInput(f"{path}: tensor {arg.name!r} has type {arg.type}; classifiers take {', '.join(ORT_DTYPES)}")
    # ORT gives a symbolic dimension as its name and an unset one as None: both are dynamic. A number is the file's
    # own: zero, negative or too large a tensor is refused here, before anything is sized by it.
    dims = [d if isinstance(d, int) else DYNAMIC for d in (arg.shape or ())]
    return TensorInfo(arg.name, bounded_shape(str(path), arg.name, dims), dtype)


def _check_shapes(path: Path) -> None:
    """The file's declared input and output shapes, bounded (runtime.backends.ort_shapes); check_onnx has read
    and bounded the file (at most 2 GiB) already."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the model ({exc.strerror})") from None
    check_declared_shapes(data, str(path))


def needs_exact_u8s8(cpu: CpuFeatures) -> bool:
    """Whether ORT must be asked for its exact uint8 x int8 kernels on the CPU ``cpu`` (the placement's).

    x86 CPUs without VNNI (AVX2, AVX-512 before VNNI) multiply uint8 activations by int8 weights with
    VPMADDUBSW, whose 16-bit pair sums saturate: MobileNetV2 INT8 fell from 79 % to 65.5 % top-1 agreement
    with float on such a machine. With VNNI (VPDPBUSD sums into 32 bits) or on ARM the fast kernel is already
    exact, and the option only costs time: EfficientNet-Lite0 INT8 at 1 thread on an AVX-512 VNNI EPYC ran
    11.6 ms with it and 5.6 ms without (11.5 ms in float)."""
    return cpu.arch in ("x86_64", "i686") and not cpu.int8_dot


class ORTBackend(ClassifierBackend):
    name = BackendName.ORT.value

    def __init__(self, path: Path, plan: Any, placement: Placed) -> None:
        """The .onnx at ``path`` on ``placement``'s intra-op threads and execution providers (none: the CPU's); its
        idle threads spin-wait unless the placement shares cores with other work, and its CPU's features decide the
        INT8 kernels. ``plan`` sizes nothing here (ORT allocates its own arena)."""
        check_onnx(path)  # before the native parser sees the file
        _check_shapes(path)
        ort = _ort()
        threads, providers, spin = placement.threads, placement.providers or (CPU_PROVIDER,), not placement.shares_cores
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # ORT logs to stderr past Python's logging; its errors reach the user as our one-line BackendError.
        options.log_severity_level = ORT_ERRORS_ONLY if log.isEnabledFor(logging.INFO) else ORT_FATAL_ONLY
        options.add_session_config_entry(RECORD_ASSIGNMENT, "1")
        if needs_exact_u8s8(placement.cpu):
            options.add_session_config_entry(EXACT_U8S8, "1")
        if not spin:
            for key in SPIN_KEYS:
                options.add_session_config_entry(key, "0")
        available = set(ort.get_available_providers())
        kept = [p for p in providers if p in available] or [CPU_PROVIDER]
        if len(kept) != len(providers):
            log.info("onnxruntime here lacks %s; using %s", ", ".join(p for p in providers if p not in available), ", ".join(kept))
        try:
            self._session = ort.InferenceSession(str(path), options, providers=kept)
        except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, NotImplemented)
            raise BadInput(f"{path}: ONNX Runtime cannot load the model ({type(exc).__name__}: {one_line(exc)})") from None
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1:
            raise BadInput(f"{path}: a classifier has one input and one output; this model has {len(inputs)} and {len(outputs)}")
        self.input, self.output = _info(inputs[0], path), _info(outputs[0], path)
        self.providers = tuple(self._session.get_providers())
        self._assigned: Counter[str] = Counter()
        for subgraph in self._session.get_provider_graph_assignment_info():
            self._assigned[subgraph.ep_name] += len(subgraph.get_nodes())

    def _run(self, batch: Any) -> Any:
        return self._session.run([self.output.name], {self.input.name: batch})[0]

    def session_option(self, key: str) -> str | None:
        """A session config entry as the session holds it (None when unset)."""
        try:
            return self._session.get_session_options().get_session_config_entry(key)
        except RuntimeError:  # "SessionOptions does not have configuration with key"
            return None

    def offload(self) -> Offload:
        on = sum(n for provider, n in self._assigned.items() if provider != CPU_PROVIDER)
        return Offload("nodes", on, sum(self._assigned.values()), by_device=tuple(sorted(self._assigned.items())))

    def close(self) -> None:
        self._session = None  # type: ignore[assignment]
