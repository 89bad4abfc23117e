"""The GPU check's summary: one Markdown page from what scripts/gpu-check.sh left in its results folder.

    python scripts/gpu_report.py RESULTS > summary.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _read(path: Path, limit: int = 60) -> str:
    if not path.exists():
        return f"({path.name}: not produced)"
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[:limit] + ([f"... ({len(lines) - limit} more lines in results.tar.gz)"] if len(lines) > limit else []))


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def speed_table(speed: dict) -> list[str]:
    raw = speed.get("issue_raw", {})
    rows = ["| run | result | offload | prefill tok/s | decode tok/s | vs issue's raw prefill / decode | GPU memory used |",
            "|---|---|---|---|---|---|---|"]
    for name, r in speed.get("runs", {}).items():
        side = "gpu" if name.endswith("gpu") else "cpu"
        ref = raw.get(side, {})
        pre, dec = r.get("prefill_tps"), r.get("decode_tps")
        vs = (f"{pre / ref['prefill_tps']:.2f}x / {dec / ref['decode_tps']:.2f}x" if pre and dec and ref else "-")
        placement = r.get("placement") or {}
        off = placement.get("offload") if isinstance(placement, dict) else None
        offload = (f"{off['on_accelerator']}/{off['total']} {off['unit']} {off['by_device']}" if isinstance(off, dict)
                   else r.get("llama_log") or "-")
        result = r.get("result", "?")
        if "workaround" in r:
            result += f" (then {r['workaround']['result']} with llama_cpp imported first: a workaround, not a fix)"
        rows.append(f"| {name} | {result} | {offload} | {pre if pre is None else round(pre, 1)} |"
                    f" {dec if dec is None else round(dec, 1)} | {vs} | {_mib(r.get('gpu_mem_delta_bytes'))} |")
    runs = speed.get("runs", {})
    for side in ("gpu", "cpu"):
        theirs = runs.get(f"raw-{side}", {})
        for variant in ("-plain", ""):
            ours = runs.get(f"edgerun-{side}{variant}", {})
            if ours.get("decode_tps") and theirs.get("decode_tps"):
                spec = ours.get("speculation") or {}
                rows.append(f"\nedgerun{variant or ' (as shipped)'} / raw library on this machine, {side}: prefill"
                            f" {ours['prefill_tps'] / theirs['prefill_tps']:.2f}x, decode"
                            f" {ours['decode_tps'] / theirs['decode_tps']:.2f}x (speculation on: {spec.get('on')},"
                            f" acceptance {spec.get('acceptance')})")
    return rows


def main(argv: list[str]) -> int:
    res = Path(argv[0])
    dry = (res / "facts.txt").exists() and (res / "facts.txt").read_text().startswith("DRY RUN")
    out = ["# edgerun GPU check (scripts/gpu-check.sh)", ""]
    if dry:
        out += ["**DRY RUN (GPU_CHECK_DRY=1): CPU only, a tiny model; no number here is a GPU result, and the ratios"
                " to issue 20's raw figures are meaningless.**", ""]
    out += ["## Machine", "", "```", _read(res / "facts.txt", 40), "```", ""]
    out += ["## Crash bisection", "", _read(res / "matrix" / "matrix.md", 80), ""]
    for name in ("loadorder.txt", "bindings.txt", "inits.txt", "unique.txt", "backtrace.txt"):
        if (res / "matrix" / name).exists():
            out += [f"### {name}", "", "```", _read(res / "matrix" / name, 50), "```", ""]
    speed_file = res / "speed" / "speed.json"
    if speed_file.exists():
        speed = json.loads(speed_file.read_text())
        out += ["## Speed and placement (500-token prompt, 128 greedy tokens)", "", *speed_table(speed), ""]
        for name, r in speed.get("runs", {}).items():
            device = (r.get("plan") or {}).get("device") if isinstance(r.get("plan"), dict) else None
            if device:
                out.append(f"- {name}: the planner's device total {_mib(device['device_bytes'])} (of which"
                           f" {_mib(device['device'].get('runtime (CUDA context, estimate)'))} estimated CUDA context),"
                           f" host total {_mib(device['host_bytes'])}; the GPU's memory in use rose by"
                           f" {_mib(r.get('gpu_mem_delta_bytes'))} during the run (nvidia-smi)")
        out.append("")
        plan = speed.get("plan") or {}
        if plan:
            keep = {k: plan[k] for k in plan if k.endswith("_bytes") or k in ("n_ctx", "kv_type", "fits", "device")}
            out += ["### edgerun plan (--memory 32G --ctx 2048)", "", "```", json.dumps(keep, indent=1), "```", ""]
    else:
        out += ["## Speed and placement", "", "(not produced: see speed.log in results.tar.gz)", ""]
    prov = res / "providers.json"
    out += ["## ONNX Runtime and LiteRT", "", "```", _read(prov, 40), "```", ""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
