"""One cell of the GPU check's crash bisection (scripts/gpu_matrix.py runs each in a fresh process).

    python scripts/gpu_cell.py ORDER MODEL [--gpu-layers N] [--no-mmap] [--record FILE]

ORDER says what is loaded before llama.cpp's model load, in this order:

    numpy     import numpy, then llama_cpp                      (issue 20: SIGSEGV on the CUDA build)
    llama     llama_cpp, then numpy (llama_cpp imports it)      (issue 20: fine)
    errors    runtime.errors, then llama_cpp                    (issue 20: fine)
    edgerun   edgerun's own path: runtime.llm.model.LLM.load (what `edgerun run` does)
    edgerun-llama  llama.cpp's libraries (llama_cpp.llama_cpp) first, then edgerun's own path: the candidate fix
    openblas  only numpy's bundled OpenBLAS (ctypes, no numpy import), then llama_cpp
    gomp      libgomp.so.1 with RTLD_GLOBAL, then numpy, then llama_cpp
    ggml      llama.cpp's own libggml-base/-cpu (as llama_cpp loads them), then numpy, then llama_cpp
    cuda      the CUDA libraries libggml-cuda.so needs (cudart, cublas, ...), then numpy, then llama_cpp

Then it loads MODEL (n_gpu_layers as given, 512 context), evaluates 8 tokens, and prints one JSON line. A crash
shows as the process's signal (the matrix records it). ``--record FILE`` writes, just before the load, the libraries
in load order (the dynamic linker's link map, via dl_iterate_phdr) and the process's thread count: the matrix diffs
them between a crashing and a working order.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _pkg_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SystemExit(f"gpu_cell: {name} is not importable")
    return Path(spec.origin).parent


def loaded_libraries() -> list[str]:
    """Shared objects in the order the dynamic linker loaded them (its link map)."""

    class Info(ctypes.Structure):
        _fields_ = [("addr", ctypes.c_void_p), ("name", ctypes.c_char_p), ("phdr", ctypes.c_void_p),
                    ("phnum", ctypes.c_uint16)]

    names: list[str] = []
    callback_t = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), ctypes.c_size_t, ctypes.c_void_p)

    def visit(info, size, data):  # noqa: ARG001 - dl_iterate_phdr's signature
        name = info.contents.name
        if name:
            names.append(name.decode(errors="replace"))
        return 0

    ctypes.CDLL(None).dl_iterate_phdr(callback_t(visit), None)
    return names


def threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def cuda_needed(lib_dir: Path) -> list[str]:
    """The libraries libggml-cuda.so needs, resolved as the loader would (ldd), ggml's own left out."""
    cuda = lib_dir / "libggml-cuda.so"
    if not cuda.exists():
        return []
    out = subprocess.run(["ldd", str(cuda)], capture_output=True, text=True).stdout
    paths = []
    for line in out.splitlines():
        if "=>" in line and "ggml" not in line:
            path = line.split("=>")[1].split("(")[0].strip()
            if path and ("cuda" in path or "cublas" in path or "nvidia" in path):
                paths.append(path)
    return paths


def preload(order: str) -> list[str]:
    """What ``order`` loads before llama_cpp; returns what it loaded."""
    done: list[str] = []
    if order == "numpy":
        import numpy  # noqa: F401

        done.append("numpy")
    elif order == "errors":
        import runtime.errors  # noqa: F401

        done.append("runtime.errors")
    elif order == "openblas":
        libs = sorted(glob.glob(str(_pkg_dir("numpy").parent / "numpy.libs" / "*openblas*.so*")))
        for lib in libs:
            ctypes.CDLL(lib)
            done.append(lib)
    elif order == "gomp":
        ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
        import numpy  # noqa: F401

        done += ["libgomp.so.1 (RTLD_GLOBAL)", "numpy"]
    elif order == "ggml":
        lib_dir = _pkg_dir("llama_cpp") / "lib"
        for name in ("libggml-base.so", "libggml-cpu.so"):
            ctypes.CDLL(str(lib_dir / name))
            done.append(name)
        import numpy  # noqa: F401

        done.append("numpy")
    elif order == "cuda":
        for path in cuda_needed(_pkg_dir("llama_cpp") / "lib"):
            ctypes.CDLL(path)
            done.append(path)
        if not done:
            print(json.dumps({"order": order, "skipped": "this build has no libggml-cuda.so"}))
            sys.exit(0)
        import numpy  # noqa: F401

        done.append("numpy")
    elif order == "edgerun-llama":
        import llama_cpp.llama_cpp  # noqa: F401 - only the native libraries, before edgerun imports numpy

        done.append("llama_cpp.llama_cpp")
    elif order not in ("llama", "edgerun"):
        raise SystemExit(f"gpu_cell: unknown order {order!r}")
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("order")
    p.add_argument("model")
    p.add_argument("--gpu-layers", type=int, default=999)
    p.add_argument("--no-mmap", action="store_true")
    p.add_argument("--no-extra-bufts", action="store_true", help="llama_model_params.use_extra_bufts = false")
    p.add_argument("--record")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    before = preload(args.order)
    result: dict = {"order": args.order, "preloaded": before, "gpu_layers": args.gpu_layers}
    if args.order in ("edgerun", "edgerun-llama"):
        from runtime.llm.model import LLM

        target = "gpu" if args.gpu_layers else "cpu"
        if args.record:
            _record(args.record)
        with LLM.load(args.model, memory="32G", ctx=512, target=target, require_accelerator=target == "gpu") as llm:
            result["loaded_s"] = round(time.monotonic() - t0, 2)
            result["placement"] = llm.placement.summary()
            gen = llm.generate("The quick brown fox", llm.params(max_tokens=8, temperature=0.0))
            result["tokens_out"] = gen.tokens_out
    else:
        from llama_cpp import Llama

        if args.no_extra_bufts:  # no weight repacking into the CPU's extra buffer types (AMX, AVX-512 tiles)
            import llama_cpp.llama_cpp as capi

            defaults = capi.llama_model_default_params

            def params():
                p = defaults()
                p.use_extra_bufts = False
                return p

            capi.llama_model_default_params = params
        if args.record:
            _record(args.record)
        if os.environ.get("GPU_CELL_SIMULATE_CRASH") == args.order:  # the dry run's check of the diagnostics
            ctypes.string_at(0)
        llm = Llama(args.model, n_gpu_layers=args.gpu_layers, n_ctx=512, use_mmap=not args.no_mmap, verbose=True)
        result["loaded_s"] = round(time.monotonic() - t0, 2)
        tokens = llm.tokenize(b"The quick brown fox jumps over the lazy dog")[:8]
        llm.eval(tokens)
        result["evaluated"] = len(tokens)
        llm.close()
    result["ok"] = True
    result["threads_after"] = threads()
    print(json.dumps(result), flush=True)
    return 0


def _record(path: str) -> None:
    Path(path).write_text(json.dumps({"threads": threads(), "libraries": loaded_libraries()}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
