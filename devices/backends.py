"""The one table of backends: for each, its name, its runtime module, what it loads and serves, where it runs.

Every place that picks, probes, places or installs a backend consults :data:`BACKENDS`; no other module
spells a backend's name. It lives in devices/ because both layers read it: runtime/ may import devices/,
devices/ may not import runtime/ (tests/test_layering.py). ``module`` is data here: devices never imports
it; runtime.backends.backend_class does, only when a bundle asks for that backend.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from devices.target import Target
from runtime.errors import BadInput


class BackendName(str, enum.Enum):
    LLAMACPP = "llamacpp"
    LITERT = "litert"
    ORT = "ort"
    NULL = "null"  # the do-nothing backend: always present, CPU only

    @classmethod
    def parse(cls, value: BackendName | str) -> BackendName:
        """A BackendName from a CLI string; BadInput naming the valid backends otherwise."""
        if isinstance(value, BackendName):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise BadInput(f"backend {value!r} is not valid; valid backends: {', '.join(b.value for b in cls)}") from None


@dataclass(frozen=True)
class BackendSpec:
    name: BackendName
    title: str  # how a message names it
    module: str  # the runtime module that drives it, imported only when asked for (runtime.backends.backend_class)
    cls: str  # the backend class in ``module``
    model_format: str  # the one runtime.bundle.manifest.ModelFormat it loads
    kinds: tuple[str, ...]  # the runtime.bundle.manifest.ModelKind values it serves
    targets: tuple[Target, ...]  # where it can run (auto resolves among these)
    # Its package pinned as pyproject.toml's extras pin it; "" when nothing is needed. The one copy of the pin in
    # runtime/ and devices/: every install line and message is made from it (tests/devices/test_install_pins.py).
    requirement: str
    probe_modules: tuple[str, ...]  # what devices.capabilities imports to probe it, in preference order; () = always present
    install_via: str = "pip install {requirement}"  # how the requirement is installed, when pip alone does not say it
    gpu_build_via: str = ""  # how a GPU build of it is installed, when it needs one ("" when none does)

    def takes(self, target: Target) -> bool:
        return target in self.targets

    @property
    def install(self) -> str:
        """The pip line that installs its package; "" when nothing is needed."""
        return self.install_via.format(requirement=self.requirement) if self.requirement else ""

    @property
    def gpu_build(self) -> str:
        """The command that installs a GPU build of its package; "" when it has none to build."""
        return self.gpu_build_via.format(requirement=self.requirement)


BACKENDS: dict[BackendName, BackendSpec] = {
    spec.name: spec
    for spec in (
        BackendSpec(
            name=BackendName.LLAMACPP,
            title="llama.cpp",
            module="runtime.backends.llamacpp",
            cls="LlamaCppBackend",
            model_format="gguf",
            kinds=("llm",),
            targets=(Target.CPU, Target.GPU),
            requirement="llama-cpp-python==0.3.36",
            probe_modules=("llama_cpp",),
            install_via="pip install 'edgerun[llm]'  ({requirement}, compiles llama.cpp)",
            gpu_build_via='CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir {requirement}',
        ),
        BackendSpec(
            name=BackendName.LITERT,
            title="LiteRT",
            module="runtime.backends.litert",
            cls="LiteRTBackend",
            model_format="tflite",
            kinds=("vision", "audio", "anomaly"),
            targets=(Target.CPU, Target.GPU, Target.NPU),
            requirement="ai-edge-litert==2.3.0",
            probe_modules=("ai_edge_litert.interpreter", "tflite_runtime.interpreter"),
        ),
        BackendSpec(
            name=BackendName.ORT,
            title="ONNX Runtime",
            module="runtime.backends.ort",
            cls="ORTBackend",
            model_format="onnx",
            kinds=("vision", "audio", "anomaly"),
            targets=(Target.CPU, Target.GPU, Target.NPU),
            requirement="onnxruntime==1.32.0",
            probe_modules=("onnxruntime",),
        ),
        BackendSpec(
            name=BackendName.NULL,
            title="null backend",
            module="runtime.backends.null",
            cls="NullBackend",
            model_format="null",
            kinds=("vision", "audio", "anomaly"),
            targets=(Target.CPU,),
            requirement="",
            probe_modules=(),
        ),
    )
}


def spec(name: BackendName | str) -> BackendSpec:
    return BACKENDS[BackendName.parse(name)]


def for_format(model_format: str) -> BackendSpec:
    """The backend that loads ``model_format``; BadInput naming the formats the table knows otherwise."""
    for candidate in BACKENDS.values():
        if candidate.model_format == model_format:
            return candidate
    valid = ", ".join(s.model_format for s in BACKENDS.values())
    raise BadInput(f"model format {model_format!r} has no backend (valid: {valid})")


def serving(kind: str) -> tuple[BackendName, ...]:
    """The backends that serve a model kind ("llm", "vision", "audio"), in table order."""
    return tuple(s.name for s in BACKENDS.values() if kind in s.kinds)
