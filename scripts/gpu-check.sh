#!/usr/bin/env bash
# The GPU check of issue 20 section 3: does edgerun's llama.cpp path run on a real NVIDIA GPU, and if it crashes,
# why? One run on the GPU machine answers both: build, model, a bisection matrix of the crash, edgerun's own
# load path with --target gpu --require-accelerator, the raw library beside it, the ORT/LiteRT providers.
# docs/gpu.md says what each step does and how to run it with the device tool.
#
#   scripts/gpu-check.sh prepare [BUNDLE]  here (PyPI reachable): writes BUNDLE (default gpu-bundle/, git-ignored):
#                                         the trimmed llama-cpp-python sdist (~6.5 MB), the gguf and diskcache wheels
#                                         (the GPU image lacks them), scikit-build-core/pathspec as a fallback, and the
#                                         tokenizer the random model uses. Whole bundle: ~9 MB (carry limit 64 MiB).
#   scripts/gpu-check.sh run [BUNDLE]      on the GPU machine (no network): results under $OUT (summary.md,
#                                         results.tar.gz, and the built wheel in <=15 MiB parts for a rerun).
#   GPU_CHECK_DRY=1 scripts/gpu-check.sh run   here: every CPU part (no build: the venv's llama-cpp-python; a tiny
#                                         random model), to check the script. It proves nothing about a GPU.
#
# Environment: OUT (results; default BUNDLE/out), GPU_CHECK_BUDGET (seconds for the whole run, default 540),
# PYTHON (default python3; the GPU image's python3 is /opt/torch/.venv's, with torch, transformers, numpy 2.5.2),
# GPU_CHECK_JOBS (matrix cells at once, default 4).
# A rerun skips the ~300 s build when BUNDLE/wheel/ holds the parts of a wheel an earlier run left in $OUT
# (copy them there: llama_cpp_python-*.whl.part-*). Exit codes: 0 ran (crashes are results, not failures),
# 2 usage, 3 no NVIDIA GPU, 4 bundle incomplete, 5 build failed, 6 no model.
set -uo pipefail

LLAMA_VERSION=0.3.36
GGUF_VERSION=0.19.0
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-}"
BUNDLE="$(realpath -m "${2:-$REPO/gpu-bundle}")"
DRY="${GPU_CHECK_DRY:-0}"
PY="${PYTHON:-python3}"
SDIST_NAME="llama_cpp_python-$LLAMA_VERSION-trimmed.tar.gz"

die() { echo "gpu-check: $2" >&2; exit "$1"; }
say() { printf '[gpu-check %4ds] %s\n' "$((SECONDS))" "$*"; }

