#!/usr/bin/env bash
# CPU inference side by side with llama.cpp: swiftcpp and llama.cpp's llama-bench on the same GGUF files of the same
# model, one after the other on this machine, RUNS timed runs each (the table gives medians).
#
#   bash bench/run.sh      (after: cmake -S . -B build && cmake --build build --target swiftcpp bench)
#
# Builds llama-bench first from the llama.cpp source bundled in node-llama-cpp@3.21.1 (scripts/build_llama_bench.sh;
# git-ignored folders under bench/llama/). bench/models/bench25m is generated when missing; its GGUF exports need a
# sentencepiece tokenizer of its 32000-token vocabulary (TOKENIZER, Llama 2's from ../shared). Rows:
#   float32   swiftcpp on the Hugging Face folder and on the F32 GGUF; llama.cpp on the F32 GGUF
#   int8      swiftcpp's own int8 (RTN, per output channel) and the Q8_0 GGUF run packed; llama.cpp on the Q8_0 GGUF
#   int4      swiftcpp's own int4 (RTN, groups of 32) and the Q4_0 GGUF run packed; llama.cpp on the Q4_0 GGUF
#             (output projection Q8_0 in that file, as llama.cpp's quantizer keeps it wider)
#   bfloat16  swiftcpp decode in bfloat16 against its float32 (llama.cpp has no BF16 export here)
#   batched   swiftcpp decoding BATCH sequences at once against one
# Prefill = PROMPT_LEN prompt tokens in one forward (llama-bench pp), decode = NEW_TOKENS tokens one at a time
# (llama-bench tg). Peak memory: swiftcpp's getrusage, llama-bench's through GNU time.
# Results: bench/results/llama-<UTC stamp>/ (raw JSON, logs, report.md); report.md is what docs/benchmarks.md quotes.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3]  THREADS [2]  PROMPT_LEN [128]  NEW_TOKENS [128]  BATCH [8]
#   TOKENIZER [../shared/assets/tokenizers/llama2]  PYTHON [/usr/bin/python3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
PROMPT_LEN=${PROMPT_LEN:-128}
NEW_TOKENS=${NEW_TOKENS:-128}
BATCH=${BATCH:-8}
TOKENIZER=${TOKENIZER:-../shared/assets/tokenizers/llama2}
PYTHON=${PYTHON:-/usr/bin/python3}
MODEL=bench/models/bench25m
BIN=$BUILD_DIR/bin/swiftcpp
BENCH=$BUILD_DIR/bin/swiftcpp_bench_infer

for f in "$BIN" "$BENCH"; do
    [[ -x $f ]] || { echo "error: $f not found; build first (cmake --build $BUILD_DIR --target swiftcpp bench)" >&2; exit 1; }
done
[[ -f $TOKENIZER/tokenizer.model ]] ||
    { echo "error: $TOKENIZER/tokenizer.model not found (set TOKENIZER to a folder with a 32000-piece one)" >&2; exit 1; }
[[ -x /usr/bin/time ]] || { echo "error: GNU time (/usr/bin/time) not found: apt-get install time" >&2; exit 1; }
[[ -f $MODEL/config.json ]] || "$PYTHON" scripts/make_bench_model.py --out "$MODEL" >&2
LLAMA_BENCH=$(bash scripts/build_llama_bench.sh)

OUT=bench/results/llama-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT/files"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512_bf16)$' | xargs)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "llama.cpp: $(git -C bench/llama/src log -1 --format=%h), node-llama-cpp 3.21.1"
} > "$OUT/machine.txt"

# The model's files: the checkpoint plus the tokenizer (GGUF export writes the vocabulary), then every format.
F=$OUT/files
mkdir -p "$F/bench25m"
ln -s "$PWD/$MODEL"/{config.json,generation_config.json,model.safetensors} "$F/bench25m/"
cp "$TOKENIZER/tokenizer.model" "$F/bench25m/"
for q in f32 q8_0 q4_0; do
    "$BIN" export --model "$F/bench25m" --format gguf --quant "$q" --output "$F/bench25m-$q.gguf" >&2
done
"$BIN" quantize --model "$F/bench25m" --bits 8 --group-size -1 --output "$F/bench25m-int8" >&2
"$BIN" quantize --model "$F/bench25m" --bits 4 --group-size 32 --output "$F/bench25m-int4" >&2

export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
COMMON=(--prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" --threads "$THREADS" --runs "$RUNS")
ours() {  # name, model, extra options
    local name=$1 model=$2
    shift 2
    echo "[swiftcpp $name] $BENCH --model $model ${COMMON[*]} $*" >&2
    "$BENCH" --model "$model" "${COMMON[@]}" "$@" >"$OUT/$name.swiftcpp.json" 2>"$OUT/$name.swiftcpp.log" ||
        { echo "error: swiftcpp_bench_infer failed; see $OUT/$name.swiftcpp.log" >&2; tail -n 20 "$OUT/$name.swiftcpp.log" >&2; exit 1; }
}
theirs() {  # name, gguf
    local name=$1 model=$2
    echo "[llama.cpp $name] llama-bench -m $model -p $PROMPT_LEN -n $NEW_TOKENS -t $THREADS -r $RUNS" >&2
    /usr/bin/time -f '%M' -o "$OUT/$name.llama.rss" "$LLAMA_BENCH" -m "$model" -p "$PROMPT_LEN" -n "$NEW_TOKENS" \
        -t "$THREADS" -r "$RUNS" -o json >"$OUT/$name.llama.json" 2>"$OUT/$name.llama.log" ||
        { echo "error: llama-bench failed; see $OUT/$name.llama.log" >&2; tail -n 20 "$OUT/$name.llama.log" >&2; exit 1; }
}

ours float32 "$F/bench25m"
ours float32-gguf "$F/bench25m-f32.gguf"
theirs float32 "$F/bench25m-f32.gguf"
ours int8 "$F/bench25m-int8"
ours int8-gguf "$F/bench25m-q8_0.gguf"
theirs int8 "$F/bench25m-q8_0.gguf"
ours int4 "$F/bench25m-int4"
ours int4-gguf "$F/bench25m-q4_0.gguf"
theirs int4 "$F/bench25m-q4_0.gguf"
ours bfloat16 "$F/bench25m" --dtype bfloat16
ours batched "$F/bench25m" --batch "$BATCH"

CMD="BUILD_DIR=$BUILD_DIR RUNS=$RUNS THREADS=$THREADS PROMPT_LEN=$PROMPT_LEN NEW_TOKENS=$NEW_TOKENS BATCH=$BATCH bash bench/run.sh"
"$PYTHON" bench/report_llama.py --command "$CMD" "$OUT" | tee "$OUT/report.md"
echo "raw results: $OUT/" >&2
