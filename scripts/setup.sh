#!/usr/bin/env bash
# Installs every Debian package swiftcpp's build, tests and benchmarks need, then (best effort) the pinned llama.cpp npm
# package the GGUF interop test runs (scripts/setup_llama_interop.sh). Idempotent.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libopenblas0-openmp libgloo-dev libdnnl-dev  # libdnnl-dev: oneDNN's sgemm for float32 GEMMs
  libsentencepiece-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libcpp-httplib-dev libpcre2-dev libicu-dev zlib1g-dev libbz2-dev libjpeg62-turbo-dev libpng-dev
  python3-torch python3-numpy python3-jinja2
  git time  # bench/run.sh: llama.cpp's source comes as a git bundle; GNU time measures llama-bench's peak memory
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
bash "$(dirname "${BASH_SOURCE[0]}")/setup_llama_interop.sh"
# The OpenAI client the deploy test runs (tests/client, pinned by its committed lockfile). Best effort: without node
# or the npm registry the test skips saying so.
if command -v npm >/dev/null 2>&1; then
  (cd "$(dirname "${BASH_SOURCE[0]}")/../tests/client" &&
     { [ -f node_modules/openai/package.json ] || npm ci --no-audit --no-fund >/dev/null 2>&1; }) ||
    echo "setup: npm ci in tests/client failed; the deploy client test will be skipped" >&2
else
  echo "setup: npm not found; the deploy client test will be skipped" >&2
fi
