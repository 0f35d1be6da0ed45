#!/usr/bin/env bash
# ChunkFlow benchmark: peak memory against the longest sequence and tokens/s of padding, packing and ChunkFlow on
# long-tail workloads, all measured in one run of build/bin/swiftcpp_bench_chunkflow (bench25m, LoRA r16 on all
# linear layers, AdamW, 2 threads).
#
#   bash bench/run_chunkflow.sh      (after: cmake -S . -B build -G Ninja && cmake --build build --target swiftcpp bench)
#
# 1. memory: one sequence of 2C, 4C, 8C, 16C tokens (C = CHUNK), one LoRA step unchunked and with ChunkFlow
#    (C, KEEP); peak tensor memory through the counting allocator; chart at $OUT/memory.svg.
# 2. throughput, for each mix in MIXES: GLOBAL_BATCH sequences per optimizer step drawn from LONG_CONTEXT.md's
#    length distribution, lengths divided by SCALE and capped at MAX_LENGTH; padding in micro-batches of MICRO,
#    packing into rows of MAX_LENGTH, ChunkFlow with (TP_CHUNK, TP_KEEP); WARMUP untimed + STEPS timed steps each,
#    on the same batches, each mode in its own process.
# bench/report_chunkflow.py turns the JSON into the markdown tables of docs/benchmarks.md.
#
# Knobs [defaults]: BUILD_DIR [build] MODEL [bench/models/bench25m] THREADS [2] CHUNK [256] KEEP [1]
#   MULTIPLES ["2 4 8 16"] MIXES ["lmsys chatqa2"] SCALE [16] MAX_LENGTH [4096] GLOBAL_BATCH_lmsys [128]
#   GLOBAL_BATCH_chatqa2 [8] GLOBAL_BATCH_wikipedia [128] MICRO [4] TP_CHUNK [512] TP_KEEP [1] WARMUP [1]
#   STEPS [3] MODES ["padding packing chunkflow"] SKIP_MEMORY [0] PYTHON [/usr/bin/python3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
MODEL=${MODEL:-bench/models/bench25m}
THREADS=${THREADS:-2}
CHUNK=${CHUNK:-256}
KEEP=${KEEP:-1}
MULTIPLES=${MULTIPLES:-2 4 8 16}
MIXES=${MIXES:-lmsys chatqa2}
SCALE=${SCALE:-16}
MAX_LENGTH=${MAX_LENGTH:-4096}
MICRO=${MICRO:-4}
TP_CHUNK=${TP_CHUNK:-512}
TP_KEEP=${TP_KEEP:-1}
WARMUP=${WARMUP:-1}
STEPS=${STEPS:-3}
SKIP_MEMORY=${SKIP_MEMORY:-0}
MODES=${MODES:-padding packing chunkflow}
PYTHON=${PYTHON:-/usr/bin/python3}

BIN=$BUILD_DIR/bin/swiftcpp_bench_chunkflow
if [[ ! -x $BIN ]]; then
    echo "error: $BIN not found; build first: cmake -S . -B $BUILD_DIR -G Ninja && cmake --build $BUILD_DIR --target swiftcpp bench" >&2
    exit 1
fi
if [[ $MODEL == bench/models/bench25m && ! -f $MODEL/config.json ]]; then
    echo "generating $MODEL ..." >&2
    "$PYTHON" scripts/make_bench_model.py --out "$MODEL" >&2
fi
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS

OUT=bench/results/chunkflow-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
FILES=()
if [[ $SKIP_MEMORY != 1 ]]; then
    read -r -a mult <<<"$MULTIPLES"
    cmd=("$BIN" --model "$MODEL" --threads "$THREADS" memory --chunk-size "$CHUNK" --keep "$KEEP" --multiples "${mult[@]}"
         --plot "$OUT/memory.svg")
    echo "[memory] ${cmd[*]}" >&2
    "${cmd[@]}" >"$OUT/memory.json" 2> >(tee "$OUT/memory.log" >&2)
    FILES+=("$OUT/memory.json")
fi
for mix in $MIXES; do
    var=GLOBAL_BATCH_$mix
    default=128
    [[ $mix == chatqa2 ]] && default=8
    gb=${!var:-$default}
    # One process per mode, back to back: a mode never inherits another's heap.
    for mode in $MODES; do
        cmd=("$BIN" --model "$MODEL" --threads "$THREADS" throughput --mix "$mix" --scale "$SCALE"
             --max-length "$MAX_LENGTH" --global-batch "$gb" --micro-batch "$MICRO" --chunk-size "$TP_CHUNK"
             --keep "$TP_KEEP" --warmup "$WARMUP" --steps "$STEPS" --modes "$mode")
        echo "[throughput $mix $mode] ${cmd[*]}" >&2
        "${cmd[@]}" >"$OUT/throughput-$mix-$mode.json" 2> >(tee "$OUT/throughput-$mix-$mode.log" >&2)
        FILES+=("$OUT/throughput-$mix-$mode.json")
    done
done
CMD="CHUNK=$CHUNK KEEP=$KEEP MULTIPLES='$MULTIPLES' MIXES='$MIXES' SCALE=$SCALE MAX_LENGTH=$MAX_LENGTH MICRO=$MICRO"
CMD+=" TP_CHUNK=$TP_CHUNK TP_KEEP=$TP_KEEP WARMUP=$WARMUP STEPS=$STEPS SKIP_MEMORY=$SKIP_MEMORY bash bench/run_chunkflow.sh"
"$PYTHON" bench/report_chunkflow.py --command "$CMD" "${FILES[@]}" | tee "$OUT/report.md"
echo "raw results: $OUT/" >&2
