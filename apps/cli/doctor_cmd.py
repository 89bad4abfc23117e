"""``edgerun doctor``: what this machine is, what each backend can use, and how to fix what is missing."""

from __future__ import annotations

import argparse
import json

from devices.doctor import DoctorReport, diagnose

HELP = "describe this machine, what each backend can use here, and the fix for anything missing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--root", default="/", help="read the machine from this file tree (a captured board) instead of /")


def main(args: argparse.Namespace) -> int:
    report = diagnose(args.root)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        print(render(report))
    return 0


def _gib(n: int | None) -> str:
    return "none" if n is None else f"{n / 2**30:.2f} GiB"


def render(report: DoctorReport) -> str:
    m, live = report.machine, report.machine.live
    lines = [
        f"machine:   {m.board.model}" + (f" (root {m.root})" if m.root != "/" else ""),
        f"profile:   {m.profile.name} ({m.profile.description})",
        f"cpu:       {m.cpu.model}, {m.cpu.arch}, {m.cpu.logical_cpus} CPUs ({m.cpu.physical_cores} physical, {m.usable_cpus} usable); "
        f"features: {', '.join(m.cpu.features) or 'none listed'}",
        f"memory:    {_gib(live.mem_available_bytes)} available of {_gib(live.mem_total_bytes)}; "
        f"cgroup limit {_gib(live.cgroup_limit_bytes)}; "
        f"budget {_gib(m.memory_budget_bytes)} ({m.profile.memory_budget_fraction:.0%} of {_gib(live.available_bytes)})",
        f"load:      {' '.join(f'{x:.2f}' for x in live.load_avg)}; cpu temperature "
        + (f"{live.cpu_temp_c:.1f} °C" if live.cpu_temp_c is not None else "not readable")
        + (
            f"; throttling {live.throttling.raw:#x} ({', '.join(live.throttling.now + live.throttling.since_boot) or 'none'})"
            if live.throttling
            else ""
        ),
    ]
    if m.board.jetson:
        j = m.board.jetson
        lines.append(
            f"jetson:    L4T {j.l4t_release}, power mode {j.power_mode or 'unknown'}"
            + (f" (id {j.power_mode_id})" if j.power_mode_id is not None else "")
        )
    lines.append("accelerators:" + ("" if m.accelerators else " none"))
    for a in m.accelerators:
        lines.append(f"  {a.target.value:<4} {a.name} [{a.kind.value}] at {a.node}" + (f" -- {a.problem}" if a.problem else ""))
    lines.append(f"backends (probed in this Python {report.python}):")
    for backend, caps in report.backends.items():
        if caps.installed:
            targets = ", ".join(t.value for t in report.usable_targets(backend))
            extra = f"; providers {', '.join(caps.providers)}" if caps.providers else ""
            extra += f"; delegates {', '.join(caps.delegates)}" if caps.delegates else ""
            lines.append(f"  {backend.value:<9} {caps.module} {caps.version or ''}: can use {targets}{extra}")
        else:
            lines.append(f"  {backend.value:<9} not installed" + (f" ({caps.error})" if caps.error else "") + f": {caps.install}")
    lines.append("findings:" + ("" if report.findings else " nothing missing"))
    for f in report.findings:
        lines.append(f"  [{f.severity}] {f.what}\n      fix: {f.fix}")
    return "\n".join(lines)
