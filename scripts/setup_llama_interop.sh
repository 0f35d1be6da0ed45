#!/usr/bin/env bash
# Installs a real llama.cpp for the GGUF interop test: the npm packages node-llama-cpp (llama.cpp's bindings) and
# @node-llama-cpp/linux-x64 (its prebuilt CPU libllama), pinned, into third_party/llama-interop/ (git-ignored).
# Only the CPU build: --omit=optional skips the CUDA and Vulkan variants (~600 MB). Needs node and npm and the npm
# registry; without them it prints why and exits 0, and the interop test skips saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
VERSION=3.22.1
DEST=third_party/llama-interop
if [[ -f $DEST/node_modules/node-llama-cpp/package.json ]] &&
   grep -q "\"version\": \"$VERSION\"" "$DEST/node_modules/node-llama-cpp/package.json"; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    echo "setup_llama_interop: node/npm not found; the llama.cpp interop test will be skipped" >&2
    exit 0
fi
mkdir -p "$DEST"
[[ -f $DEST/package.json ]] || echo '{"name": "swiftcpp-llama-interop", "private": true, "type": "module"}' > "$DEST/package.json"
if ! (cd "$DEST" && npm install --no-audit --no-fund --omit=optional --ignore-scripts \
        "node-llama-cpp@$VERSION" "@node-llama-cpp/linux-x64@$VERSION" >npm-install.log 2>&1); then
    echo "setup_llama_interop: npm install failed (registry unreachable?); see $DEST/npm-install.log;" \
         "the llama.cpp interop test will be skipped" >&2
fi
exit 0
