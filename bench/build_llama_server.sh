#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama.cpp source vendored in the llama-cpp-python sdist,
# so bench/serve.py compares edgerun serve with the same llama.cpp the runtime links.
#
#   bench/build_llama_server.sh            # -> ~/.cache/edgerun/llama-server/bin/llama-server
#   JOBS=2 nice -n 19 bench/build_llama_server.sh
#
# Idempotent: the sdist is downloaded once (pip's ordinary client), unpacked once, and the build is
# skipped when the binary already exists and runs. Only the llama-server target is built
# (Release, -DGGML_NATIVE=ON, -DLLAMA_CURL=OFF).
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${EDGERUN_LLAMA_SERVER_DIR:-$HOME/.cache/edgerun/llama-server}"
JOBS="${JOBS:-2}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$HERE/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"

BIN="$CACHE/bin/llama-server"
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "llama-server already built: $BIN"
    exit 0
fi

for tool in cmake c++; do
    command -v "$tool" >/dev/null || { echo "build_llama_server: $tool is not installed (needed to build llama-server)" >&2; exit 2; }
done

mkdir -p "$CACHE/sdist" "$CACHE/src" "$CACHE/bin"
SDIST="$(ls "$CACHE"/sdist/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)"
if [ -z "$SDIST" ]; then
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE/sdist"
    SDIST="$(ls "$CACHE"/sdist/llama_cpp_python-"$VERSION".tar.gz)"
fi

SRC="$CACHE/src/llama_cpp_python-$VERSION"
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
    rm -rf "$SRC"
    tar -xzf "$SDIST" -C "$CACHE/src"
fi
LLAMA="$SRC/vendor/llama.cpp"
[ -f "$LLAMA/CMakeLists.txt" ] || { echo "build_llama_server: no llama.cpp source in $SDIST (expected vendor/llama.cpp)" >&2; exit 1; }

BUILD="$CACHE/build"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$LLAMA" -B "$BUILD" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=OFF
cmake --build "$BUILD" --config Release --target llama-server -j "$JOBS"

OUT="$(find "$BUILD" -type f -name llama-server -perm -u+x | head -n1)"
[ -n "$OUT" ] || { echo "build_llama_server: the build finished without a llama-server binary" >&2; exit 1; }
cp "$OUT" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
"$BIN" --version 2>&1 | head -n 2 || true
echo "llama-server built: $BIN"
