"""scripts/gpu-check.sh's parts that run without a GPU: the sdist trim, the matrix's verdict, the shell syntax.

The check itself needs an NVIDIA GPU (docs/gpu.md); these keep its CPU-side logic from rotting between GPU sessions.
"""

from __future__ import annotations

import importlib.util
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


TOP = "llama_cpp_python-0.3.36/"
KEPT = ["CMakeLists.txt", "pyproject.toml", "llama_cpp/llama_cpp.py", "vendor/llama.cpp/CMakeLists.txt",
        "vendor/llama.cpp/convert_hf_to_gguf.py", "vendor/llama.cpp/conversion/base.py",
        "vendor/llama.cpp/gguf-py/gguf/constants.py", "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu",
        "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c", "vendor/llama.cpp/src/llama-model.cpp",
        "vendor/llama.cpp/common/common.cpp", "vendor/llama.cpp/app/CMakeLists.txt",
        "vendor/llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", "vendor/llama.cpp/tools/mtmd/clip.cpp"]
DROPPED = [".git/objects/pack/pack-1.pack", "docs/index.md", "vendor/llama.cpp/.git/HEAD",
           "vendor/llama.cpp/docs/build.md", "vendor/llama.cpp/media/llama0-logo.png",
           "vendor/llama.cpp/models/ggml-vocab-qwen2.gguf", "vendor/llama.cpp/models/ggml-vocab-qwen2.gguf.out",
           "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp", "vendor/llama.cpp/ggml/src/ggml-metal/ggml-metal.m",
           "vendor/llama.cpp/ggml/src/ggml-sycl/ggml-sycl.cpp", "vendor/llama.cpp/tools/ui/index.html",
           "vendor/llama.cpp/tools/mtmd/test-3.mp4", "vendor/llama.cpp/benches/x.md", "vendor/llama.cpp/tests/test-x.cpp"]


def test_the_trim_keeps_what_the_cuda_build_and_the_converter_read(tmp_path: Path) -> None:
    trim = _script("gpu_trim")
    src = tmp_path / "sdist.tar.gz"
    with tarfile.open(src, "w:gz") as tar:
        for name in KEPT + DROPPED:
            data = name.encode()
            info = tarfile.TarInfo(TOP + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    kept, dropped = trim.trim(str(src), str(tmp_path / "out.tar.gz"))
    with tarfile.open(tmp_path / "out.tar.gz") as tar:
        names = {m.name[len(TOP):] for m in tar}
        assert tar.extractfile(TOP + "vendor/llama.cpp/convert_hf_to_gguf.py").read() == b"vendor/llama.cpp/convert_hf_to_gguf.py"
    assert names == set(KEPT) and (kept, dropped) == (len(KEPT), len(DROPPED))


def test_the_verdict_names_what_turned_the_crash_into_a_load() -> None:
    matrix = _script("gpu_matrix")
    rows = matrix.cells(dry=False)
    for cell in rows:
        cell.rc = -11 if cell.order == "numpy" else 0
    by = {c.name: c for c in rows}
    by["numpy-first OPENBLAS=1"].rc = 0
    for cell in rows:
        cell.result = "SIGSEGV" if cell.rc else "ok"
    verdict = matrix.verdict(rows)
    assert verdict.startswith("verdict: crash reproduced (SIGSEGV)")
    assert ("loads fine: edgerun, llama.cpp libs first, openblas-first, gomp+numpy, ggml+numpy, cuda+numpy,"
            " numpy-first OPENBLAS=1;") in verdict
    assert "numpy-first OPENBLAS=1" not in verdict.split("crashes:")[1]
    for cell in rows:
        cell.rc, cell.result = 0, "ok"
    assert "did NOT reproduce" in matrix.verdict(rows)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is what runs the script")
def test_the_script_parses_and_refuses_a_bad_mode() -> None:
    script = ROOT / "scripts" / "gpu-check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    done = subprocess.run(["bash", str(script), "bogus"], capture_output=True, text=True)
    assert done.returncode == 2 and "usage: scripts/gpu-check.sh prepare|run" in done.stderr
