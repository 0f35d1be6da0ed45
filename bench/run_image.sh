#!/usr/bin/env bash
# swiftcpp image input benchmark: decode (libjpeg-turbo / libpng) + CLIPImageProcessor preprocessing of the five
# real images in ../shared/assets/images on THREADS threads, and preprocessing alone, DURATION seconds each.
# Builds nothing; prints the raw JSON line and one markdown row for docs/benchmarks.md.
#
#   bash bench/run_image.sh      (after: cmake --build build --target swiftcpp_bench_image)
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  THREADS [2]  DURATION [5] (seconds per measurement)  SIZE [336]  IMAGES [../shared/assets/images]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
SECONDS_EACH=${DURATION:-5}
SIZE=${SIZE:-336}
IMAGES=${IMAGES:-../shared/assets/images}

BENCH_BIN=$BUILD_DIR/bin/swiftcpp_bench_image
if [[ ! -x $BENCH_BIN ]]; then
    echo "error: $BENCH_BIN not found. Build first: cmake --build $BUILD_DIR --target swiftcpp_bench_image" >&2
    exit 1
fi
if [[ ! -d $IMAGES ]]; then
    echo "error: $IMAGES not found (the ../shared assets)" >&2
    exit 1
fi

echo "$BENCH_BIN --images $IMAGES --threads $THREADS --seconds $SECONDS_EACH --size $SIZE" >&2
json=$("$BENCH_BIN" --images "$IMAGES" --threads "$THREADS" --seconds "$SECONDS_EACH" --size "$SIZE")
echo "$json"
# One markdown row: | threads | size | decode + preprocess images/s | preprocess images/s |
# (nlohmann's dump() writes the keys sorted, so they come in this order.)
pattern='.*"decode_preprocess_images_per_s":([0-9.e+-]+).*"preprocess_images_per_s":([0-9.e+-]+)'
pattern+='.*"size":([0-9]+).*"threads":([0-9]+).*'
echo "$json" | sed -E "s/$pattern/\\4 \\3 \\1 \\2/" | awk '{ printf "| %d | %d | %.1f | %.1f |\n", $1, $2, $3, $4 }'
