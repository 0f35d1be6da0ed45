#!/usr/bin/env bash
# swiftcpp vision-language training benchmark: a LLaVA and a Qwen2-VL training step (real Trainer::step) split
# into vision tower, projector / merger and language model, side by side at the same token count, with a count of
# how often the tower ran per step. Builds nothing.
#
#   bash bench/run_mm_train.sh      (after: cmake --build build --target swiftcpp_bench_mm_train)
#
# Generates the benchmark models when missing: bench/models/bench25m-llava (scripts/make_bench_llava.py:
# bench25m's language model, a CLIP tower at 336 px with 576 patches) and bench/models/bench25m-qwen2-vl
# (scripts/make_bench_qwen2_vl.py: bench25m's language model as Qwen2, a Qwen2-VL tower of the CLIP tower's width
# and depth, its image processor set so that each test image takes 576-580 tokens), random weights. Then runs
# build/bin/swiftcpp_bench_mm_train once per round, case and model, alternating the models within each round
# (for each round: for each case: for each model), so their ratios are taken side by side:
#   frozen   LoRA r 16 / alpha 32 on the language model, projector / merger trained in full, tower frozen
#   trained  the same with the tower trained in full (freeze_vit false)
# Each of the RUNS rounds is one model load with WARMUP warm-up steps, STEPS timed steps and PROFILED_STEPS
# profiled steps spread among them; B = BATCH samples a step, one real image each, every sample SAMPLE_TOKENS
# long (how the batches are made and how the split is measured: the header of bench/bench_mm_train.cpp).
# bench/report_mm_train.py prints the markdown tables for docs/benchmarks.md, with each model's step time and
# split against the first model's as the median of the per-round ratios; raw JSON, per-step logs and the tables
# go to bench/results/mm-train-<UTC timestamp>/.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3] (rounds)  THREADS [2]  WARMUP [3]  STEPS [10]  PROFILED_STEPS [4]  BATCH [4]
#   SAMPLE_TOKENS [640]  CASES ["frozen trained"]
#   MODELS ["bench/models/bench25m-llava bench/models/bench25m-qwen2-vl"] (the first is the reference)
#   MIN_PIXELS, MAX_PIXELS [unset] (override the Qwen2-VL models' image processor bounds)
#   IMAGES [../shared/assets/images]  TOP_OPS [0] (N > 0: each log also lists the N ops with the most self time
#   in each part)  PYTHON [/usr/bin/python3] (for the model generators and the tables; needs numpy)
# On the 2-core dev machine, idle, a round takes about 6 minutes with the defaults (LLaVA about 1 minute a case,
# Qwen2-VL 1.5 frozen and 3 trained). Other processes on the cores slow the OpenMP threads down by far more than
# their share (a busy machine measured 10-20x slower steps), so the tables record the load average at the start
# and end of each process.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
WARMUP=${WARMUP:-3}
STEPS=${STEPS:-10}
PROFILED_STEPS=${PROFILED_STEPS:-4}
BATCH=${BATCH:-4}
SAMPLE_TOKENS=${SAMPLE_TOKENS:-640}
CASES=${CASES:-frozen trained}
MODELS=${MODELS:-bench/models/bench25m-llava bench/models/bench25m-qwen2-vl}
MIN_PIXELS=${MIN_PIXELS:-}
MAX_PIXELS=${MAX_PIXELS:-}
IMAGES=${IMAGES:-../shared/assets/images}
TOP_OPS=${TOP_OPS:-0}
PYTHON=${PYTHON:-/usr/bin/python3}

BENCH_BIN=$BUILD_DIR/bin/swiftcpp_bench_mm_train
if [[ ! -x $BENCH_BIN ]]; then
    echo "error: $BENCH_BIN not found. Build first: cmake --build $BUILD_DIR --target swiftcpp_bench_mm_train" >&2
    exit 1
