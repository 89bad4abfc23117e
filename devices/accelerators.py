"""Accelerators visible on the machine: device nodes, USB and PCI ids, DRM render nodes.

Presence of hardware only; whether a backend can drive it is :mod:`devices.capabilities`.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

from devices.rootfs import RootFS
from devices.target import Target


class AcceleratorKind(str, enum.Enum):
    NVIDIA_GPU = "nvidia-gpu"  # discrete NVIDIA GPU (/dev/nvidiaN)
    JETSON_GPU = "jetson-gpu"  # Tegra integrated GPU (/dev/nvhost-*, /dev/nvgpu)
    EDGETPU_USB = "edgetpu-usb"  # Coral USB Accelerator
    EDGETPU_PCIE = "edgetpu-pcie"  # Coral M.2 / Mini PCIe (/dev/apex_N via the gasket driver)
    HAILO = "hailo"  # Hailo-8/8L (/dev/hailoN)
    ROCKCHIP_NPU = "rockchip-npu"  # RK3588/RK3566 NPU (device-tree npu node)
    INTEL_NPU = "intel-npu"  # Core Ultra NPU (/dev/accel/accelN, driver intel_vpu)
    DRM_GPU = "drm-gpu"  # any other GPU with a render node (v3d on a Pi, i915, amdgpu, mali)


TARGET_OF = {
    AcceleratorKind.NVIDIA_GPU: Target.GPU,
    AcceleratorKind.JETSON_GPU: Target.GPU,
    AcceleratorKind.DRM_GPU: Target.GPU,
    AcceleratorKind.EDGETPU_USB: Target.NPU,
    AcceleratorKind.EDGETPU_PCIE: Target.NPU,
    AcceleratorKind.HAILO: Target.NPU,
    AcceleratorKind.ROCKCHIP_NPU: Target.NPU,
    AcceleratorKind.INTEL_NPU: Target.NPU,
}

# USB ids of the Coral USB Accelerator: before its firmware is loaded it enumerates as
# Global Unichip 1a6e:089a, afterwards as Google 18d1:9302 (Coral docs, "Get started").
CORAL_USB_IDS = {("1a6e", "089a"): "Coral USB Accelerator (firmware not loaded yet)", ("18d1", "9302"): "Coral USB Accelerator"}
CORAL_PCI_ID = ("0x1ac1", "0x089a")  # Global Unichip Corp. Coral Edge TPU


@dataclass(frozen=True)
class Accelerator:
    kind: AcceleratorKind
    name: str
    node: str | None  # device node or sysfs path that proves it; None when only an id was seen
    driver: str | None  # kernel driver bound, when visible
    problem: str | None = None  # hardware seen but not usable as is (driver missing), in words

    @property
    def target(self) -> Target:
        return TARGET_OF[self.kind]

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "target": self.target.value,
            "name": self.name,
            "node": self.node,
            "driver": self.driver,
            "problem": self.problem,
        }


def _driver(fs: RootFS, sysfs_device: str) -> str | None:
    link = fs.path(f"{sysfs_device}/driver")
    return os.path.basename(os.readlink(link)) if os.path.islink(link) else None


def read_accelerators(fs: RootFS) -> tuple[Accelerator, ...]:
    found: list[Accelerator] = []
    nvidia = [p for p in fs.glob("/dev/nvidia[0-9]*")]
    for node in nvidia:
        found.append(Accelerator(AcceleratorKind.NVIDIA_GPU, _nvidia_name(fs, node), node, "nvidia"))
    jetson_nodes = fs.glob("/dev/nvhost-gpu") + fs.glob("/dev/nvhost-ctrl-gpu") + fs.glob("/dev/nvgpu/igpu0")
    if jetson_nodes:
        found.append(Accelerator(AcceleratorKind.JETSON_GPU, "NVIDIA Tegra integrated GPU", jetson_nodes[0], "nvgpu"))
    apex = fs.glob("/dev/apex_[0-9]*")
    for node in apex:
        found.append(Accelerator(AcceleratorKind.EDGETPU_PCIE, "Coral Edge TPU (PCIe)", node, "apex"))
    for dev in fs.glob("/sys/bus/pci/devices/*"):
        ids = ((fs.read_text(f"{dev}/vendor") or "").strip(), (fs.read_text(f"{dev}/device") or "").strip())
        if ids == CORAL_PCI_ID and not apex:
            found.append(
                Accelerator(
                    AcceleratorKind.EDGETPU_PCIE,
                    "Coral Edge TPU (PCIe)",
                    dev,
                    _driver(fs, dev),
                    problem="the PCIe Edge TPU is present but /dev/apex_0 is missing: the gasket/apex driver is not loaded",
                )
            )
    for dev in fs.glob("/sys/bus/usb/devices/*"):
        ids = ((fs.read_text(f"{dev}/idVendor") or "").strip(), (fs.read_text(f"{dev}/idProduct") or "").strip())
        if ids in CORAL_USB_IDS:
            found.append(Accelerator(AcceleratorKind.EDGETPU_USB, CORAL_USB_IDS[ids], dev, None))
    for node in fs.glob("/dev/hailo[0-9]*"):
        found.append(Accelerator(AcceleratorKind.HAILO, "Hailo AI accelerator", node, "hailo_pci"))
    for compat in fs.glob("/proc/device-tree/npu@*/compatible"):
        text = fs.read_text(compat) or ""
        if "rknpu" in text:
            found.append(Accelerator(AcceleratorKind.ROCKCHIP_NPU, text.split("\x00")[0], compat.rsplit("/", 1)[0], "rknpu"))
    for node in fs.glob("/dev/accel/accel[0-9]*"):
        driver = _driver(fs, f"/sys/class/accel/{os.path.basename(node)}/device")
        if driver == "intel_vpu":
            found.append(Accelerator(AcceleratorKind.INTEL_NPU, "Intel NPU", node, driver))
    if not nvidia and not jetson_nodes:  # their render nodes are the same GPU
        for node in fs.glob("/dev/dri/renderD[0-9]*"):
            driver = _driver(fs, f"/sys/class/drm/{os.path.basename(node)}/device")
            if driver in (None, "nvidia", "rknpu"):
                continue  # unknown driver or an NPU exposed through DRM: not a GPU we can name
            found.append(Accelerator(AcceleratorKind.DRM_GPU, f"GPU ({driver})", node, driver))
    return tuple(found)


def _nvidia_name(fs: RootFS, node: str) -> str:
    for info in fs.glob("/proc/driver/nvidia/gpus/*/information"):
        for line in (fs.read_text(info) or "").splitlines():
            if line.startswith("Model:"):
                return line.split(":", 1)[1].strip()
    return "NVIDIA GPU"
