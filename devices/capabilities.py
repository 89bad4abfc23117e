"""What the installed Python packages can drive: llama.cpp GPU offload, LiteRT delegates, ONNX Runtime providers.

Each backend package is imported inside its probe function only, never at module
import, and a package that is absent is reported as not installed with the pip
line that installs it; a package that is present but fails to import (a broken
native library) is reported with its error. Probing loads no model and opens no
device.
"""

from __future__ import annotations

import ctypes
import enum
import importlib
import logging
from dataclasses import dataclass, field

from runtime.errors import BadInput

log = logging.getLogger(__name__)


class Backend(str, enum.Enum):
    LLAMACPP = "llamacpp"
    LITERT = "litert"
    ORT = "ort"
    NULL = "null"  # the do-nothing backend: always present, CPU only

    @classmethod
    def parse(cls, value: "Backend | str") -> "Backend":
        if isinstance(value, Backend):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise BadInput(f"backend {value!r} is not valid; valid backends: {', '.join(b.value for b in cls)}") from None


# The pip line for each backend's package; extras where pyproject has one.
INSTALL = {
    Backend.LLAMACPP: "pip install 'edgerun[llm]'  (llama-cpp-python==0.3.36, compiles llama.cpp)",
    Backend.LITERT: "pip install ai-edge-litert",
    Backend.ORT: "pip install onnxruntime",
    Backend.NULL: "",
}
GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "ROCMExecutionProvider", "MIGraphXExecutionProvider")
NPU_PROVIDERS = ("OpenVINOExecutionProvider", "QNNExecutionProvider", "VitisAIExecutionProvider", "RknpuExecutionProvider")
EDGETPU_LIBRARY = "libedgetpu.so.1"
LITERT_GPU_LIBRARY = "libtensorflowlite_gpu_delegate.so"


@dataclass(frozen=True)
class BackendCaps:
    backend: Backend
    installed: bool
    version: str | None = None
    module: str | None = None  # the module that was imported
    gpu: bool = False  # this install can offload to a GPU (built with CUDA, has a GPU provider or delegate)
    npu: bool = False  # this install can reach an NPU (Edge TPU delegate, OpenVINO/QNN provider)
    providers: tuple[str, ...] = ()  # ORT execution providers in preference order
    delegates: tuple[str, ...] = ()  # LiteRT delegate libraries that load
    error: str | None = None  # why a present package could not be imported
    notes: tuple[str, ...] = field(default=())

    @property
    def install(self) -> str:
        return INSTALL[self.backend]

    def to_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend.value,
            "installed": self.installed,
            "version": self.version,
            "module": self.module,
            "gpu": self.gpu,
            "npu": self.npu,
            "providers": list(self.providers),
            "delegates": list(self.delegates),
            "error": self.error,
            "notes": list(self.notes),
            "install": None if self.installed else self.install,
        }


def _import(name: str):
    """The module, None when it is not installed; other import failures propagate."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == name or name.startswith(exc.name + ".")):
            return None
        raise


def probe_llamacpp() -> BackendCaps:
    try:
        llama_cpp = _import("llama_cpp")
    except Exception as exc:  # a broken native library raises OSError/RuntimeError on import
        return BackendCaps(Backend.LLAMACPP, installed=False, module="llama_cpp", error=f"{type(exc).__name__}: {exc}")
    if llama_cpp is None:
        return BackendCaps(Backend.LLAMACPP, installed=False, module="llama_cpp")
    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    notes = ()
    if not gpu:
        notes = ("this llama.cpp build has no GPU offload (a CPU-only build)",)
    return BackendCaps(
        Backend.LLAMACPP, installed=True, version=getattr(llama_cpp, "__version__", None), module="llama_cpp", gpu=gpu, notes=notes
    )


def _library_loads(name: str) -> bool:
    try:
        ctypes.CDLL(name)
        return True
    except OSError:  # not on the loader path: the delegate cannot be used from Python either
        return False


def probe_litert() -> BackendCaps:
    module = None
    for name in ("ai_edge_litert.interpreter", "tflite_runtime.interpreter"):
        try:
            module = _import(name)
        except Exception as exc:
            return BackendCaps(Backend.LITERT, installed=False, module=name, error=f"{type(exc).__name__}: {exc}")
        if module is not None:
            break
    if module is None:
        return BackendCaps(Backend.LITERT, installed=False, module="ai_edge_litert")
    top = importlib.import_module(module.__name__.split(".")[0])
    delegates = tuple(lib for lib in (EDGETPU_LIBRARY, LITERT_GPU_LIBRARY) if _library_loads(lib))
    return BackendCaps(
        Backend.LITERT,
        installed=True,
        version=getattr(top, "__version__", None),
        module=module.__name__,
        gpu=LITERT_GPU_LIBRARY in delegates,
        npu=EDGETPU_LIBRARY in delegates,
        delegates=delegates,
        notes=("CPU runs through the built-in XNNPACK delegate",),
    )


def probe_ort() -> BackendCaps:
    try:
        ort = _import("onnxruntime")
    except Exception as exc:
        return BackendCaps(Backend.ORT, installed=False, module="onnxruntime", error=f"{type(exc).__name__}: {exc}")
    if ort is None:
        return BackendCaps(Backend.ORT, installed=False, module="onnxruntime")
    providers = tuple(ort.get_available_providers())
    return BackendCaps(
        Backend.ORT,
        installed=True,
        version=getattr(ort, "__version__", None),
        module="onnxruntime",
        gpu=any(p in providers for p in GPU_PROVIDERS),
        npu=any(p in providers for p in NPU_PROVIDERS),
        providers=providers,
    )


def probe(backend: Backend | str) -> BackendCaps:
    backend = Backend.parse(backend)
    if backend is Backend.NULL:
        return BackendCaps(Backend.NULL, installed=True, module="runtime.backends.null")
    return {Backend.LLAMACPP: probe_llamacpp, Backend.LITERT: probe_litert, Backend.ORT: probe_ort}[backend]()


def probe_all() -> dict[Backend, BackendCaps]:
    return {b: probe(b) for b in Backend if b is not Backend.NULL}
