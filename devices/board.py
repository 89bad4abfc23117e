"""Which board this is: device tree (ARM boards), L4T release and power mode (Jetson), DMI (x86)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from devices.rootfs import RootFS


@dataclass(frozen=True)
class JetsonInfo:
    l4t_release: str  # "36.3.0" from /etc/nv_tegra_release ("# R36 (release), REVISION: 3.0")
    power_mode: str | None  # nvpmodel mode name ("15W"), None when not readable
    power_mode_id: int | None

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Board:
    model: str  # human name: device-tree model, or DMI vendor + product, or "unknown"
    compatible: tuple[str, ...]  # device-tree compatible strings, most specific first
    vendor: str | None  # DMI sys_vendor on x86
    jetson: JetsonInfo | None

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "compatible": list(self.compatible),
            "vendor": self.vendor,
            "jetson": self.jetson.to_dict() if self.jetson else None,
        }


_L4T = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)")
_PM_NAME = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>")


def read_board(fs: RootFS) -> Board:
    model = (fs.read_text("/proc/device-tree/model") or "").strip()
    compatible = tuple(c for c in (fs.read_text("/proc/device-tree/compatible") or "").split("\x00") if c)
    vendor = (fs.read_text("/sys/class/dmi/id/sys_vendor") or "").strip() or None
    if not model:
        product = (fs.read_text("/sys/class/dmi/id/product_name") or "").strip()
        model = " ".join(p for p in (vendor, product) if p) or "unknown"
    return Board(model=model, compatible=compatible, vendor=vendor, jetson=read_jetson(fs))


def read_jetson(fs: RootFS) -> JetsonInfo | None:
    text = fs.read_text("/etc/nv_tegra_release")
    if text is None:
        return None
    match = _L4T.search(text)
    release = f"{match.group(1)}.{match.group(2)}" if match else "unknown"
    names = {int(i): n for i, n in _PM_NAME.findall(fs.read_text("/etc/nvpmodel.conf") or "")}
    mode_id = None
    status = fs.read_text("/var/lib/nvpmodel/status") or ""  # "pmode:0001 fmode:quiet"
    found = re.search(r"pmode:(\d+)", status)
    if found:  # without the status file the mode in force is unknown: the conf's DEFAULT is only the boot mode
        mode_id = int(found.group(1))
    return JetsonInfo(l4t_release=release, power_mode=names.get(mode_id) if mode_id is not None else None, power_mode_id=mode_id)
