#!/usr/bin/env bash
# Quantisation benchmark: quality, memory and speed of what `swiftcpp quantize` / `export --format gguf` produce.
#
#   bash bench/run_quant.sh        (after a Release build; needs ../shared/assets and, for the llama.cpp rows,
#                                   scripts/setup_llama_interop.sh)
#
# For each model: float, int8-RTN (per channel), int4-RTN and int4-GPTQ (act-order, calibrated on CALIB) checkpoints
# are scored by `swiftcpp eval --tasks perplexity` on the held-out TEXT and decode one prompt with `swiftcpp infer`
# (peak memory and tokens/s from those runs); the float
# model's GGUF exports (f32, q8_0, q4_0) are scored by llama.cpp on exactly the windows and ids swiftcpp scored
# (bench/llama_cpp_perplexity.mjs). Then QLoRA (int4 base) against LoRA training on bench25m
# (build/bin/swiftcpp_bench_train, the standard settings of ../shared/docs/BENCHMARKS.md).
# Everything lands in bench/results/quant-<UTC stamp>/; report.md there is what docs/benchmarks.md quotes.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  THREADS [2]  SHARED [../shared/assets]  CALIB [tests/data/sft/alpaca_en_demo.json]
#   CALIB_SAMPLES [128]  TRAIN_RUNS [3]  PYTHON [/usr/bin/python3]
#   MODELS ["$SHARED/reference/stories260K-ff192 bench/models/bench25m"]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
SHARED=${SHARED:-../shared/assets}
CALIB=${CALIB:-tests/data/sft/alpaca_en_demo.json}
CALIB_SAMPLES=${CALIB_SAMPLES:-128}
TRAIN_RUNS=${TRAIN_RUNS:-3}
PYTHON=${PYTHON:-/usr/bin/python3}
MODELS=${MODELS:-"$SHARED/reference/stories260K-ff192 bench/models/bench25m"}
TEXT=$SHARED/data/eval/perplexity_text.txt
BIN=$BUILD_DIR/bin/swiftcpp
INTEROP=third_party/llama-interop

for f in "$BIN" "$BUILD_DIR/bin/swiftcpp_bench_train"; do
    [[ -x $f ]] || { echo "error: $f not found; build first (cmake -S . -B $BUILD_DIR && cmake --build $BUILD_DIR --target swiftcpp bench)" >&2; exit 1; }
done
[[ -f $TEXT ]] || { echo "error: $TEXT not found (../shared/assets is needed)" >&2; exit 1; }
[[ -d bench/models/bench25m ]] || "$PYTHON" scripts/make_bench_model.py --out bench/models/bench25m >&2

OUT=bench/results/quant-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT/text"
cp "$TEXT" "$OUT/text/perplexity_text.txt"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$OUT/machine.txt"

llama_ok=0
if [[ -f $INTEROP/node_modules/node-llama-cpp/package.json ]] && command -v node >/dev/null; then
    llama_ok=1
    script=$INTEROP/.bench-perplexity-$$.mjs  # ESM resolves node-llama-cpp from the script's folder
    cp bench/llama_cpp_perplexity.mjs "$script"
    trap 'rm -f "$script"' EXIT
else
    echo "note: no llama.cpp (run scripts/setup_llama_interop.sh); the GGUF rows are skipped" >&2
fi

for model in $MODELS; do
    name=$(basename "$model")
    dir=$OUT/$name
    mkdir -p "$dir"
    # bench25m has no tokenizer (benchmarks feed ids): give it the Llama 2 tokenizer its vocabulary size is made for.
    if [[ ! -f $model/tokenizer.model && ! -f $model/tokenizer.json ]]; then
        src=$model
        model=$dir/model
        mkdir -p "$model"
        for f in "$src"/*; do ln -sf "$(realpath "$f")" "$model/"; done
        cp "$SHARED/tokenizers/llama2/tokenizer.model" "$model/"
    fi
    realpath "$model" > "$dir/model_path.txt"
    read -r group max_len < <("$PYTHON" -c "
import json; c = json.load(open('$model/config.json'))
print(128 if c['hidden_size'] % 128 == 0 and c['intermediate_size'] % 128 == 0 else 32, c['max_position_embeddings'])")
    echo "== $name: int4 group $group, windows of $max_len" >&2
    "$BIN" quantize --model "$model" --bits 8 --group-size -1 --output "$dir/int8-rtn" 2>>"$dir/quantize.log"
    "$BIN" quantize --model "$model" --bits 4 --group-size "$group" --output "$dir/int4-rtn" 2>>"$dir/quantize.log"
    start=$SECONDS
    "$BIN" --threads "$THREADS" quantize --model "$model" --method gptq --bits 4 --group-size "$group" \
        --calib-dataset "$CALIB" --calib-samples "$CALIB_SAMPLES" --act-order --output "$dir/int4-gptq" \
        2>>"$dir/quantize.log"
    echo "gptq_seconds $((SECONDS - start))" >> "$dir/quantize.log"
    for v in float int8-rtn int4-rtn int4-gptq; do
        path=$dir/$v
        [[ $v == float ]] && path=$model
        "$BIN" --threads "$THREADS" eval --model "$path" --tasks perplexity --data-dir "$OUT/text" \
            --output-dir "$dir/eval-$v" --dump-requests "$dir/requests-$v.jsonl" >/dev/null 2>"$dir/eval-$v.log"
        grep -h "tokens in" "$dir/eval-$v.log" >&2
        # Memory and decoding speed: one 500-byte prompt, 128 new tokens, greedy, KV cache.
        "$BIN" --threads "$THREADS" infer --model "$path" --prompt "$(head -c 500 "$TEXT")" --template raw \
            --max-new-tokens 128 --temperature 0 --no-stream >/dev/null 2>"$dir/infer-$v.log"
        grep -h "peak memory\|tokens/s" "$dir/infer-$v.log" >&2
    done
    if [[ $llama_ok == 1 ]]; then
        for q in f32 q8_0 q4_0; do
            "$BIN" export --model "$model" --format gguf --quant "$q" --output "$dir/$q.gguf" 2>>"$dir/export.log"
            gguf=$(realpath "$dir/$q.gguf")
            requests=$(realpath "$dir/requests-float.jsonl")
            (cd "$INTEROP" && node "$(basename "$script")" "$gguf" "$requests" "$max_len" "$THREADS") > "$dir/llama-$q.json"
            cat "$dir/llama-$q.json" >&2
        done
    fi
done

# QLoRA against LoRA: bench25m, batch 4 x 512, LoRA r 16 on every projection, one process each.
for bits in 0 4; do
    "$BUILD_DIR/bin/swiftcpp_bench_train" --model bench/models/bench25m --mode lora --batch 4 --seq 512 --warmup 3 \
        --steps 10 --threads "$THREADS" --runs "$TRAIN_RUNS" --quant-bits "$bits" --quant-group-size 64 \
        > "$OUT/train-q$bits.json" 2>"$OUT/train-q$bits.log"
done

"$PYTHON" bench/report_quant.py "$OUT" | tee "$OUT/report.md"
