"""Live state of the machine: memory we may use, load, CPU temperature, throttling.

The memory planner takes its default budget from :func:`available_memory_bytes`:
``MemAvailable`` from ``/proc/meminfo``, capped by the headroom left under the
cgroup memory limit (a container or systemd slice can be far smaller than the
machine). Headroom is ``limit - working set`` at every level of the process's
cgroup path up to the hierarchy root, and the smallest wins. The working set
is usage minus inactive file cache (``memory.stat``), as ``docker stats`` and
the kubelet count it: the kernel drops that cache before it OOM-kills us.

Everything reads through :class:`devices.rootfs.RootFS`, so tests feed captured
board trees. The one thing that is not a file, ``vcgencmd get_throttled`` on a
Raspberry Pi, is run only on the live system; the Pi firmware driver exposes the
same bits as ``get_throttled`` in sysfs, which is read first (and is what the
fixtures capture).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass

from devices.rootfs import RootFS
from runtime.errors import BadInput

log = logging.getLogger(__name__)

# cgroup v1 reports "no limit" as a page-rounded LONG_MAX (9223372036854771712);
# anything this large is not a real limit on any machine we run on.
UNLIMITED_THRESHOLD_BYTES = 1 << 60

# Where the Raspberry Pi firmware driver puts get_throttled (hex, no 0x prefix).
# The platform node name differs between Pi 4 (soc) and Pi 5 (soc@107c000000).
_PI_THROTTLED_GLOBS = (
    "/sys/devices/platform/soc/soc:firmware/get_throttled",
    "/sys/devices/platform/*/*firmware/get_throttled",
)

# thermal zone types that mean "the CPU", in order of preference.
_CPU_ZONE_TYPES = ("cpu-thermal", "cpu_thermal", "x86_pkg_temp", "cpu-therm", "soc_thermal", "soc-thermal", "cpu")


class ThrottleFlag(enum.IntFlag):
    """Bits of the Raspberry Pi firmware's get_throttled word (documented in the Pi OS manual)."""

    UNDER_VOLTAGE = 1 << 0
    FREQ_CAPPED = 1 << 1
    THROTTLED = 1 << 2
    SOFT_TEMP_LIMIT = 1 << 3
    UNDER_VOLTAGE_OCCURRED = 1 << 16
    FREQ_CAPPED_OCCURRED = 1 << 17
    THROTTLED_OCCURRED = 1 << 18
    SOFT_TEMP_LIMIT_OCCURRED = 1 << 19


_NOW_MASK = 0xF
_SINCE_BOOT_MASK = 0xF0000


@dataclass(frozen=True)
class Throttling:
    raw: int
    source: str  # "sysfs:<path>" or "vcgencmd"

    @property
    def now(self) -> tuple[str, ...]:
        """Conditions active right now, by flag name (lower case)."""
        return _flag_names(self.raw & _NOW_MASK)

    @property
    def since_boot(self) -> tuple[str, ...]:
        return _flag_names(self.raw & _SINCE_BOOT_MASK)

    @property
    def is_throttled_now(self) -> bool:
        return bool(self.raw & _NOW_MASK)

    def to_dict(self) -> dict[str, object]:
        return {"raw": f"0x{self.raw:x}", "source": self.source, "now": list(self.now), "since_boot": list(self.since_boot)}


def _flag_names(bits: int) -> tuple[str, ...]:
    return tuple(flag.name.lower() for flag in ThrottleFlag if flag.name and bits & flag)


def parse_throttled(text: str) -> int:
    """The throttle word from ``vcgencmd get_throttled`` (``throttled=0x50000``) or sysfs (``50000``)."""
    value = text.strip()
    if value.startswith("throttled="):
        value = value[len("throttled=") :]
    try:
        raw = int(value, 16)
    except ValueError:
        raise BadInput(f"cannot parse throttle state {text!r}; expected 'throttled=0x<hex>' or '<hex>'") from None
    if raw < 0 or raw > 0xFFFFFFFF:
        raise BadInput(f"throttle state {text!r} is outside 32 bits")
    return raw


