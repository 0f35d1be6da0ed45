#!/usr/bin/env bash
# Builds llama.cpp's llama-bench from the source the npm package node-llama-cpp@3.21.1 bundles (a git bundle),
# for the side-by-side inference benchmark (bench/run.sh). Everything lands in git-ignored folders:
#   bench/llama/node_modules/  the package (npm ci against the committed bench/llama/package-lock.json)
#   bench/llama/src/           llama.cpp's source, cloned from the package's bundle
#   bench/llama/build/         the build; the program is bench/llama/build/bin/llama-bench
# Native CPU flags (GGML_NATIVE), as llama.cpp builds by default, Release. Idempotent: an existing binary built from
# the same bundle is kept. Prints the binary's path on stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../bench/llama"
JOBS=${JOBS:-$(nproc)}
for tool in node npm git cmake; do
    command -v "$tool" >/dev/null || { echo "build_llama_bench: $tool not found (scripts/setup.sh installs it)" >&2; exit 1; }
done
if [[ ! -f node_modules/node-llama-cpp/llama/gitRelease.bundle ]]; then
    echo "build_llama_bench: npm ci (node-llama-cpp@3.21.1) ..." >&2
    npm ci --no-audit --no-fund --omit=optional --ignore-scripts >npm-ci.log 2>&1 ||
        { echo "build_llama_bench: npm ci failed; see bench/llama/npm-ci.log" >&2; exit 1; }
fi
BUNDLE=node_modules/node-llama-cpp/llama/gitRelease.bundle
STAMP=$(sha256sum "$BUNDLE" | cut -c1-16)
if [[ -x build/bin/llama-bench && -f build/.bundle-stamp && $(cat build/.bundle-stamp) == "$STAMP" ]]; then
    echo "$PWD/build/bin/llama-bench"
    exit 0
fi
rm -rf src build
git clone -q "$BUNDLE" src 2>/dev/null
echo "build_llama_bench: building llama-bench from llama.cpp $(git -C src log -1 --format=%h) (a few minutes) ..." >&2
cmake -S src -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >build-configure.log 2>&1 ||
    { echo "build_llama_bench: cmake configure failed; see bench/llama/build-configure.log" >&2; exit 1; }
cmake --build build --target llama-bench -j "$JOBS" >build.log 2>&1 ||
    { echo "build_llama_bench: build failed; see bench/llama/build.log" >&2; exit 1; }
echo "$STAMP" > build/.bundle-stamp
echo "$PWD/build/bin/llama-bench"
