"""The CPU as ``/proc/cpuinfo`` and sysfs describe it: architecture, cores, and the SIMD features llama.cpp and XNNPACK use."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from devices.rootfs import RootFS

GGML_MAX_N_THREADS = 512  # ggml.h: the most threads ggml's CPU masks and thread pools are built for


def max_threads(logical_cpus: int | None = None) -> int:
    """The most CPU threads a caller may ask for: 4 x the logical CPUs (this machine's by default), at most ggml's 512.

    More threads than cores only oversubscribes them (a few times over is still a
    measurement someone may want); thousands make libgomp fail inside llama.cpp and
    make ONNX Runtime's thread pool hang at start.
    """
    return min(4 * (logical_cpus or os.cpu_count() or 1), GGML_MAX_N_THREADS)


# ARM "CPU part" ids (MIDR) of the cores on boards we support, from ARM's TRMs.
ARM_PARTS = {
    0xD03: "Cortex-A53",
    0xD04: "Cortex-A35",
    0xD05: "Cortex-A55",
    0xD07: "Cortex-A57",
    0xD08: "Cortex-A72",
    0xD09: "Cortex-A73",
    0xD0A: "Cortex-A75",
    0xD0B: "Cortex-A76",
    0xD0C: "Neoverse-N1",
    0xD0D: "Cortex-A77",
    0xD41: "Cortex-A78",
    0xD42: "Cortex-A78AE",
    0xD46: "Cortex-A510",
    0xD47: "Cortex-A710",
    0xD4B: "Cortex-A78C",
}
# Little (efficiency) cores: on big.LITTLE chips llama.cpp runs at the pace of the slowest thread.
LITTLE_PARTS = frozenset({0xD03, 0xD04, 0xD05, 0xD46})

# cpuinfo flag -> the name we report. x86 "flags" and arm64 "Features" use different words.
FEATURES = {
    "asimd": "neon",
    "neon": "neon",  # 32-bit ARM kernels
    "asimddp": "dotprod",
    "i8mm": "i8mm",
    "sve": "sve",
    "asimdhp": "fp16",
    "bf16": "bf16",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512",
    "avx512_vnni": "avx512_vnni",
    "avx_vnni": "avx_vnni",
    "avx512_bf16": "avx512_bf16",
    "amx_tile": "amx",
}

# Instructions that multiply-accumulate four 8-bit pairs into 32 bits. Without them XNNPACK's and ONNX
# Runtime's INT8 kernels widen to 16 bits first and run about as fast as float (measured on an AVX2 EPYC:
# MobileNetV2 INT8 1.04x float on LiteRT), and ORT's fast uint8 x int8 path saturates.
INT8_DOT = frozenset({"dotprod", "i8mm", "avx512_vnni", "avx_vnni", "amx"})


@dataclass(frozen=True)
class CpuInfo:
    arch: str  # "aarch64", "x86_64", "armv7l"
    model: str  # "Cortex-A76", "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
    logical_cpus: int  # processors the kernel lists
    physical_cores: int  # logical CPUs less SMT siblings
    big_cores: int  # physical cores that are not efficiency cores (all of them on a homogeneous chip)
    features: tuple[str, ...]  # sorted names from FEATURES

    @property
    def int8_dot(self) -> bool:
        """Whether INT8 models can run faster than float here (see INT8_DOT)."""
        return not INT8_DOT.isdisjoint(self.features)

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "features": list(self.features)}


def _blocks(text: str) -> list[dict[str, str]]:
    blocks, current = [], {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
            current = {}
            continue
        key, _, value = line.partition(":")
        current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    return blocks


def read_cpu(fs: RootFS) -> CpuInfo:
    blocks = _blocks(fs.read_text("/proc/cpuinfo") or "")
    procs = [b for b in blocks if "processor" in b]
    flags: set[str] = set()
    for b in procs:
        flags.update((b.get("flags") or b.get("Features") or "").split())
    features = tuple(sorted({FEATURES[f] for f in flags if f in FEATURES}))
    if "flags" in (procs[0] if procs else {}) or any("vendor_id" in b for b in procs):
        arch = "x86_64" if "lm" in flags else "i686"
    elif procs and "CPU architecture" in procs[0]:
        arch = "aarch64" if procs[0]["CPU architecture"] == "8" and "asimd" in flags else "armv7l"
    else:
        arch = platform.machine() if fs.is_live else "unknown"
    parts = [int(b["CPU part"], 16) for b in procs if b.get("CPU part", "").startswith("0x")]
    if procs and "model name" in procs[0]:
        model = procs[0]["model name"]
    elif parts:
        names = sorted({ARM_PARTS.get(p, f"ARM part 0x{p:03x}") for p in parts})
        model = " + ".join(names)
    else:
        model = "unknown"
    logical = len(procs) or ((os.cpu_count() or 1) if fs.is_live else 1)
    physical = _physical_cores(fs, procs) or logical
    big = sum(1 for p in parts if p not in LITTLE_PARTS) if parts and len(parts) == logical else physical
    return CpuInfo(arch=arch, model=model, logical_cpus=logical, physical_cores=physical, big_cores=big or physical, features=features)


def _physical_cores(fs: RootFS, procs: list[dict[str, str]]) -> int:
    # x86 cpuinfo: distinct (physical id, core id) pairs; SMT siblings share one.
    pairs = {(b.get("physical id"), b.get("core id")) for b in procs if "core id" in b}
    if pairs:
        return len(pairs)
    siblings = set()
    for path in fs.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list"):
        siblings.add((fs.read_text(path) or "").strip())
    return len(siblings)