fi
for v in RUNS THREADS STEPS PROFILED_STEPS BATCH SAMPLE_TOKENS; do
    if [[ ! ${!v} =~ ^[1-9][0-9]*$ ]]; then
        echo "error: $v must be a positive integer (got '${!v}')" >&2
        exit 1
    fi
done
for v in WARMUP TOP_OPS; do
    if [[ ! ${!v} =~ ^[0-9]+$ ]]; then
        echo "error: $v must be a non-negative integer (got '${!v}')" >&2
        exit 1
    fi
done
for v in MIN_PIXELS MAX_PIXELS; do
    if [[ -n ${!v} && ! ${!v} =~ ^[1-9][0-9]*$ ]]; then
        echo "error: $v must be a positive integer or unset (got '${!v}')" >&2
        exit 1
    fi
done
for c in $CASES; do
    if [[ ! $c =~ ^(frozen|trained)$ ]]; then
        echo "error: unknown case '$c' (frozen or trained)" >&2
        exit 1
    fi
done
if [[ ! -d $IMAGES ]]; then
    echo "error: $IMAGES not found (the five test images of the shared assets, ../shared next to this checkout)" >&2
    exit 1
fi

declare -A GENERATOR=([bench/models/bench25m-llava]=scripts/make_bench_llava.py
                      [bench/models/bench25m-qwen2-vl]=scripts/make_bench_qwen2_vl.py)
names=()
for m in $MODELS; do
    m=${m%/}
    if [[ -n ${GENERATOR[$m]:-} && ! -f $m/config.json ]]; then
        echo "generating $m ..." >&2
        "$PYTHON" "${GENERATOR[$m]}" --out "$m" >&2
    fi
    if [[ ! -f $m/config.json || ! -f $m/model.safetensors || ! -f $m/preprocessor_config.json ]]; then
        echo "error: $m is not a vision-language checkpoint folder (config.json, model.safetensors," \
             "preprocessor_config.json)" >&2
        exit 1
    fi
    name=$(basename "$m")
    for n in "${names[@]}"; do
        if [[ $n == "$name" ]]; then
            echo "error: two models named $name in MODELS" >&2
            exit 1
        fi
    done
    names+=("$name")
done

export OMP_NUM_THREADS=$THREADS
export OPENBLAS_NUM_THREADS=$THREADS

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/mm-train-$STAMP
mkdir -p "$OUT"

for ((round = 1; round <= RUNS; ++round)); do
    for c in $CASES; do
        for m in $MODELS; do
            m=${m%/}
            args=(--model "$m" --images "$IMAGES" --batch "$BATCH" --warmup "$WARMUP" --steps "$STEPS"
                  --profiled-steps "$PROFILED_STEPS" --runs 1 --threads "$THREADS" --sample-tokens "$SAMPLE_TOKENS"
                  --top-ops "$TOP_OPS")
            [[ $c == trained ]] && args+=(--train-vit)
            if grep -q '"Qwen2VLImageProcessor"' "$m/preprocessor_config.json"; then
                [[ -n $MIN_PIXELS ]] && args+=(--min-pixels "$MIN_PIXELS")
                [[ -n $MAX_PIXELS ]] && args+=(--max-pixels "$MAX_PIXELS")
            fi
            base=$OUT/$(basename "$m").$c.r$round
            echo "[round $round/$RUNS, $c] $BENCH_BIN ${args[*]}" >&2
            cut -d' ' -f1-3 /proc/loadavg >"$base.load-start"
            if ! "$BENCH_BIN" "${args[@]}" >"$base.json" 2>"$base.log"; then
                echo "error: $BENCH_BIN failed for $m, case $c; see $base.log" >&2
                tail -n 20 "$base.log" >&2 || true
                exit 1
            fi
            cut -d' ' -f1-3 /proc/loadavg >"$base.load-end"
        done
    done
done

"$PYTHON" bench/report_mm_train.py "$OUT" --models "${names[@]}" --cases $CASES --rounds "$RUNS" |
    tee "$OUT/report.md"
echo "(raw results and logs: $OUT)" >&2
