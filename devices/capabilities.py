"""What the installed Python packages can drive: llama.cpp GPU offload, LiteRT delegates, ONNX Runtime providers.

Each backend package is imported inside its probe function only, never at module
import, and a package that is absent is reported as not installed with the pip
line that installs it; a package that is present but fails to import (a broken
native library) is reported with its error. Probing loads no model and opens no
device.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from dataclasses import dataclass, field

from devices.backends import BACKENDS, BackendName

log = logging.getLogger(__name__)


GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "ROCMExecutionProvider", "MIGraphXExecutionProvider")
NPU_PROVIDERS = ("OpenVINOExecutionProvider", "QNNExecutionProvider", "VitisAIExecutionProvider", "RknpuExecutionProvider")
EDGETPU_LIBRARY = "libedgetpu.so.1"
LITERT_GPU_LIBRARY = "libtensorflowlite_gpu_delegate.so"


@dataclass(frozen=True)
class BackendCaps:
    backend: BackendName
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
        return BACKENDS[self.backend].install

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
    (name,) = BACKENDS[BackendName.LLAMACPP].probe_modules
    try:
        llama_cpp = _import(name)
    except Exception as exc:  # a broken native library raises OSError/RuntimeError on import
        return BackendCaps(BackendName.LLAMACPP, installed=False, module=name, error=f"{type(exc).__name__}: {exc}")
    if llama_cpp is None:
        return BackendCaps(BackendName.LLAMACPP, installed=False, module=name)
    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    notes = ()
    if not gpu:
        notes = ("this llama.cpp build has no GPU offload (a CPU-only build)",)
    return BackendCaps(
        BackendName.LLAMACPP, installed=True, version=getattr(llama_cpp, "__version__", None), module=name, gpu=gpu, notes=notes
    )


def _library_loads(name: str) -> bool:
    try:
        ctypes.CDLL(name)
        return True
    except OSError:  # not on the loader path: the delegate cannot be used from Python either
        return False


def probe_litert() -> BackendCaps:
    module = None
    names = BACKENDS[BackendName.LITERT].probe_modules
    for name in names:
        try:
            module = _import(name)
        except Exception as exc:
            return BackendCaps(BackendName.LITERT, installed=False, module=name, error=f"{type(exc).__name__}: {exc}")
        if module is not None:
            break
    if module is None:
        return BackendCaps(BackendName.LITERT, installed=False, module=names[0].split(".")[0])
    top = importlib.import_module(module.__name__.split(".")[0])
    delegates = tuple(lib for lib in (EDGETPU_LIBRARY, LITERT_GPU_LIBRARY) if _library_loads(lib))
    return BackendCaps(
        BackendName.LITERT,
        installed=True,
        version=getattr(top, "__version__", None),
        module=module.__name__,
        gpu=LITERT_GPU_LIBRARY in delegates,
        npu=EDGETPU_LIBRARY in delegates,
        delegates=delegates,
        notes=("CPU runs through the built-in XNNPACK delegate",),
    )


def probe_ort() -> BackendCaps:
    (name,) = BACKENDS[BackendName.ORT].probe_modules
    try:
        ort = _import(name)
    except Exception as exc:
        return BackendCaps(BackendName.ORT, installed=False, module=name, error=f"{type(exc).__name__}: {exc}")
    if ort is None:
        return BackendCaps(BackendName.ORT, installed=False, module=name)
    providers = tuple(ort.get_available_providers())
    return BackendCaps(
        BackendName.ORT,
        installed=True,
        version=getattr(ort, "__version__", None),
        module=name,
        gpu=any(p in providers for p in GPU_PROVIDERS),
        npu=any(p in providers for p in NPU_PROVIDERS),
        providers=providers,
    )


def probe(backend: BackendName | str) -> BackendCaps:
    spec = BACKENDS[BackendName.parse(backend)]
    if not spec.probe_modules:  # nothing to import: always present
        return BackendCaps(spec.name, installed=True, module=spec.module)
    return {BackendName.LLAMACPP: probe_llamacpp, BackendName.LITERT: probe_litert, BackendName.ORT: probe_ort}[spec.name]()


def probe_all() -> dict[BackendName, BackendCaps]:
    """Every backend that has a package to probe (the null backend has none)."""
    return {name: probe(name) for name, spec in BACKENDS.items() if spec.probe_modules}