@dataclass(frozen=True)
class CgroupMemory:
    """The tightest cgroup memory limit over this process's cgroup path."""

    version: int  # 1 or 2
    path: str  # system path of the cgroup directory whose headroom is smallest
    limit_bytes: int
    usage_bytes: int  # working set: usage minus inactive file cache

    @property
    def headroom_bytes(self) -> int:
        return max(0, self.limit_bytes - self.usage_bytes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self) | {"headroom_bytes": self.headroom_bytes}


@dataclass(frozen=True)
class ThermalZone:
    name: str  # thermal_zoneN
    type: str  # what the kernel calls it: cpu-thermal, x86_pkg_temp, gpu-thermal...
    temp_c: float


@dataclass(frozen=True)
class LiveState:
    mem_total_bytes: int
    mem_available_bytes: int  # MemAvailable, machine-wide
    cgroup: CgroupMemory | None  # None: no cgroup memory limit applies
    available_bytes: int  # what the planner may use: MemAvailable capped by cgroup headroom
    load_avg: tuple[float, float, float]  # 1, 5, 15 minutes (runnable + uninterruptible tasks)
    cpu_temp_c: float | None  # None: no thermal zone readable
    thermal_zones: tuple[ThermalZone, ...]
    throttling: Throttling | None  # None: not a Raspberry Pi, or firmware state not readable

    @property
    def cgroup_limit_bytes(self) -> int | None:
        return self.cgroup.limit_bytes if self.cgroup else None

    def to_dict(self) -> dict[str, object]:
        return {
            "mem_total_bytes": self.mem_total_bytes,
            "mem_available_bytes": self.mem_available_bytes,
            "cgroup_limit_bytes": self.cgroup_limit_bytes,
            "cgroup": self.cgroup.to_dict() if self.cgroup else None,
            "available_bytes": self.available_bytes,
            "load_avg": list(self.load_avg),
            "cpu_temp_c": self.cpu_temp_c,
            "thermal_zones": [dataclasses.asdict(z) for z in self.thermal_zones],
            "throttling": self.throttling.to_dict() if self.throttling else None,
        }


# --- readers -----------------------------------------------------------------


