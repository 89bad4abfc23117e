"""The machine as a whole: board, CPU, accelerators, live state and the profile that applies."""

from __future__ import annotations

import os
from dataclasses import dataclass

from devices.accelerators import Accelerator, read_accelerators
from devices.board import Board, read_board
from devices.cpu import CpuInfo, read_cpu
from devices.live import LiveState, snapshot
from devices.profiles import BoardProfile, ThreadPolicy, match_profile
from devices.rootfs import RootFS
from devices.target import Target


@dataclass(frozen=True)
class Machine:
    root: str
    board: Board
    cpu: CpuInfo
    accelerators: tuple[Accelerator, ...]
    live: LiveState
    profile: BoardProfile
    usable_cpus: int  # CPUs this process may run on (affinity on the live system, all on a tree)

    def accelerators_for(self, target: Target) -> tuple[Accelerator, ...]:
        return tuple(a for a in self.accelerators if a.target is target)

    @property
    def memory_budget_bytes(self) -> int:
        """Default planner budget: the profile's fraction of available memory (cgroup included)."""
        return int(self.live.available_bytes * self.profile.memory_budget_fraction)

    def profile_threads(self) -> int:
        """Threads the profile asks for, before load is considered."""
        policy = self.profile.threads
        count = {
            ThreadPolicy.ALL: self.cpu.logical_cpus,
            ThreadPolicy.PHYSICAL: self.cpu.physical_cores,
            ThreadPolicy.BIG: self.cpu.big_cores,
        }[policy]
        count = min(count, self.usable_cpus)
        if self.profile.max_threads is not None:
            count = min(count, self.profile.max_threads)
        return max(1, count)

    def to_dict(self) -> dict[str, object]:
        return {
            "root": self.root,
            "board": self.board.to_dict(),
            "cpu": self.cpu.to_dict(),
            "usable_cpus": self.usable_cpus,
            "accelerators": [a.to_dict() for a in self.accelerators],
            "profile": self.profile.to_dict(),
            "memory_budget_bytes": self.memory_budget_bytes,
            "live": self.live.to_dict(),
        }


def detect(root: str = "/") -> Machine:
    """Read everything under ``root``; cheap enough to call per load (file reads only)."""
    fs = RootFS.at(root)
    cpu = read_cpu(fs)
    board = read_board(fs)
    usable = len(os.sched_getaffinity(0)) if fs.is_live and hasattr(os, "sched_getaffinity") else cpu.logical_cpus
    return Machine(
        root=fs.root,
        board=board,
        cpu=cpu,
        accelerators=read_accelerators(fs),
        live=snapshot(fs.root),
        profile=match_profile(board.compatible, cpu.arch),
        usable_cpus=usable,
    )
