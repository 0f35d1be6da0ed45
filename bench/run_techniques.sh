#!/usr/bin/env bash
# `swiftcpp bench` on bench25m: every training technique (lora, dora, qlora, full, packing, chunkflow, bf16,
# gradient_checkpointing) trained STEPS steps on bench/bench25m_sft.yaml, each in its own process; the table that
# docs/cli.md quotes goes to stdout.
#
#   bash bench/run_techniques.sh      (after: cmake --build build --target swiftcpp)
#
# bench/models/bench25m is generated when missing (scripts/make_bench_model.py); bench/models/bench25m-sp is that
# checkpoint (linked) with the sentencepiece tokenizer TOKENIZER (32000 pieces, Llama 2's from ../shared) copied in.
# Results: bench/results/techniques-<UTC stamp>/ (bench.json, bench.svg, table.md, machine.txt, runs/<technique>/).
# Run it on an idle machine: other processes on the cores slow the OpenMP threads down by far more than their share.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  THREADS [2]  STEPS [10]  TECHNIQUES [all]
#   TOKENIZER [../shared/assets/tokenizers/llama2]  PYTHON [/usr/bin/python3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
STEPS=${STEPS:-10}
TECHNIQUES=${TECHNIQUES:-}
TOKENIZER=${TOKENIZER:-../shared/assets/tokenizers/llama2}
PYTHON=${PYTHON:-/usr/bin/python3}
MODEL=bench/models/bench25m
SP=bench/models/bench25m-sp
BIN=$BUILD_DIR/bin/swiftcpp

[[ -x $BIN ]] || { echo "error: $BIN not found; build first (cmake --build $BUILD_DIR --target swiftcpp)" >&2; exit 1; }
[[ -f $TOKENIZER/tokenizer.model ]] ||
    { echo "error: $TOKENIZER/tokenizer.model not found (set TOKENIZER to a folder with a 32000-piece one)" >&2; exit 1; }
for v in THREADS STEPS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "error: $v must be a positive integer (got '${!v}')" >&2; exit 1; }
done
[[ -f $MODEL/config.json ]] || "$PYTHON" scripts/make_bench_model.py --out "$MODEL" >&2
mkdir -p "$SP"
for f in config.json generation_config.json model.safetensors; do ln -sfn "$PWD/$MODEL/$f" "$SP/$f"; done
cp "$TOKENIZER/tokenizer.model" "$SP/tokenizer.model"

OUT=bench/results/techniques-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512_bf16)$' | xargs)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"
args=(--threads "$THREADS" bench --recipe bench/bench25m_sft.yaml --steps "$STEPS" --output "$OUT")
[[ -z $TECHNIQUES ]] || args+=(--techniques "$TECHNIQUES")
status=0
"$BIN" "${args[@]}" | tee "$OUT/table.md" || status=$?
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
echo "results: $OUT" >&2
exit "$status"
