#!/usr/bin/env bash
# swiftcpp image input benchmark: decode (libjpeg-turbo / libpng) + preprocessing of the five real images in
# ../shared/assets/images on THREADS threads, and preprocessing alone, DURATION seconds each, for every processor
# setting of SETTINGS: CLIPImageProcessor at SIZE (LLaVA-1.5) and Qwen2VLImageProcessor at each max_pixels of
# QWEN_MAX_PIXELS (min_pixels QWEN_MIN_PIXELS). The settings alternate, ROUNDS rounds of one measurement each
# (A B C A B C ...), so their ratios are taken side by side. Builds nothing; prints the raw JSON lines and a
# markdown table for docs/benchmarks.md (bench/report_image.py); both go to bench/results/image-<UTC timestamp>/.
#
#   bash bench/run_image.sh      (after: cmake --build build --target swiftcpp_bench_image)
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  THREADS [2]  DURATION [5] (seconds per measurement)  ROUNDS [3]  SIZE [336]
#   QWEN_MAX_PIXELS ["200704 1003520"] (256 tokens; the class default, 1280 tokens)  QWEN_MIN_PIXELS [3136]
#   SETTINGS ["clip qwen2_vl"]  IMAGES [../shared/assets/images]  PYTHON [/usr/bin/python3] (for the table)
# No Python baseline: transformers and Pillow are not installed here (what a user would run is transformers'
# Qwen2VLImageProcessor on Pillow; tests/unit holds the bit-exact comparison with its output).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
SECONDS_EACH=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-336}
QWEN_MAX_PIXELS=${QWEN_MAX_PIXELS:-200704 1003520}
QWEN_MIN_PIXELS=${QWEN_MIN_PIXELS:-3136}
SETTINGS=${SETTINGS:-clip qwen2_vl}
IMAGES=${IMAGES:-../shared/assets/images}
PYTHON=${PYTHON:-/usr/bin/python3}

BENCH_BIN=$BUILD_DIR/bin/swiftcpp_bench_image
if [[ ! -x $BENCH_BIN ]]; then
    echo "error: $BENCH_BIN not found. Build first: cmake --build $BUILD_DIR --target swiftcpp_bench_image" >&2
    exit 1
fi
if [[ ! -d $IMAGES ]]; then
    echo "error: $IMAGES not found (the ../shared assets)" >&2
    exit 1
fi
for v in THREADS ROUNDS SIZE QWEN_MIN_PIXELS; do
    if [[ ! ${!v} =~ ^[1-9][0-9]*$ ]]; then
        echo "error: $v must be a positive integer (got '${!v}')" >&2
        exit 1
    fi
done
for p in $QWEN_MAX_PIXELS; do
    if [[ ! $p =~ ^[1-9][0-9]*$ ]]; then
        echo "error: QWEN_MAX_PIXELS must hold positive integers (got '$p')" >&2
        exit 1
    fi
done

# The measurements of one round, each a list of arguments.
runs=()
for s in $SETTINGS; do
    case $s in
        clip) runs+=("--processor clip --size $SIZE") ;;
        qwen2_vl)
            for p in $QWEN_MAX_PIXELS; do
                runs+=("--processor qwen2_vl --min-pixels $QWEN_MIN_PIXELS --max-pixels $p")
            done ;;
        *) echo "error: unknown setting '$s' (clip or qwen2_vl)" >&2; exit 1 ;;
    esac
done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/image-$STAMP
mkdir -p "$OUT"

for ((round = 1; round <= ROUNDS; ++round)); do
    for r in "${runs[@]}"; do
        echo "[round $round] $BENCH_BIN --images $IMAGES --threads $THREADS --seconds $SECONDS_EACH $r" >&2
        # shellcheck disable=SC2086  # r is a list of arguments
        json=$("$BENCH_BIN" --images "$IMAGES" --threads "$THREADS" --seconds "$SECONDS_EACH" $r 2>>"$OUT/log")
        echo "$json" | tee -a "$OUT/results.jsonl"
    done
done

"$PYTHON" bench/report_image.py "$OUT/results.jsonl" | tee "$OUT/report.md"
echo "(raw results and logs: $OUT)" >&2
