#!/usr/bin/env bash
# swiftcpp training benchmark: swiftcpp vs the PyTorch eager baseline, back to back, on the same machine and data.
#
#   bash bench/run_train.sh      (after: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target swiftcpp bench -j)
#
# For each case of the matrix mode {lora, full} x batching {padding, packing} x dtype {float32, bf16}:
#   1. build/bin/swiftcpp_bench_train trains bench25m (batch 4 x 512, 3 warm-up + 10 timed steps, RUNS runs) and
#      writes the micro-batches it used (JSON Lines) and, in LoRA mode, its LoRA init adapter (PEFT layout);
#   2. bench/baseline_train.py trains the same model on the same batches from the same adapter with PyTorch eager
#      (the measurement contract is the docstring of bench/baseline_train.py; both programs follow it);
# then bench/report_train.py prints a markdown table: tokens/s, ratio, peak RSS, FLOP/s against the measured
# matmul ceiling, the largest relative loss difference between the two programs (they must train the same thing),
# and bf16/float32 speed ratios. Raw JSON, logs, batches, adapters and the report go to
# bench/results/train-<UTC timestamp>/. bench/models/bench25m is generated first if missing.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3]  THREADS [2]  WARMUP [3]  STEPS [10]  BATCH [4]  SEQ [512]  DATA_SEED [0]
#   MODEL [bench/models/bench25m]
#   CASES [all 8]  space-separated subset of MODE-BATCHING-DTYPE names, e.g. "lora-padding-float32 full-packing-bf16"
#   BF16_BASELINE [short]  how the PyTorch baseline runs the bf16 cases. Debian's torch 1.13 has no fast CPU bf16
#       matmul without AVX512-BF16 (it falls back to a scalar kernel, about 1 GFLOP/s: minutes per 4 x 512 step),
#       so by default both programs run the bf16 cases as 1 warm-up + 1 timed step, 1 run (the report says so on
#       those rows; swiftcpp uses the same LibTorch kernels and is as slow there); "full" runs the
#       same protocol as float32 (hours), "skip" runs no bf16 baseline.
#   On the 2-core dev machine the baseline alone takes roughly 25 min for the four float32 cases (3 runs) and
#   40 min for the four bf16 cases (short); use CASES and BF16_BASELINE=skip for a quicker pass.
#   GEMM [both]  swiftcpp's float32 products: auto (oneDNN's sgemm where the build has it), libtorch (at::mm, the
#       OpenBLAS sgemm PyTorch uses), or both: each case runs swiftcpp a second time with libtorch's products and the
#       report adds its ratio, which isolates what the kernel choice is worth from the rest
#   PYTHON [/usr/bin/python3]  (Debian's interpreter, which has python3-torch)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
WARMUP=${WARMUP:-3}
STEPS=${STEPS:-10}
BATCH=${BATCH:-4}
SEQ=${SEQ:-512}
DATA_SEED=${DATA_SEED:-0}
MODEL=${MODEL:-bench/models/bench25m}
ALL_CASES="lora-padding-float32 lora-padding-bf16 lora-packing-float32 lora-packing-bf16"
ALL_CASES+=" full-padding-float32 full-padding-bf16 full-packing-float32 full-packing-bf16"
CASES=${CASES:-$ALL_CASES}
BF16_BASELINE=${BF16_BASELINE:-short}
GEMM=${GEMM:-both}
case $GEMM in
    auto | libtorch | both) ;;
    *) echo "error: GEMM must be auto, libtorch or both (got '$GEMM')" >&2; exit 1 ;;
esac
PYTHON=${PYTHON:-/usr/bin/python3}
BENCH_MODEL=bench/models/bench25m

BENCH_BIN=$BUILD_DIR/bin/swiftcpp_bench_train
if [[ ! -x $BENCH_BIN ]]; then
    echo "error: $BENCH_BIN not found. Build first:" >&2
    echo "  cmake -S . -B $BUILD_DIR -DCMAKE_BUILD_TYPE=Release && cmake --build $BUILD_DIR --target swiftcpp bench -j" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import torch, numpy' 2>/dev/null; then
    echo "error: $PYTHON cannot import torch and numpy (install Debian's python3-torch, or set PYTHON)" >&2
    exit 1
fi
case $BF16_BASELINE in
    short | full | skip) ;;
    *) echo "error: BF16_BASELINE must be short, full or skip (got '$BF16_BASELINE')" >&2; exit 1 ;;
esac
for c in $CASES; do
    IFS=- read -r mode batching dtype extra <<<"$c"
    if [[ -n ${extra:-} || ! $mode =~ ^(lora|full)$ || ! $batching =~ ^(padding|packing)$ ||
          ! $dtype =~ ^(float32|bf16)$ ]]; then
        echo "error: unknown case '$c' (MODE-BATCHING-DTYPE; one of: $ALL_CASES)" >&2
        exit 1
    fi
done

if [[ $MODEL == "$BENCH_MODEL" && ! -f $MODEL/config.json ]]; then
    echo "generating $MODEL ..." >&2
    "$PYTHON" scripts/make_bench_model.py --out "$MODEL" >&2