# ---------------------------------------------------------------------------------------------------------- prepare
prepare() {
    local py="${PYTHON:-$REPO/.venv/bin/python}"
    mkdir -p "$BUNDLE/wheels"
    local sdist="${LLAMA_SDIST:-}"
    if [[ -z "$sdist" ]]; then
        for cand in "$HOME/.cache/edgerun/llama-server/sdist/llama_cpp_python-$LLAMA_VERSION.tar.gz" \
                    "$BUNDLE/src/llama_cpp_python-$LLAMA_VERSION.tar.gz"; do
            [[ -f "$cand" ]] && sdist="$cand" && break
        done
    fi
    if [[ -z "$sdist" ]]; then
        "$py" -m pip download -q --no-deps --no-binary llama-cpp-python -d "$BUNDLE/src" "llama-cpp-python==$LLAMA_VERSION" \
            || die 4 "cannot download the llama-cpp-python $LLAMA_VERSION sdist (set LLAMA_SDIST=/path/to/it)"
        sdist="$BUNDLE/src/llama_cpp_python-$LLAMA_VERSION.tar.gz"
    fi
    "$py" "$REPO/scripts/gpu_trim.py" "$sdist" "$BUNDLE/$SDIST_NAME" || die 4 "trimming $sdist failed"
    rm -rf "$BUNDLE/src"
    # Pure-Python wheels the GPU image lacks (gguf: the converter; diskcache: llama_cpp imports it), and the
    # build back-end in case the image's scikit-build-core is missing or too old. --no-deps: the image has the rest.
    "$py" -m pip download -q --no-deps --only-binary :all: -d "$BUNDLE/wheels" \
        "gguf==$GGUF_VERSION" "diskcache==5.6.3" "scikit-build-core==0.11.6" "pathspec==0.12.1" \
        || die 4 "cannot download the carried wheels"
    "$py" "$REPO/scripts/gpu_model.py" tokenizer "$BUNDLE/tokenizer" || die 4 "cannot write the tokenizer"
    du -sh "$BUNDLE" "$BUNDLE"/* >&2
    local total; total="$(du -sb "$BUNDLE" | cut -f1)"
    (( total < 40 * 1024 * 1024 )) || die 4 "$BUNDLE is $((total >> 20)) MiB: too much for the 64 MiB a device call carries with the tree"
}

# -------------------------------------------------------------------------------------------------------------- run
# Seconds left of the budget; a step runs only with its minimum left, under `timeout` of what is left.
left() { echo $(( BUDGET - SECONDS )); }
step_timeout() { local want="$1" l; l="$(left)"; (( l < want )) && echo "$l" || echo "$want"; }

build_wheel() {
    local cache=("$BUNDLE"/wheel/llama_cpp_python-*.whl.part-*)
    if [[ -e "${cache[0]}" ]]; then
        local name; name="$(basename "${cache[0]%.part-*}")"
        cat "${cache[@]}" > "$WORK/$name"
        say "build skipped: using the cached wheel $name from $BUNDLE/wheel ($(du -h "$WORK/$name" | cut -f1))"
        WHEEL="$WORK/$name"
        return 0
    fi
    [[ -f "$WORK/src/pyproject.toml" ]] || die 4 "missing $BUNDLE/$SDIST_NAME; run here first: scripts/gpu-check.sh prepare"
    local arch; arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
    [[ "$arch" =~ ^[0-9]+$ ]] || die 3 "cannot read the GPU's compute capability"
    if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
        export PATH="$PATH:/usr/local/cuda/bin"  # CMake finds the CUDA compiler on the PATH
    fi
    command -v nvcc >/dev/null || die 5 "no nvcc: CUDA's compiler is needed to build llama.cpp's CUDA backend"
    say "building llama-cpp-python $LLAMA_VERSION with CUDA for sm_$arch on $(nproc) cores ($(nvcc --version | tail -1))"
    local t0=$SECONDS
    # The issue's flags; only this GPU's architecture (a build for every arch outlasts a device call). The carried
    # scikit-build-core comes first on the path: the same build back-end whatever the image holds.
    PYTHONPATH="$SITE" \
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAVA_BUILD=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        timeout "$(step_timeout 430)" "$PY" -m pip wheel -v --no-deps --no-build-isolation --no-index \
        -w "$WORK/wheel" "$WORK/src" > "$RES/build.log" 2>&1
    local rc=$?
    echo "build: rc=$rc in $((SECONDS - t0)) s" >> "$RES/facts.txt"
    (( rc == 0 )) || { tail -30 "$RES/build.log" >&2; return 5; }
    WHEEL="$(ls "$WORK"/wheel/llama_cpp_python-*.whl)"
    say "built $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1)) in $((SECONDS - t0)) s"
    # Leave the wheel for a rerun: $OUT returns files of at most 16 MiB, 8 files in all.
    local size; size="$(stat -c %s "$WHEEL")"
    if (( size <= 45 * 1024 * 1024 )); then
        mkdir -p "$OUT/wheel"
        split -b 15M -d "$WHEEL" "$OUT/wheel/$(basename "$WHEEL").part-"
    else
        echo "wheel not cached: $((size >> 20)) MiB is over the 45 MiB that 3 files of \$OUT return" >> "$RES/facts.txt"
    fi
}

facts() {
    {
        echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "host: $(uname -srm); cores: $(nproc)"
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used,driver_version --format=csv,noheader 2>&1
        else
            echo "nvidia-smi: none"
        fi
        command -v nvcc >/dev/null && nvcc --version | tail -2
        echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable, sys.prefix)')"
        "$PY" -m pip list 2>/dev/null | grep -iE '^(numpy|torch|transformers|onnxruntime|onnxruntime-gpu|ai-edge-litert|tflite-runtime|llama.cpp.python|gguf|scikit-build-core|jinja2|diskcache) ' || true
        "$PY" -c 'import numpy; numpy.show_config()' 2>&1 | grep -iE 'name|version|openblas config|threading' | head -12
        ldd --version | head -1
        grep -m1 -oE '\b(amx_tile|amx_int8|amx_bf16|avx512f|avx512_vnni)\b' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
        grep -m1 'model name' /proc/cpuinfo
        for d in gdb cuda-gdb cc gcc readelf; do printf '%s: %s\n' "$d" "$(command -v "$d" || echo none)"; done
        ulimit -a | grep -E 'stack|processes|virtual'
    } >> "$RES/facts.txt" 2>&1
}

run_check() {
    BUDGET="${GPU_CHECK_BUDGET:-540}"
    OUT="${OUT:-$BUNDLE/out}"
    WORK="${WORK:-/tmp/edgerun-gpu-check}"
    RES="$WORK/results"
    SITE="$WORK/site"
    rm -rf "$WORK" && mkdir -p "$RES" "$SITE" "$OUT"
    export PYTHONUNBUFFERED=1
    local model="$WORK/model.gguf" target_args=(--gpu) py_path

    if [[ "$DRY" == 1 ]]; then
        PY="${PYTHON:-$REPO/.venv/bin/python}"
        say "DRY RUN: no GPU, no build; the venv's llama-cpp-python; a tiny random model. Nothing here is a GPU result."
        echo "DRY RUN (GPU_CHECK_DRY=1): CPU only, not a GPU result" > "$RES/facts.txt"
        target_args=(--dry)
        py_path="$REPO"
    else
        command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || die 3 "no NVIDIA GPU here (nvidia-smi)"
        [[ -d "$BUNDLE/tokenizer" && -f "$BUNDLE/$SDIST_NAME" ]] \
            || die 4 "$BUNDLE is incomplete; run here first: scripts/gpu-check.sh prepare"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$BUNDLE"/wheels/*.whl \
            > "$RES/pip.log" 2>&1 || die 4 "cannot install the carried wheels (log: $RES/pip.log)"
        py_path="$SITE:$REPO"
    fi
    facts
    say "$(head -3 "$RES/facts.txt" | tr '\n' ' ')"

    # The model is made while llama.cpp builds (the build takes the cores; this is mostly I/O).
    local converter="$WORK/src/vendor/llama.cpp/convert_hf_to_gguf.py"
    mkdir -p "$WORK/src"
    tar -xzf "$BUNDLE/$SDIST_NAME" -C "$WORK/src" --strip-components=1 || die 4 "cannot unpack $BUNDLE/$SDIST_NAME"
    local size_args=()
    [[ "$DRY" == 1 ]] && size_args=(--tiny)
    PYTHONPATH="$py_path" OMP_NUM_THREADS=4 timeout "$(step_timeout 400)" nice -n 5 "$PY" "$REPO/scripts/gpu_model.py" make \
        --tokenizer "$BUNDLE/tokenizer" --converter "$converter" --out "$model" "${size_args[@]}" \
        > "$RES/model.log" 2>&1 &
    local model_pid=$!

    if [[ "$DRY" != 1 ]]; then
        build_wheel || { wait "$model_pid"; pack; die 5 "the CUDA build failed (results.tar.gz has build.log)"; }
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/llama" "$WHEEL" >> "$RES/pip.log" 2>&1 \
            || { pack; die 5 "cannot install $WHEEL"; }
        py_path="$WORK/llama:$py_path"
    fi
    wait "$model_pid"; local mrc=$?
    say "model: rc=$mrc $(tail -1 "$RES/model.log")"
    [[ -f "$model" ]] || { pack; die 6 "no model (log: model.log in results.tar.gz)"; }
    export PYTHONPATH="$py_path"

    # 1. The bisection matrix: fresh processes, each import order x environment knob; crashes get diagnostics.
    (( $(left) > 60 )) && timeout "$(step_timeout 200)" "$PY" "$REPO/scripts/gpu_matrix.py" "${target_args[@]}" \
        --model "$model" --out "$RES/matrix" --jobs "${GPU_CHECK_JOBS:-4}" --budget "$(( $(left) - 150 ))" \
        > "$RES/matrix.log" 2>&1
    say "matrix: $(tail -1 "$RES/matrix.log" 2>/dev/null)"

    # 2. edgerun's own load path, then the raw library the way its README shows, GPU and CPU, the same prompt.
    (( $(left) > 30 )) && timeout "$(step_timeout 150)" "$PY" "$REPO/scripts/gpu_speed.py" "${target_args[@]}" \
        --model "$model" --out "$RES/speed" > "$RES/speed.log" 2>&1
    say "speed: $(tail -1 "$RES/speed.log" 2>/dev/null)"

    # 3. ONNX Runtime and LiteRT GPU providers, where the image's packages have them.
    (( $(left) > 10 )) && timeout "$(step_timeout 40)" "$PY" "$REPO/scripts/gpu_providers.py" "${target_args[@]}" \
        --out "$RES/providers.json" > "$RES/providers.log" 2>&1
    say "providers: $(tail -1 "$RES/providers.log" 2>/dev/null)"

    "$PY" "$REPO/scripts/gpu_report.py" "$RES" > "$OUT/summary.md" 2> "$RES/report.log" \
        || echo "report failed: $(tail -3 "$RES/report.log")" >> "$OUT/summary.md"
    pack
    cat "$OUT/summary.md"
    say "done: $OUT/summary.md, $OUT/results.tar.gz"
}

pack() {
    # Every log, each capped at 2 MiB (the tail), in one archive: $OUT returns at most 8 files of 16 MiB.
    find "$RES" -type f -size +2M -exec sh -c 'tail -c 2M "$1" > "$1.tail" && mv "$1.tail" "$1"' _ {} \;
    tar -czf "$OUT/results.tar.gz" -C "$WORK" results 2>/dev/null
}

case "$MODE" in
    prepare) prepare ;;
    run) run_check ;;
    *) die 2 "usage: scripts/gpu-check.sh prepare|run [BUNDLE]" ;;
esac