def read_meminfo(fs: RootFS) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per key. Raises BadInput when the file is missing."""
    text = fs.read_text("/proc/meminfo")
    if text is None:
        raise BadInput(f"no /proc/meminfo under root {fs.root!r}; is this a Linux root tree?")
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not fields:
            continue
        try:
            value = int(fields[0])
        except ValueError:
            continue
        out[key.strip()] = value * 1024 if len(fields) > 1 and fields[1] == "kB" else value
    return out


def _mem_available(info: dict[str, int]) -> int:
    if "MemAvailable" in info:
        return info["MemAvailable"]
    # Kernels before 3.14 lack MemAvailable; this is the estimate free(1) used then.
    return info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)


def _own_cgroup_paths(fs: RootFS) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory path) of this process from /proc/self/cgroup."""
    v2 = v1 = None
    for line in (fs.read_text("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(mount: str, path: str | None) -> list[str]:
    """``mount/a/b``, ``mount/a``, ``mount``: the process's cgroup and every parent."""
    out = []
    parts = [p for p in (path or "/").split("/") if p]
    for depth in range(len(parts), -1, -1):
        out.append("/".join([mount, *parts[:depth]]))
    return out


def _inactive_file(fs: RootFS, directory: str, keys: tuple[str, ...]) -> int:
    stats = {}
    for line in (fs.read_text(f"{directory}/memory.stat") or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isascii() and value.strip().isdigit():
            stats[key] = int(value)
    for key in keys:
        if key in stats:
            return stats[key]
    return 0


def _limit_value(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if text == "max" or not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return None if value >= UNLIMITED_THRESHOLD_BYTES else value


def cgroup_memory(fs: RootFS) -> CgroupMemory | None:
    """The cgroup level with the least headroom, or None when no level sets a limit."""
    v2_path, v1_path = _own_cgroup_paths(fs)
    candidates: list[tuple[int, str, str, str, tuple[str, ...]]] = []
    if fs.exists("/sys/fs/cgroup/cgroup.controllers") or fs.exists("/sys/fs/cgroup/memory.max"):
        for d in _ancestors("/sys/fs/cgroup", v2_path):
            candidates.append((2, d, "memory.max", "memory.current", ("inactive_file",)))
    if fs.exists("/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        for d in _ancestors("/sys/fs/cgroup/memory", v1_path):
            candidates.append(
                (1, d, "memory.limit_in_bytes", "memory.usage_in_bytes", ("total_inactive_file", "inactive_file"))
            )
    best: CgroupMemory | None = None
    for version, directory, limit_file, usage_file, inactive_keys in candidates:
        limit = _limit_value(fs.read_text(f"{directory}/{limit_file}"))
        if limit is None:
            continue
        usage = fs.read_int(f"{directory}/{usage_file}") or 0
        working_set = max(0, usage - _inactive_file(fs, directory, inactive_keys))
        level = CgroupMemory(version=version, path=directory, limit_bytes=limit, usage_bytes=working_set)
        if best is None or level.headroom_bytes < best.headroom_bytes:
            best = level
    return best


def available_memory_bytes(root: str = "/") -> int:
    """Bytes the runtime may allocate now: MemAvailable capped by cgroup headroom."""
    fs = RootFS.at(root)
    available = _mem_available(read_meminfo(fs))
    limit = cgroup_memory(fs)
    return min(available, limit.headroom_bytes) if limit else available


def read_loadavg(fs: RootFS) -> tuple[float, float, float]:
    text = fs.read_text("/proc/loadavg")
    fields = (text or "").split()
    try:
        return (float(fields[0]), float(fields[1]), float(fields[2]))
    except (IndexError, ValueError):
        if fs.is_live:
            return os.getloadavg()
        return (0.0, 0.0, 0.0)


def read_thermal_zones(fs: RootFS) -> tuple[ThermalZone, ...]:
    zones = []
    for zone in fs.glob("/sys/class/thermal/thermal_zone*"):
        millideg = fs.read_int(f"{zone}/temp")  # millidegrees Celsius
        if millideg is None:
            continue  # disabled zones return EINVAL or ENODATA
        zone_type = (fs.read_text(f"{zone}/type") or "").strip()
        zones.append(ThermalZone(name=os.path.basename(zone), type=zone_type, temp_c=millideg / 1000.0))
    zones.sort(key=_zone_index)  # thermal_zone10 after thermal_zone9
    return tuple(zones)


def _zone_index(zone: ThermalZone) -> int:
    suffix = zone.name.removeprefix("thermal_zone")
    return int(suffix) if suffix.isascii() and suffix.isdigit() else -1


def cpu_temperature_c(zones: tuple[ThermalZone, ...]) -> float | None:
    """The CPU zone's temperature; with no zone named for the CPU, the hottest zone (the one that throttles)."""
    for wanted in _CPU_ZONE_TYPES:
        for zone in zones:
            if zone.type.lower() == wanted:
                return zone.temp_c
    return max((z.temp_c for z in zones), default=None)


def read_throttling(fs: RootFS) -> Throttling | None:
    for pattern in _PI_THROTTLED_GLOBS:
        for path in fs.glob(pattern):
            text = fs.read_text(path)
            if text is None:
                continue
            try:
                return Throttling(raw=parse_throttled(text), source=f"sysfs:{path}")
            except BadInput as exc:
                log.warning("ignoring %s: %s", path, exc)
    if fs.is_live and shutil.which("vcgencmd"):
        try:
            done = subprocess.run(["vcgencmd", "get_throttled"], capture_output=True, text=True, timeout=2.0)
            if done.returncode == 0:
                return Throttling(raw=parse_throttled(done.stdout), source="vcgencmd")
            log.warning("vcgencmd get_throttled exited %d: %s", done.returncode, done.stderr.strip())
        except (OSError, subprocess.TimeoutExpired, BadInput) as exc:
            log.warning("vcgencmd get_throttled failed: %s", exc)
    return None


def snapshot(root: str = "/") -> LiveState:
    """Read the live state under ``root`` once. Cheap (a few small file reads)."""
    fs = RootFS.at(root)
    info = read_meminfo(fs)
    available = _mem_available(info)
    limit = cgroup_memory(fs)
    zones = read_thermal_zones(fs)
    return LiveState(
        mem_total_bytes=info.get("MemTotal", 0),
        mem_available_bytes=available,
        cgroup=limit,
        available_bytes=min(available, limit.headroom_bytes) if limit else available,
        load_avg=read_loadavg(fs),
        cpu_temp_c=cpu_temperature_c(zones),
        thermal_zones=zones,
        throttling=read_throttling(fs),
    )
