#!/usr/bin/env bash
# swiftcpp tokenizer benchmark: encodes every instruction, input and output of the Alpaca demo set with GPT-2's
# byte-level BPE tokenizer.json, on 1 and 2 threads, and prints tokens/s (median of RUNS repetitions).
#
#   bash bench/run_tokenizer.sh      (after: cmake --build build --target swiftcpp_bench_tokenizer)
#
# "cold" times a freshly loaded tokenizer (every distinct pre-token merged once, loading not timed); "warm"
# times the same tokenizer after one untimed pass (pre-tokens from the cache). There is no Python baseline:
# Hugging Face tokenizers is not a Debian package.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3]  THREADS [1,2]
#   TOKENIZER [../shared/assets/tokenizers/gpt2]  DATA [../shared/assets/data/sft/alpaca_en_demo.json]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-1,2}
TOKENIZER=${TOKENIZER:-../shared/assets/tokenizers/gpt2}
DATA=${DATA:-../shared/assets/data/sft/alpaca_en_demo.json}

BENCH_BIN=$BUILD_DIR/bin/swiftcpp_bench_tokenizer
if [[ ! -x $BENCH_BIN ]]; then
    echo "error: $BENCH_BIN not found. Build first:" >&2
    echo "  cmake -S . -B $BUILD_DIR -DCMAKE_BUILD_TYPE=Release && cmake --build $BUILD_DIR --target swiftcpp_bench_tokenizer" >&2
    exit 1
fi
for f in "$TOKENIZER" "$DATA"; do
    if [[ ! -e $f ]]; then
        echo "error: $f not found (the ../shared assets)" >&2
        exit 1
    fi
done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/$STAMP
mkdir -p "$OUT"
echo "$BENCH_BIN --tokenizer $TOKENIZER --data $DATA --threads $THREADS --runs $RUNS" >&2
"$BENCH_BIN" --tokenizer "$TOKENIZER" --data "$DATA" --threads "$THREADS" --runs "$RUNS" \
    >"$OUT/tokenizer.json" 2>"$OUT/tokenizer.log" || { cat "$OUT/tokenizer.log" >&2; exit 1; }
cat "$OUT/tokenizer.log"
echo "" >&2
echo "raw results: $OUT/tokenizer.json" >&2
