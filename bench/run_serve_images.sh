#!/usr/bin/env bash
# Serving a vision-language model with images: `swiftcpp deploy` on bench25m-qwen2-vl (scripts/make_bench_qwen2_vl.py,
# generated when missing), streamed chat requests (bench/serve_load.mjs) of a ~PROMPT_WORDS-word question with and
# without one image (IMAGE as a base64 data URL: coffee.jpg becomes 580 tokens, 2,320 patches, at the model's
# processor settings), exactly MAX_TOKENS new tokens each, at 1 stream and at CONCURRENCY streams against --parallel
# CONCURRENCY. ROUNDS rounds, each alternating text / image at both concurrencies, so the image/text ratios are taken
# side by side. Prints a markdown table; raw JSON and the load go to bench/results/serve-images-<UTC timestamp>/.
#
#   bash bench/run_serve_images.sh      (after: cmake --build build --target swiftcpp)
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  THREADS [2]  CONCURRENCY [8]  REQUESTS [16]  SINGLE_REQUESTS [4]  MAX_TOKENS [64]
#   PROMPT_WORDS [30]  ROUNDS [2]  MODEL [bench/models/bench25m-qwen2-vl]  IMAGE [../shared/assets/images/coffee.jpg]
#   TEMPLATE [chatml] (the benchmark model has none of its own)  PYTHON [/usr/bin/python3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
CONCURRENCY=${CONCURRENCY:-8}
REQUESTS=${REQUESTS:-16}
SINGLE_REQUESTS=${SINGLE_REQUESTS:-4}
MAX_TOKENS=${MAX_TOKENS:-64}
PROMPT_WORDS=${PROMPT_WORDS:-30}
ROUNDS=${ROUNDS:-2}
MODEL=${MODEL:-bench/models/bench25m-qwen2-vl}
IMAGE=${IMAGE:-../shared/assets/images/coffee.jpg}
PYTHON=${PYTHON:-/usr/bin/python3}
TEMPLATE=${TEMPLATE:-chatml}
BIN=$BUILD_DIR/bin/swiftcpp
[[ -x $BIN ]] || { echo "error: $BIN not found (cmake --build $BUILD_DIR --target swiftcpp)" >&2; exit 1; }
[[ -f $IMAGE ]] || { echo "error: $IMAGE not found (../shared/assets is needed)" >&2; exit 1; }
command -v node > /dev/null || { echo "error: node not found (scripts/setup.sh installs it)" >&2; exit 1; }
[[ -f $MODEL/config.json ]] || "$PYTHON" scripts/make_bench_qwen2_vl.py --out "$MODEL" >&2
# Every side runs with the same BLAS settings (../shared/docs/BENCHMARKS.md).
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

OUT=bench/results/serve-images-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    echo "model: $MODEL, image: $IMAGE, threads: $THREADS, rounds: $ROUNDS"
    echo "requests: $SINGLE_REQUESTS at 1 stream, $REQUESTS at $CONCURRENCY streams; $MAX_TOKENS new tokens, ~$PROMPT_WORDS words"
} > "$OUT/machine.txt"

"$BIN" --threads "$THREADS" deploy --model "$MODEL" --template "$TEMPLATE" --port 0 --parallel "$CONCURRENCY" --max-queue 64 \
    2> "$OUT/deploy.log" &
SERVER=$!
trap 'kill $SERVER 2> /dev/null || true' EXIT
PORT=
for _ in $(seq 600); do
    kill -0 "$SERVER" 2> /dev/null || { echo "error: deploy exited:" >&2; cat "$OUT/deploy.log" >&2; exit 1; }
    PORT=$(grep -o 'listening on http://[^:]*:[0-9]*' "$OUT/deploy.log" | grep -o '[0-9]*$' || true)
    [[ -n $PORT ]] && curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 || { echo "error: deploy did not start:" >&2; cat "$OUT/deploy.log" >&2; exit 1; }
URL=http://127.0.0.1:$PORT

for r in $(seq "$ROUNDS"); do
    for streams in 1 "$CONCURRENCY"; do
        n=$SINGLE_REQUESTS
        [[ $streams == 1 ]] || n=$REQUESTS
        for side in text image; do
            echo "round $r/$ROUNDS: $streams stream(s), $side" >&2
            extra=(--chat 1)
            [[ $side == image ]] && extra=(--image "$IMAGE")
            node bench/serve_load.mjs --url "$URL" --concurrency "$streams" --requests "$n" --max-tokens "$MAX_TOKENS" \
                --prompt-words "$PROMPT_WORDS" "${extra[@]}" > "$OUT/$side.c$streams.r$r.json"
            echo "$side c$streams r$r $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"
        done
    done
done

"$PYTHON" - "$OUT" <<'EOF' | tee "$OUT/table.md"
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {}
for p in sorted(out.glob("*.json")):
    side, streams, rnd = p.stem.split(".")
    runs[(side, int(streams[1:]), int(rnd[1:]))] = json.loads(p.read_text())
print("| streams | text tokens/s | image tokens/s | image / text (per round) | median | TTFT p50 text / image (ms) |")
print("|---|---|---|---|---|---|")
for streams in sorted({k[1] for k in runs}):
    rounds = sorted({k[2] for k in runs if k[1] == streams})
    text = [runs[("text", streams, r)]["tokens_per_s"] for r in rounds]
    image = [runs[("image", streams, r)]["tokens_per_s"] for r in rounds]
    ratios = [i / t for i, t in zip(image, text)]
    ttft = lambda side: statistics.median(runs[(side, streams, r)]["ttft_p50_ms"] for r in rounds)
    print(f"| {streams} | {', '.join(f'{x:.1f}' for x in text)} | {', '.join(f'{x:.1f}' for x in image)} "
          f"| {', '.join(f'{x:.2f}' for x in ratios)} | **{statistics.median(ratios):.2f}x** "
          f"| {ttft('text'):.0f} / {ttft('image'):.0f} |")
EOF
