#!/usr/bin/env bash
# Serving under load: `swiftcpp deploy` against llama.cpp's `llama-server` on the same GGUF file of bench25m (f32,
# with the Llama 2 tokenizer its vocabulary is made for), same threads, same concurrency, measured back to back by
# one load generator (bench/serve_load.mjs: streamed /v1/completions, a ~100-word prompt, exactly MAX_TOKENS new
# tokens per request, greedy). For each server: a single stream (concurrency 1), then CONCURRENCY streams against
# --parallel CONCURRENCY; reports aggregate decode tokens/s, the concurrent/single ratio, and p50/p99 time to first
# token. Prints a markdown table for docs/benchmarks.md; raw JSON goes to bench/results/serve-<UTC timestamp>/.
#
#   bash bench/run_serve.sh      (after: cmake --build build --target swiftcpp)
#
# llama-server is built once, into third_party/llama-serve/ (git-ignored, never committed), from the llama.cpp
# source that the npm package node-llama-cpp@3.21.1 carries (llama/gitRelease.bundle): npm install
# --ignore-scripts, git clone of the bundle, cmake --target llama-server (CPU, no curl). About 10 minutes on 2 cores.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  THREADS [2]  CONCURRENCY [8]  REQUESTS [32]  SINGLE_REQUESTS [4]  MAX_TOKENS [128]
#   MODEL [bench/models/bench25m]  SHARED [../shared/assets]  PYTHON [/usr/bin/python3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
CONCURRENCY=${CONCURRENCY:-8}
REQUESTS=${REQUESTS:-32}
SINGLE_REQUESTS=${SINGLE_REQUESTS:-4}
MAX_TOKENS=${MAX_TOKENS:-128}
MODEL=${MODEL:-bench/models/bench25m}
SHARED=${SHARED:-../shared/assets}
PYTHON=${PYTHON:-/usr/bin/python3}
BIN=$BUILD_DIR/bin/swiftcpp
LLAMA_DIR=third_party/llama-serve
LLAMA_VERSION=3.21.1

for v in THREADS CONCURRENCY REQUESTS SINGLE_REQUESTS MAX_TOKENS; do
    if [[ ! ${!v} =~ ^[0-9]+$ ]] || [[ ${!v} -lt 1 ]]; then
        echo "error: $v must be a positive integer (got '${!v}')" >&2
        exit 1
    fi
done
[[ -x $BIN ]] || { echo "error: $BIN not found; build first: cmake --build $BUILD_DIR --target swiftcpp" >&2; exit 1; }
command -v node >/dev/null || { echo "error: node not found" >&2; exit 1; }
[[ -f $SHARED/tokenizers/llama2/tokenizer.model ]] ||
    { echo "error: $SHARED/tokenizers/llama2/tokenizer.model not found (bench25m needs a 32000-token tokenizer)" >&2; exit 1; }

# llama-server from node-llama-cpp's llama.cpp source.
SERVER_BIN=$LLAMA_DIR/build/bin/llama-server
if [[ ! -x $SERVER_BIN ]]; then
    mkdir -p "$LLAMA_DIR"
    [[ -f $LLAMA_DIR/package.json ]] || echo '{"name": "swiftcpp-llama-serve", "private": true}' > "$LLAMA_DIR/package.json"
    (cd "$LLAMA_DIR" && npm install --no-audit --no-fund --ignore-scripts --omit=optional "node-llama-cpp@$LLAMA_VERSION" >npm.log 2>&1)
    rm -rf "$LLAMA_DIR/src"
    git clone -q "$LLAMA_DIR/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$LLAMA_DIR/src"
    cmake -S "$LLAMA_DIR/src" -B "$LLAMA_DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$LLAMA_DIR/configure.log" 2>&1
    cmake --build "$LLAMA_DIR/build" --target llama-server -j "$(nproc)" >"$LLAMA_DIR/build.log" 2>&1
fi

if [[ ! -f $MODEL/config.json ]]; then
    [[ $MODEL == bench/models/bench25m ]] || { echo "error: $MODEL/config.json not found" >&2; exit 1; }
    "$PYTHON" scripts/make_bench_model.py --out "$MODEL"
fi
OUT=bench/results/serve-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT/model"
for f in "$MODEL"/*; do ln -sf "$(realpath "$f")" "$OUT/model/"; done
cp "$SHARED/tokenizers/llama2/tokenizer.model" "$OUT/model/"
"$BIN" export --model "$OUT/model" --format gguf --quant f32 --output "$OUT/model.gguf" 2>"$OUT/export.log"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/machine.txt"

trap 'jobs -p | xargs -r kill 2>/dev/null' EXIT

wait_ready() {  # port
    for _ in $(seq 1 600); do
        if [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health" || true) == 200 ]]; then return 0; fi
        sleep 0.1
    done
    echo "error: server on port $1 not ready" >&2
    return 1
}

PORT=18431
run_server() {  # name parallel -> JSON lines in $OUT/<name>-<parallel>.json
    local name=$1 parallel=$2 port pid requests
    PORT=$((PORT + 1)); port=$PORT  # a fresh port each run: the last one may linger in TIME_WAIT
    requests=$([[ $parallel == 1 ]] && echo "$SINGLE_REQUESTS" || echo "$REQUESTS")
    if [[ $name == swiftcpp ]]; then
        "$BIN" --threads "$THREADS" deploy --model "$OUT/model.gguf" --tokenizer "$OUT/model" --port $port \
            --parallel "$parallel" --max-model-len 1024 --served-model-name bench 2>"$OUT/$name-$parallel.log" &
    else
        "$SERVER_BIN" -m "$OUT/model.gguf" --port $port -t "$THREADS" -tb "$THREADS" --parallel "$parallel" \
            -c $((1024 * parallel)) --cont-batching --no-webui 2>"$OUT/$name-$parallel.log" >/dev/null &
    fi
    pid=$!
    wait_ready $port
    node bench/serve_load.mjs --url "http://127.0.0.1:$port" --concurrency "$parallel" --requests "$requests" \
        --max-tokens "$MAX_TOKENS" --model bench | tee "$OUT/$name-$parallel.json"
    kill -TERM "$pid"; wait "$pid" || true
}

for name in swiftcpp llama-server; do
    run_server "$name" 1
    run_server "$name" "$CONCURRENCY"
done

"$PYTHON" - "$OUT" "$CONCURRENCY" <<'EOF' | tee "$OUT/table.md"
import json, sys
out, c = sys.argv[1], sys.argv[2]
load = lambda n, p: json.load(open(f"{out}/{n}-{p}.json"))
print(f"| server | 1 stream tok/s | {c} streams tok/s | {c} vs 1 | TTFT p50 ms ({c}) | TTFT p99 ms ({c}) |")
print("|---|---|---|---|---|---|")
rows = {}
for n in ["swiftcpp", "llama-server"]:
    one, many = load(n, 1), load(n, c)
    rows[n] = many
    print(f"| {n} | {one['tokens_per_s']:.1f} | {many['tokens_per_s']:.1f} | {many['tokens_per_s'] / one['tokens_per_s']:.2f}x "
          f"| {many['ttft_p50_ms']:.0f} | {many['ttft_p99_ms']:.0f} |")
s, l = rows["swiftcpp"], rows["llama-server"]
print(f"\nswiftcpp / llama-server at {c} streams: {s['tokens_per_s'] / l['tokens_per_s']:.2f}x tokens/s, "
      f"TTFT p50 {s['ttft_p50_ms'] / l['ttft_p50_ms']:.2f}x, p99 {s['ttft_p99_ms'] / l['ttft_p99_ms']:.2f}x")
EOF
