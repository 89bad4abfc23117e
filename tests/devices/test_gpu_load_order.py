"""Issue 20: on a CUDA build of llama-cpp-python, ``import numpy`` before llama.cpp's libraries load ended in SIGSEGV
inside llama_model_load_from_file (H200, CUDA 13; --target cpu too). edgerun's own path imports numpy before
llama_cpp, so this runs that path in a fresh interpreter with numpy's libraries loaded first and the layers asked for
the GPU, and requires a clean exit, not a signal. On a CPU build it guards the same order with the layers asked for
(llama.cpp keeps them on the CPU); on a CUDA build (scripts/gpu-check.sh's machine) it is the crash's regression test.
The cause is still open until scripts/gpu-check.sh runs on a GPU (docs/gpu.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
import numpy  # first, as issue 20's crash needs; edgerun's own modules import it before llama_cpp too

def maps():
    return open("/proc/self/maps").read()

before = maps()
assert "libllama" not in before, "llama.cpp was loaded before the test's numpy import"
numpy_libs = "openblas" in before or "numpy" in before

import dataclasses
from devices.placement import ALL_LAYERS, cpu_placement
from runtime.backends.llamacpp import LlamaCppBackend, gpu_offload_supported
from runtime.formats.gguf_file import read_gguf
from runtime.llm.model import LLM
from runtime.llm.plan import plan_llm

path = sys.argv[1]
gpu = gpu_offload_supported()
# edgerun's load path end to end: plan, placement, backend, generation
with LLM.load(path, memory="2G", ctx=256, threads=1, target="gpu" if gpu else "cpu", require_accelerator=gpu) as llm:
    out = llm.generate("The quick brown fox", llm.params(max_tokens=4, temperature=0.0))
    placed = llm.placement.offload.by_device
# and edgerun's backend told to put every layer on the GPU, whatever the build has
plan = plan_llm(read_gguf(path), 2 << 30, ctx=256)
every_layer = dataclasses.replace(cpu_placement("llamacpp"), gpu_layers=ALL_LAYERS, threads=1)
with LlamaCppBackend(path, plan, every_layer) as backend:
    offload = backend.offload()
print(json.dumps({"numpy_first": numpy_libs, "gpu_build": gpu, "tokens": out.tokens_out,
                  "placed": dict(placed), "asked_all": dict(offload.by_device)}))
"""


def test_edgerun_loads_with_numpy_loaded_before_llama_cpp(smollm) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, str(smollm.path())], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode >= 0, f"killed by signal {-done.returncode} (issue 20's crash):\n{done.stderr[-3000:]}"
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["numpy_first"] and report["tokens"] == 4
    assert sum(report["placed"].values()) == 31 and sum(report["asked_all"].values()) == 31  # 30 layers + output
    if report["gpu_build"]:
        assert report["asked_all"].get("CPU", 0) < 31, f"a GPU build kept every layer on the CPU: {report}"
