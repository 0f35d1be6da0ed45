#!/usr/bin/env bash
# Two builds of swiftcpp side by side: does a change of compiler flags, headers or build layout change how fast the
# program runs? Alternating rounds (A B A B ...) of the same three measurements on bench25m:
#   train    swiftcpp_bench_train: LoRA, float32, padding, batch 4 x 512, 2 warm-up + 5 timed steps (tokens/s)
#   decode1  swiftcpp_bench_infer: prompt 128, 128 new tokens, batch 1, 5 runs (prefill and decode tokens/s, medians)
#   decode8  swiftcpp_bench_infer: prompt 128, 64 new tokens, batch 8, 3 runs
# then bench/report_builds.py prints, per measurement, each side's median and the median of the per-round ratios.
#
#   bash bench/run_builds.sh OLD_BIN NEW_BIN
#
# OLD_BIN and NEW_BIN are folders holding swiftcpp_bench_train and swiftcpp_bench_infer (a build's bin/, or a copy
# of it made before rebuilding: `cp -r build/bin /tmp/old-bin`). Build them with
# `cmake --build build --target swiftcpp_bench_train swiftcpp_bench_infer`.
# Knobs: ROUNDS [5]  THREADS [2]  MODEL [bench/models/bench25m, generated when missing]  PYTHON [/usr/bin/python3]
# Results (JSON per side and round, the load after each, the machine) go to bench/results/builds-<UTC timestamp>/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[[ $# -eq 2 ]] || { echo "usage: bash bench/run_builds.sh OLD_BIN NEW_BIN" >&2; exit 2; }
OLD=$1
NEW=$2
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
MODEL=${MODEL:-bench/models/bench25m}
PYTHON=${PYTHON:-/usr/bin/python3}
for d in "$OLD" "$NEW"; do
    for b in swiftcpp_bench_train swiftcpp_bench_infer; do
        [[ -x $d/$b ]] || { echo "error: $d/$b not found (cmake --build BUILD --target $b)" >&2; exit 1; }
    done
done
[[ -f $MODEL/config.json ]] || "$PYTHON" scripts/make_bench_model.py --out "$MODEL" >&2
# Every side runs with the same BLAS settings (../shared/docs/BENCHMARKS.md).
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

OUT=bench/results/builds-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    echo "old: $OLD"
    echo "new: $NEW"
    echo "rounds: $ROUNDS, threads: $THREADS, model: $MODEL"
} > "$OUT/machine.txt"

for r in $(seq "$ROUNDS"); do
    for side in old new; do
        bin=$OLD
        [[ $side == new ]] && bin=$NEW
        echo "round $r/$ROUNDS: $side" >&2
        "$bin/swiftcpp_bench_train" --model "$MODEL" --mode lora --dtype float32 --batching padding --batch 4 \
            --seq 512 --warmup 2 --steps 5 --threads "$THREADS" --runs 1 > "$OUT/train.$side.r$r.json"
        "$bin/swiftcpp_bench_infer" --model "$MODEL" --prompt-len 128 --new-tokens 128 --batch 1 \
            --threads "$THREADS" --runs 5 > "$OUT/decode1.$side.r$r.json"
        "$bin/swiftcpp_bench_infer" --model "$MODEL" --prompt-len 128 --new-tokens 64 --batch 8 \
            --threads "$THREADS" --runs 3 > "$OUT/decode8.$side.r$r.json"
        echo "round $r $side load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"
    done
done
"$PYTHON" bench/report_builds.py "$OUT" | tee "$OUT/report.md"
