"""Trim llama-cpp-python's sdist to what a CUDA build and llama.cpp's HF converter need (scripts/gpu-check.sh prepare).

The 0.3.36 sdist is 73 MiB packed: a git pack of the llama.cpp submodule (38 MB), llama.cpp's vocabulary test
models (75 MB unpacked), docs (38 MB), the web UI, media, benchmarks, and backends for other GPUs. None is read by a
build with -DGGML_CUDA=on and tests, examples, tools and LLaVA off (their CMake subdirectories are added only when
enabled), or by convert_hf_to_gguf.py. What stays packs to about 5 MB, so it travels to a GPU machine inside the
64 MiB a device call carries.

    python scripts/gpu_trim.py SDIST.tar.gz OUT.tar.gz
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import PurePosixPath

VENDOR = "vendor/llama.cpp/"
DROP_DIRS = (
    ".git", ".github", "docs", "media", "benches", "tools/ui",
    # llama-cpp-python's own docs, examples and tests
    "/.git", "/docs", "/examples", "/tests", "/docker",
)
MEDIA = (".mp4", ".wav", ".mp3", ".jpg", ".jpeg", ".png", ".gif", ".webp", ".pdf")  # sample inputs of the tools
# ggml backends for other hardware: their directories are added only when their GGML_<NAME> option is on.
OTHER_BACKENDS = ("sycl", "vulkan", "opencl", "metal", "hexagon", "cann", "openvino", "webgpu", "et", "virtgpu",
                  "musa", "hip", "zdnn", "kompute", "blas", "rpc", "zendnn")


def keep(name: str) -> bool:
    parts = PurePosixPath(name).parts
    rel = "/".join(parts[1:])  # without the top folder llama_cpp_python-X.Y.Z/
    if rel.lower().endswith(MEDIA):
        return False
    if rel.startswith(VENDOR):
        inner = rel[len(VENDOR):]
        if any(inner == d or inner.startswith(d + "/") for d in DROP_DIRS if not d.startswith("/")):
            return False
        if inner.startswith("models/") and not inner.startswith("models/templates/"):
            return False  # ggml-vocab-*.gguf and their .inp/.out: tokenizer test data
        if any(inner.startswith(f"ggml/src/ggml-{b}/") or inner == f"ggml/src/ggml-{b}" for b in OTHER_BACKENDS):
            return False
        if inner.startswith("tests/"):
            return False
        return True
    return not any(rel == d[1:] or rel.startswith(d[1:] + "/") for d in DROP_DIRS if d.startswith("/"))


def trim(src: str, dst: str) -> tuple[int, int]:
    kept = dropped = 0
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz", compresslevel=9) as tout:
        for member in tin:
            if not keep(member.name):
                dropped += 1
                continue
            kept += 1
            tout.addfile(member, tin.extractfile(member) if member.isfile() else None)
    return kept, dropped


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    kept, dropped = trim(argv[0], argv[1])
    print(f"gpu_trim: kept {kept} entries, dropped {dropped}: {argv[1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
