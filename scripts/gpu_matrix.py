"""The GPU check's crash bisection: each import order x environment knob in a fresh process, then diagnostics.

    python scripts/gpu_matrix.py --gpu|--dry --model M --out DIR [--jobs 4] [--budget SECONDS]

Issue 20: on a CUDA build of llama-cpp-python 0.3.36 (H200, CUDA 13, driver 580, numpy 2.5.2 of the image's torch
environment) ``import numpy`` before ``from llama_cpp import Llama`` ends in SIGSEGV inside
llama_model_load_from_file, also with n_gpu_layers=0; llama_cpp first is fine. Each cell (scripts/gpu_cell.py) is
one hypothesis's prediction (docs/gpu.md): the knobs that turn a crash into a load say which library's order matters.

For the first crashing cell and a working twin (same knobs, llama_cpp first) it then records, in DIR:
``loadorder.txt``  the link maps of both (library load order) and what differs;
``bindings.txt``   every symbol llama.cpp's and CUDA's libraries bind, per defining library, both orders (LD_DEBUG),
                   with the symbols bound to a different library in the crash (interposition);
``inits.txt``      the order library constructors ran (LD_DEBUG=libs "calling init"), both orders;
``unique.txt``     STB_GNU_UNIQUE symbols defined by more than one loaded library (bound process-wide, RTLD_LOCAL
                   or not: the first loaded wins);
``backtrace.txt``  gdb or cuda-gdb's backtrace if either is installed, else scripts/gpu_segv.c's (LD_PRELOAD), and
                   Python's faulthandler traceback.
``matrix.md`` is the table; ``matrix.json`` the same as data. The last line printed is a one-line verdict.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
CELL = HERE / "gpu_cell.py"
ALL = 999


@dataclass
class Cell:
    name: str
    order: str
    env: dict[str, str] = field(default_factory=dict)
    gpu_layers: int = ALL
    flags: tuple[str, ...] = ()
    why: str = ""
    # filled in by run()
    rc: int | None = None
    result: str = ""
    seconds: float = 0.0
    data: dict = field(default_factory=dict)
    last_log: str = ""


def cells(dry: bool) -> list[Cell]:
    gl = 0 if dry else ALL  # the dry run has no GPU: every cell loads on the CPU
    rows = [
        Cell("numpy-first", "numpy", gpu_layers=gl, why="the issue's crash"),
        Cell("llama-first", "llama", gpu_layers=gl, why="the issue's working order"),
        Cell("errors-first", "errors", gpu_layers=gl, why="issue: runtime.errors first is fine"),
        Cell("edgerun", "edgerun", gpu_layers=gl, why="edgerun's own load path (runtime.llm.model.LLM.load)"),
        Cell("edgerun, llama.cpp libs first", "edgerun-llama", gpu_layers=gl,
             why="the candidate fix: edgerun loads llama.cpp's libraries before numpy's"),
        Cell("openblas-first", "openblas", gpu_layers=gl, why="H1: numpy's OpenBLAS (threads, TLS, memory) alone"),
        Cell("gomp+numpy", "gomp", gpu_layers=gl, why="H2: OpenMP runtime loaded first, globally"),
        Cell("ggml+numpy", "ggml", gpu_layers=gl, why="H2/H4: ggml's CPU libraries (and their libgomp) first"),
        Cell("cuda+numpy", "cuda", gpu_layers=gl, why="H3: the CUDA runtime/cuBLAS first"),
        Cell("numpy-first ngl=0", "numpy", gpu_layers=0, why="issue: --target cpu crashes too"),
        Cell("llama-first ngl=0", "llama", gpu_layers=0, why="control"),
        Cell("edgerun cpu", "edgerun", gpu_layers=0, why="edgerun --target cpu"),
        Cell("numpy-first OMP=1", "numpy", {"OMP_NUM_THREADS": "1"}, gl, why="H2: ggml's OpenMP pool of one"),
        Cell("numpy-first OPENBLAS=1", "numpy", {"OPENBLAS_NUM_THREADS": "1"}, gl, why="H1: no OpenBLAS threads"),
        Cell("numpy-first no GPU visible", "numpy", {"CUDA_VISIBLE_DEVICES": ""}, gl,
             why="H3: does the crash need a CUDA device at all"),
        Cell("numpy-first no pinned", "numpy", {"GGML_CUDA_NO_PINNED": "1"}, gl,
             why="H3: host buffers as plain memory, not cudaMallocHost"),
        Cell("numpy-first no mmap", "numpy", gpu_layers=gl, flags=("--no-mmap",), why="H5: the model's mmap"),
        Cell("numpy-first no extra bufts", "numpy", gpu_layers=gl, flags=("--no-extra-bufts",),
             why="H6: CPU weight repacking (AMX/AVX-512 buffer types)"),
        Cell("numpy-first static TLS", "numpy", {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=1048576"}, gl,
             why="H4: static TLS surplus for libraries loaded late"),
        Cell("llama-first no GPU visible", "llama", {"CUDA_VISIBLE_DEVICES": ""}, gl, why="control"),
    ]
    return rows


def run_cell(py: str, model: str, cell: Cell, out: Path, timeout: float, extra_env: dict[str, str] | None = None,
             prefix: list[str] | None = None, tag: str = "") -> Cell:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", cell.name).strip("-") + (f".{tag}" if tag else "")
    cmd = [*(prefix or []), py, str(CELL), cell.order, model, "--gpu-layers", str(cell.gpu_layers),
           "--record", str(out / f"{slug}.libs.json"), *cell.flags]
    env = {**os.environ, **cell.env, **(extra_env or {})}
    t0 = time.monotonic()
    log = out / f"{slug}.log"
    with log.open("w") as f:
        try:
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=env, timeout=timeout)
            rc, stdout = done.returncode, done.stdout
        except subprocess.TimeoutExpired as e:
            rc, stdout = None, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    cell.seconds = round(time.monotonic() - t0, 1)
    cell.rc = rc
    if prefix:  # a debugger prints its backtrace to stdout, and exits 0 after the program's crash
        with log.open("a") as f:
            f.write(stdout or "")
    lines = [ln for ln in (stdout or "").splitlines() if ln.startswith("{")]
    cell.data = json.loads(lines[-1]) if lines else {}
    if prefix and rc is not None:
        cell.result = f"ran under {os.path.basename(prefix[0])} (exit {rc})"
    elif rc is None:
        cell.result = f"timeout {timeout:.0f} s"
    elif rc < 0:
        cell.result = signal.Signals(-rc).name
    elif rc == 0 and cell.data.get("skipped"):
        cell.result = "n/a: " + cell.data["skipped"]
    elif rc == 0:
        cell.result = "ok"
    else:
        cell.result = f"exit {rc}"
    tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    cell.last_log = tail[-1][:160] if tail else ""
    return cell


def crashed(cell: Cell) -> bool:
    return cell.rc is not None and cell.rc < 0


def diagnose(py: str, model: str, crash: Cell, twin: Cell, out: Path, timeout: float) -> list[str]:
    """Rerun the crash and its working twin under the dynamic linker's debug output and a native backtrace."""
    notes: list[str] = []
    jobs: list[tuple[str, Cell, dict[str, str], list[str]]] = []
    for tag, cell in (("crash", crash), ("twin", twin)):
        jobs.append((f"{tag}-bindings", cell, {"LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(out / f"ld-{tag}-bindings")}, []))
        jobs.append((f"{tag}-libs", cell, {"LD_DEBUG": "libs", "LD_DEBUG_OUTPUT": str(out / f"ld-{tag}-libs")}, []))
    jobs.append(("crash-faulthandler", crash, {"PYTHONFAULTHANDLER": "1"}, []))
    debugger = shutil.which("gdb") or shutil.which("cuda-gdb")
    if debugger:
        jobs.append(("crash-gdb", crash, {}, [debugger, "-batch", "-nx", "-ex", "set pagination off",
                                              "-ex", "set confirm off", "-ex", "run", "-ex", "bt 40",
                                              "-ex", "info registers rip", "-ex", "x/6i $pc",
                                              "-ex", "thread apply all bt 8", "-ex", "info sharedlibrary", "--args"]))
    segv = _segv_library(out)
    if segv:
        jobs.append(("crash-segv", crash, {"LD_PRELOAD": segv}, []))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = {pool.submit(run_cell, py, model, Cell(**{**asdict(c), "rc": None}), out,
                               min(90.0, timeout * 2) if prefix else timeout, env, prefix, tag): tag
                   for tag, c, env, prefix in jobs}
        reruns = {futures[f]: f.result() for f in concurrent.futures.as_completed(futures)}
    notes.append("reruns: " + ", ".join(f"{k} {v.result}" for k, v in sorted(reruns.items())))
    _load_order(out, crash, twin)
    notes += _bindings(out)
    _inits(out)
    notes += _unique(out, crash)
    _backtrace(out, crash, reruns)
    return notes


def _slug(cell: Cell, tag: str = "") -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", cell.name).strip("-") + (f".{tag}" if tag else "")


def _segv_library(out: Path) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return ""
    lib = out / "libgpu_segv.so"
    done = subprocess.run([cc, "-shared", "-fPIC", "-O1", str(HERE / "gpu_segv.c"), "-o", str(lib), "-ldl"],
                          capture_output=True, text=True)
    return str(lib) if done.returncode == 0 else ""


def _libs(path: Path) -> list[str]:
    try:
        return json.loads(path.read_text())["libraries"]
    except (OSError, ValueError, KeyError):
        return []


KEY_LIBS = re.compile(r"(gomp|iomp|libomp|openblas|gfortran|stdc\+\+|gcc_s|ggml|llama|cudart|cublas|libcuda|nvrtc)")


def _load_order(out: Path, crash: Cell, twin: Cell) -> None:
    a, b = _libs(out / f"{_slug(crash)}.libs.json"), _libs(out / f"{_slug(twin)}.libs.json")
    lines = [f"# library load order (link map) before the model load: {crash.name} ({crash.result}) vs {twin.name} ({twin.result})", ""]
    for title, libs in ((crash.name, a), (twin.name, b)):
        lines.append(f"## {title}: key libraries in load order")
        lines += [f"  {i:3d} {lib}" for i, lib in enumerate(libs) if KEY_LIBS.search(os.path.basename(lib))]
    base = {os.path.basename(x): x for x in b}
    lines.append("## only in the crash / other path")
    for lib in a:
        name = os.path.basename(lib)
        if name not in base:
            lines.append(f"  + {lib}")
        elif base[name] != lib:
            lines.append(f"  ~ {lib} (twin: {base[name]})")
    dup: dict[str, list[str]] = {}
    for lib in a:
        stem = re.sub(r"(-[0-9a-f]{8})?\.so.*$", "", os.path.basename(lib))
        dup.setdefault(stem, []).append(lib)
    lines.append("## libraries loaded twice (two copies of one runtime)")
    lines += [f"  {stem}: {paths}" for stem, paths in dup.items() if len(paths) > 1] or ["  none"]
    (out / "loadorder.txt").write_text("\n".join(lines) + "\n")


BINDING = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: (?:normal|protected|unique)? ?symbol `([^']+)'")
WATCHED = re.compile(r"(ggml|llama|cudart|cublas|libcuda)")


def _binding_map(prefix: Path) -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for path in sorted(prefix.parent.glob(prefix.name + ".*")):
        with path.open(errors="replace") as f:
            for line in f:
                m = BINDING.search(line)
                if m and WATCHED.search(os.path.basename(m[1])):
                    found[(os.path.basename(m[1]), m[3])] = m[2]
    return found


def _bindings(out: Path) -> list[str]:
    crash, twin = _binding_map(out / "ld-crash-bindings"), _binding_map(out / "ld-twin-bindings")
    differ = sorted(k for k in crash.keys() & twin.keys() if crash[k] != twin[k])
    lines = [f"# symbols llama.cpp's and CUDA's libraries bound: {len(crash)} in the crash, {len(twin)} in the twin", "",
             f"## bound to a different library in the crash ({len(differ)})"]
    lines += [f"  {f} {sym}: crash -> {crash[(f, sym)]}, twin -> {twin[(f, sym)]}" for f, sym in differ] or ["  none"]
    providers: dict[str, int] = {}
    for to in crash.values():
        providers[to] = providers.get(to, 0) + 1
    lines.append("## crash: bindings per defining library")
    lines += [f"  {n:6d} {lib}" for lib, n in sorted(providers.items(), key=lambda x: -x[1])]
    (out / "bindings.txt").write_text("\n".join(lines) + "\n")
    for path in out.glob("ld-*-bindings.*"):
        path.unlink()  # large; the summary above is what matters
    return [f"symbols bound differently in the crash: {len(differ)}" + (f" (e.g. {differ[0][1]} in {differ[0][0]})" if differ else "")]


def _inits(out: Path) -> None:
    lines = []
    for tag in ("crash", "twin"):
        lines.append(f"## {tag}: constructors in the order they ran")
        for path in sorted(out.glob(f"ld-{tag}-libs.*")):
            lines += ["  " + ln.split("calling init:")[1].strip() for ln in path.read_text(errors="replace").splitlines()
                      if "calling init:" in ln and KEY_LIBS.search(ln)]
        for path in out.glob(f"ld-{tag}-libs.*"):
            path.unlink()
    (out / "inits.txt").write_text("\n".join(lines) + "\n")


def _unique(out: Path, crash: Cell) -> list[str]:
    libs = _libs(out / f"{_slug(crash)}.libs.json")
    readelf = shutil.which("readelf")
    if not readelf or not libs:
        (out / "unique.txt").write_text("readelf or the link map is missing\n")
        return []
    owners: dict[str, list[str]] = {}
    for lib in libs:
        done = subprocess.run([readelf, "-W", "--dyn-syms", lib], capture_output=True, text=True)
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 8 and parts[4] == "UNIQUE" and parts[6] != "UND":
                owners.setdefault(parts[7], []).append(os.path.basename(lib))
    # Shared among llama.cpp's own libraries is expected (one libstdc++ template each); what matters is a symbol
    # that llama.cpp's libraries share with another library, whose copy may have been bound first.
    shared = {s: o for s, o in owners.items()
              if any(WATCHED.search(x) for x in o) and any(not WATCHED.search(x) for x in o)}
    lines = [f"# STB_GNU_UNIQUE symbols that llama.cpp's/CUDA's libraries share with another loaded library: {len(shared)}"]
    lines += [f"  {s}: {sorted(set(o))}" for s, o in sorted(shared.items())]
    (out / "unique.txt").write_text("\n".join(lines) + "\n")
    return [f"GNU_UNIQUE symbols llama.cpp's libraries share with others: {len(shared)}"]


def _backtrace(out: Path, crash: Cell, reruns: dict[str, Cell]) -> None:
    parts = []
    for tag in ("crash-gdb", "crash-segv", "crash-faulthandler"):
        if tag in reruns:
            log = out / f"{_slug(crash, tag)}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            keep = [ln for ln in text.splitlines() if re.search(r"^#\d|gpu_segv|^\S+\(|Thread|Fatal Python|File \"|rip|=>|signal", ln)]
            parts.append(f"## {tag} ({reruns[tag].result})\n" + "\n".join(keep[-150:]))
    (out / "backtrace.txt").write_text("\n\n".join(parts) + "\n")


def table(rows: list[Cell]) -> str:
    lines = ["| cell | order | knob | n_gpu_layers | result | s | why | last log line |", "|---|---|---|---|---|---|---|---|"]
    for c in rows:
        knob = " ".join(f"{k}={v!r}" if v == "" else f"{k}={v}" for k, v in c.env.items()) or " ".join(c.flags) or "-"
        last = c.last_log.replace("|", "/") if c.result != "ok" else ""
        lines.append(f"| {c.name} | {c.order} | {knob} | {c.gpu_layers} | **{c.result}** | {c.seconds} | {c.why} | {last} |")
    return "\n".join(lines)


def verdict(rows: list[Cell]) -> str:
    by = {c.name: c for c in rows}
    base = by["numpy-first"]
    if not crashed(base) and not crashed(by["edgerun"]):
        return ("verdict: the crash did NOT reproduce (numpy-first " + base.result + ", edgerun " + by["edgerun"].result
                + "): compare the facts (numpy, driver, build) with issue 20's")
    fixes = [c.name for c in rows
             if c.order in ("numpy", "gomp", "ggml", "cuda", "openblas", "edgerun-llama") and c.result == "ok"]
    still = [c.name for c in rows if crashed(c)]
    return f"verdict: crash reproduced ({base.result}); loads fine: {', '.join(fixes) or 'none'}; crashes: {', '.join(still)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--gpu", action="store_true")
    mode.add_argument("--dry", action="store_true")
    p.add_argument("--model", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--budget", type=float, default=180)
    p.add_argument("--cell-timeout", type=float, default=60)
    p.add_argument("--simulate-crash", action="store_true",
                   help="dry run only: the numpy-first cells fault on purpose, to exercise the diagnostics")
    args = p.parse_args(argv)
    if args.simulate_crash:
        if not args.dry:
            p.error("--simulate-crash is for --dry runs only")
        os.environ["GPU_CELL_SIMULATE_CRASH"] = "numpy"
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    rows = cells(args.dry)
    py = sys.executable
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda c: run_cell(py, args.model, c, args.out, args.cell_timeout), rows))
    notes: list[str] = []
    by = {c.name: c for c in rows}
    write(args.out, rows, ["diagnostics running"])  # the table survives a timeout of what follows
    crash = next((by[n] for n in ("numpy-first", "edgerun", "numpy-first ngl=0") if crashed(by[n])), None)
    if crash is not None:
        twin = by["llama-first" if crash.gpu_layers else "llama-first ngl=0"]
        left = deadline - time.monotonic()
        if left > 30:
            notes = diagnose(py, args.model, crash, twin, args.out, min(args.cell_timeout, left / 3))
        else:
            notes = [f"no time left for diagnostics ({left:.0f} s)"]
    else:  # no crash: still keep the two load orders for comparison with the machine
        _load_order(args.out, by["numpy-first"], by["llama-first"])
    print(write(args.out, rows, notes))
    return 0


def write(out: Path, rows: list[Cell], notes: list[str]) -> str:
    text = "\n".join(["# crash bisection (scripts/gpu_matrix.py)", "", table(rows), "", *[f"- {n}" for n in notes],
                      "", verdict(rows)])
    (out / "matrix.md").write_text(text + "\n")
    (out / "matrix.json").write_text(json.dumps({"cells": [asdict(c) for c in rows], "notes": notes,
                                                  "verdict": verdict(rows)}, indent=1))
    return text


if __name__ == "__main__":
    sys.exit(main())