fi
if [[ ! -f $MODEL/config.json || ! -f $MODEL/model.safetensors ]]; then
    echo "error: $MODEL is not a checkpoint folder (config.json + model.safetensors)" >&2
    exit 1
fi

# Same thread count for both programs (OpenMP and OpenBLAS pools; both also set it explicitly).
export OMP_NUM_THREADS=$THREADS
export OPENBLAS_NUM_THREADS=$THREADS

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/train-$STAMP
mkdir -p "$OUT"

fail() {  # fail NAME LOG
    echo "error: $1 failed; see $2" >&2
    tail -n 20 "$2" >&2 || true
    exit 1
}

REPORT_ARGS=()
for c in $CASES; do
    IFS=- read -r mode batching dtype <<<"$c"
    batches=$OUT/$c.batches.jsonl
    adapter=$OUT/$c.adapter
    sw=$OUT/$c.swiftcpp.json
    proto=(--warmup "$WARMUP" --steps "$STEPS" --runs "$RUNS")
    if [[ $dtype == bf16 && $BF16_BASELINE == short ]]; then
        proto=(--warmup 1 --steps 1 --runs 1)  # both programs: LibTorch's bf16 matmul is the same slow kernel
    fi
    cmd=("$BENCH_BIN" --model "$MODEL" --mode "$mode" --dtype "$dtype" --batching "$batching" --batch "$BATCH"
         --seq "$SEQ" "${proto[@]}" --threads "$THREADS" --data-seed "$DATA_SEED" --write-batches "$batches"
         --gemm "$([[ $GEMM == libtorch ]] && echo libtorch || echo auto)")
    if [[ $mode == lora ]]; then
        cmd+=(--write-init-adapter "$adapter")
    fi
    echo "[$c] swiftcpp: ${cmd[*]}" >&2
    "${cmd[@]}" >"$sw" 2>"$OUT/$c.swiftcpp.log" || fail "swiftcpp_bench_train ($c)" "$OUT/$c.swiftcpp.log"
    if [[ ! -s $batches ]]; then
        echo "error: swiftcpp_bench_train did not write $batches" >&2
        exit 1
    fi
    if [[ $mode == lora && ! -f $adapter/adapter_model.safetensors ]]; then
        echo "error: swiftcpp_bench_train did not write the LoRA init adapter $adapter/" >&2
        exit 1
    fi

    if [[ $GEMM == both ]]; then
        # The same command with --gemm libtorch, writing its batches and adapter aside (identical: same seeds).
        ob=("${cmd[@]}")
        for ((i = 0; i + 1 < ${#ob[@]}; i++)); do
            case ${ob[i]} in
                --gemm) ob[i + 1]=libtorch ;;
                --write-batches) ob[i + 1]=$OUT/$c.openblas.batches.jsonl ;;
                --write-init-adapter) ob[i + 1]=$OUT/$c.openblas.adapter ;;
            esac
        done
        echo "[$c] swiftcpp, OpenBLAS products: ${ob[*]}" >&2
        "${ob[@]}" >"$OUT/$c.swiftcpp-openblas.json" 2>"$OUT/$c.swiftcpp-openblas.log" ||
            fail "swiftcpp_bench_train --gemm libtorch ($c)" "$OUT/$c.swiftcpp-openblas.log"
        REPORT_ARGS+=(--openblas "$c" "$OUT/$c.swiftcpp-openblas.json")
    fi

    base=$OUT/$c.pytorch-eager.json
    if [[ $dtype == bf16 && $BF16_BASELINE == skip ]]; then
        base=-
    else
        bcmd=("$PYTHON" bench/baseline_train.py --model "$MODEL" --batches "$batches" --mode "$mode"
              --dtype "$dtype" --threads "$THREADS" "${proto[@]}")
        if [[ $mode == lora ]]; then
            bcmd+=(--adapter "$adapter")
        fi
        echo "[$c] pytorch-eager: ${bcmd[*]}" >&2
        "${bcmd[@]}" >"$base" 2>"$OUT/$c.pytorch-eager.log" || fail "baseline_train.py ($c)" "$OUT/$c.pytorch-eager.log"
    fi
    REPORT_ARGS+=(--case "$c" "$sw" "$base")
done

# Spell out every setting so the line reproduces the run.
CMD="BUILD_DIR=$BUILD_DIR RUNS=$RUNS THREADS=$THREADS WARMUP=$WARMUP STEPS=$STEPS BATCH=$BATCH SEQ=$SEQ"
CMD+=" DATA_SEED=$DATA_SEED MODEL=$MODEL BF16_BASELINE=$BF16_BASELINE GEMM=$GEMM"
if [[ $CASES != "$ALL_CASES" ]]; then
    CMD+=" CASES='$CASES'"
fi
CMD+=" bash bench/run_train.sh"

rc=0
"$PYTHON" bench/report_train.py --command "$CMD" "${REPORT_ARGS[@]}" | tee "$OUT/report.md" || rc=$?
# report_train.py exits 2 when the two programs' losses differ beyond tolerance (a warning, printed in the
# report); anything else is an error.
if [[ $rc -ne 0 && $rc -ne 2 ]]; then
    exit "$rc"
fi
echo "" >&2
echo "raw results: $OUT/" >&2
