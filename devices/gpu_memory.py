"""Whether a machine's GPU has memory of its own or allocates from the host's RAM (the planner's device split).

A Jetson's integrated GPU (Tegra: /etc/nv_tegra_release, /dev/nvhost-gpu, /dev/nvgpu) allocates from the same RAM
as the CPU: weights llama.cpp offloads there leave the file mapping (reclaimable cache) for a CUDA allocation in that
RAM, so runtime.llm.plan_device.split_by_device counts them once, in one pool. A discrete NVIDIA GPU (/dev/nvidiaN) has memory
of its own, counted apart from RAM. Other integrated GPUs (a Pi's v3d, Mali) share RAM too, but no edgerun backend
offloads an LLM to them.
"""

from __future__ import annotations

from devices.accelerators import AcceleratorKind
from devices.machine import Machine, detect


def unified_memory(machine: Machine | None = None) -> bool:
    """True when the GPU llama.cpp would use shares the host's RAM (a Jetson)."""
    machine = machine or detect("/")
    if any(a.kind is AcceleratorKind.NVIDIA_GPU for a in machine.accelerators):
        return False  # a discrete card has memory of its own
    return machine.board.jetson is not None or any(a.kind is AcceleratorKind.JETSON_GPU for a in machine.accelerators)
