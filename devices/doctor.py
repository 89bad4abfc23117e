"""The doctor's report: what this machine is, what each backend can use here, and what would fix the rest.

Hardware comes from the tree at ``root``; backend capabilities come from the
Python running this code (a captured tree has no Python to ask). Each
:class:`Finding` names a problem and the exact command or package that fixes it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from devices.accelerators import AcceleratorKind
from devices.backends import BACKENDS, BackendName
from devices.capabilities import BackendCaps, probe_all
from devices.machine import Machine, detect
from devices.placement import CUDA_KINDS, EDGETPU_KINDS
from devices.target import Target

CORAL_APT = (
    'echo "deb https://packages.cloud.google.com/apt coral-edgetpu-stable main" | sudo tee /etc/apt/sources.list.d/coral-edgetpu.list'
    " && sudo apt-get update && sudo apt-get install libedgetpu1-std"
)
LLAMA_CUDA = BACKENDS[BackendName.LLAMACPP].gpu_build
# ai-edge-litert publishes manylinux wheels for x86_64 and aarch64 on these CPython versions.
LITERT_PYTHONS = ((3, 9), (3, 10), (3, 11), (3, 12))


@dataclass(frozen=True)
class Finding:
    severity: str  # "missing" (a capability this hardware has but the software cannot use) or "warning"
    what: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class DoctorReport:
    machine: Machine
    backends: dict[BackendName, BackendCaps]
    findings: tuple[Finding, ...]
    python: str

    def usable_targets(self, backend: BackendName) -> tuple[Target, ...]:
        caps = self.backends[backend]
        if not caps.installed:
            return ()
        out = [Target.CPU]
        gpus = self.machine.accelerators_for(Target.GPU)
        npus = self.machine.accelerators_for(Target.NPU)
        takes = BACKENDS[backend].takes
        if caps.gpu and gpus and takes(Target.GPU):
            out.insert(0, Target.GPU)
        if caps.npu and any(a.problem is None for a in npus) and takes(Target.NPU):
            out.insert(0, Target.NPU)
        return tuple(out)

    def to_dict(self) -> dict[str, object]:
        return {
            "machine": self.machine.to_dict(),
            "python": self.python,
            "backends": {
                b.value: {**c.to_dict(), "usable_targets": [t.value for t in self.usable_targets(b)]} for b, c in self.backends.items()
            },
            "findings": [f.to_dict() for f in self.findings],
        }


def diagnose(
    root: str = "/", backends: dict[BackendName, BackendCaps] | None = None, python: tuple[int, int] | None = None
) -> DoctorReport:
    machine = detect(root)
    backends = probe_all() if backends is None else backends
    python = python or sys.version_info[:2]
    return DoctorReport(machine, backends, tuple(findings(machine, backends, python)), f"{python[0]}.{python[1]}")


def findings(machine: Machine, backends: dict[BackendName, BackendCaps], python: tuple[int, int]) -> list[Finding]:
    out: list[Finding] = []
    kinds = {a.kind for a in machine.accelerators}
    llama, litert, ort = backends.get(BackendName.LLAMACPP), backends.get(BackendName.LITERT), backends.get(BackendName.ORT)
    jetson = machine.board.jetson is not None

    for caps in backends.values():
        if caps.error:
            out.append(Finding("missing", f"{caps.module} is installed but fails to import: {caps.error}", f"reinstall it: {caps.install}"))
    if llama and not llama.installed and not llama.error:
        out.append(Finding("missing", "llama.cpp backend (llama-cpp-python) is not installed", llama.install))
    if llama and llama.installed and not llama.gpu and kinds & set(CUDA_KINDS):
        prefix = "CUDACXX=/usr/local/cuda/bin/nvcc " if jetson else ""
        out.append(Finding("missing", "this machine has an NVIDIA GPU but llama.cpp here was built without CUDA", prefix + LLAMA_CUDA))
    if kinds & set(EDGETPU_KINDS):
        if litert is None or not litert.installed:
            out.append(Finding("missing", "an Edge TPU is attached but no LiteRT interpreter is installed", _litert_fix(machine, python)))
        elif not litert.npu:
            out.append(Finding("missing", "an Edge TPU is attached but libedgetpu.so.1 (the Edge TPU runtime) is not installed", CORAL_APT))
        for acc in machine.accelerators:
            if acc.kind is AcceleratorKind.EDGETPU_PCIE and acc.problem:
                out.append(Finding("missing", acc.problem, "sudo apt-get install gasket-dkms (Coral apt repository), then reboot"))
    if kinds & set(CUDA_KINDS) and ort is not None and ort.installed and not ort.gpu:
        fix = (
            "install the onnxruntime-gpu wheel built for your JetPack from NVIDIA's Jetson AI Lab index (PyPI's has no aarch64 CUDA build)"
            if jetson
            else "pip uninstall onnxruntime && pip install onnxruntime-gpu"
        )
        out.append(Finding("missing", "this machine has an NVIDIA GPU but onnxruntime here has no CUDA provider", fix))
    if AcceleratorKind.INTEL_NPU in kinds and (ort is None or not ort.npu):
        out.append(
            Finding(
                "missing", "an Intel NPU is present but no ONNX Runtime OpenVINO provider is installed", "pip install onnxruntime-openvino"
            )
        )
    if AcceleratorKind.HAILO in kinds:
        out.append(
            Finding(
                "warning",
                "a Hailo accelerator is present; edgerun has no Hailo backend yet, models run on the CPU",
                "none in edgerun yet (HailoRT comes from Hailo's developer zone)",
            )
        )
    if AcceleratorKind.ROCKCHIP_NPU in kinds:
        out.append(
            Finding(
                "warning",
                "a Rockchip NPU is present; edgerun has no RKNN backend yet, models run on the CPU",
                "none in edgerun yet (rknn-toolkit-lite2 from Rockchip)",
            )
        )
    throttling = machine.live.throttling
    if throttling and throttling.raw & 0x10001:
        out.append(
            Finding(
                "warning",
                "under-voltage detected (" + ", ".join(throttling.now + throttling.since_boot) + ")",
                "use the official power supply (27 W USB-C for a Pi 5, 15 W for a Pi 4)",
            )
        )
    elif throttling and throttling.is_throttled_now:
        out.append(
            Finding(
                "warning",
                "the CPU is throttled now (" + ", ".join(throttling.now) + ")",
                "add a heatsink or fan; decode speed drops while throttled",
            )
        )
    temp = machine.live.cpu_temp_c
    if temp is not None and temp >= 80.0:
        out.append(Finding("warning", f"CPU at {temp:.1f} °C, near the throttling point", "improve cooling before long runs"))
    if jetson and machine.board.jetson.power_mode is None:
        out.append(
            Finding("warning", "Jetson power mode not readable", "run: sudo nvpmodel -q  (and sudo nvpmodel -m 0 for the maximum mode)")
        )
    return out


def _litert_fix(machine: Machine, python: tuple[int, int]) -> str:
    arch = machine.cpu.arch
    if arch not in ("x86_64", "aarch64"):
        return f"no LiteRT wheel exists for {arch}; use a 64-bit OS (aarch64)"
    if python not in LITERT_PYTHONS:
        versions = ", ".join(f"{a}.{b}" for a, b in LITERT_PYTHONS)
        return (f"ai-edge-litert has no wheel for Python {python[0]}.{python[1]} on {arch}; "
                f"use Python {versions} (for example a venv from python3.11)")
    return (f"{BACKENDS[BackendName.LITERT].install}  (wheel for CPython {python[0]}.{python[1]} on {arch}); "
            f"then {CORAL_APT.split(' && ')[-1]} for the Edge TPU delegate")
