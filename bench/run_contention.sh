#!/usr/bin/env bash
# Speed beside other busy processes: every workload at the default thread count (--threads 0: the cores this
# process may use) and at each explicit count 1..nproc, on the quiet machine and beside BUSY busy processes (one
# per spare core by default), with PyTorch's LoRA step beside ours under the same load.
#
#   bash bench/run_contention.sh      (after: cmake --build build --target swiftcpp_bench_infer swiftcpp_bench_train)
#
# Rows (all float32):
#   decode, prefill   swiftcpp_bench_infer on stories260K (the bundled model) and bench25m: PROMPT_LEN prompt
#                     tokens in one forward, NEW_TOKENS greedy tokens one at a time
#   lora step         swiftcpp_bench_train --mode lora on stories260K (batch 8 x 128) and bench25m (batch 4 x 256)
#   serve 8 streams   `swiftcpp deploy --parallel 8` driven by bench/serve_load.mjs: 8 clients, SERVE_REQUESTS
#                     streamed completions of SERVE_TOKENS tokens each; aggregate completion tokens/s
#   pytorch lora      bench/baseline_train.py on the same batches and adapter (the measurement contract is its
#                     docstring), at the same thread counts; PyTorch's OpenMP keeps its own defaults
#   llama.cpp decode  llama.cpp's llama-bench (scripts/build_llama_bench.sh) on the models' float32 GGUF export,
#                     NEW_TOKENS tokens (tg); "default" is llama-bench's own thread count
# A busy process is `sh -c 'while :; do :; done'`. Settings alternate within each of ROUNDS rounds (default,
# 1, 2, ..., then the same under load), so a drift of the machine's own load touches all of them alike.
# Report: for each row and load, each setting's median over rounds and its ratio to the best explicit count under
# the same load (the issue's target: the default at least 0.9x of it).
# Results: bench/results/contention-<UTC stamp>/ (raw JSON, logs, report.md).
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  ROUNDS [3]  BUSY [nproc - 1, at least 1]  PROMPT_LEN [128]  NEW_TOKENS [128]
#   STEPS [5]  MODELS ["stories260K bench25m"]  PYTHON [/usr/bin/python3]  SERVE_REQUESTS [16]  SERVE_TOKENS [64]
#   LLAMA [1: llama.cpp rows; 0: none]  TOKENIZER [../shared/assets/tokenizers/llama2: bench25m's 32000 pieces]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
ROUNDS=${ROUNDS:-3}
CORES=$(nproc)
BUSY=${BUSY:-$((CORES > 1 ? CORES - 1 : 1))}
PROMPT_LEN=${PROMPT_LEN:-128}
NEW_TOKENS=${NEW_TOKENS:-128}
STEPS=${STEPS:-5}
MODELS=${MODELS:-"stories260K bench25m"}
PYTHON=${PYTHON:-/usr/bin/python3}
SERVE_REQUESTS=${SERVE_REQUESTS:-16}
SERVE_TOKENS=${SERVE_TOKENS:-64}
LLAMA=${LLAMA:-1}
TOKENIZER=${TOKENIZER:-../shared/assets/tokenizers/llama2}
BIN=$BUILD_DIR/bin/swiftcpp
INFER=$BUILD_DIR/bin/swiftcpp_bench_infer
TRAIN=$BUILD_DIR/bin/swiftcpp_bench_train
for f in "$BIN" "$INFER" "$TRAIN"; do
    [[ -x $f ]] || { echo "error: $f not found; build first (cmake --build $BUILD_DIR --target swiftcpp swiftcpp_bench_infer swiftcpp_bench_train)" >&2; exit 1; }
done
command -v node >/dev/null || { echo "error: node not found (scripts/setup.sh installs it)" >&2; exit 1; }
[[ -f $TOKENIZER/tokenizer.model ]] ||
    { echo "error: $TOKENIZER/tokenizer.model not found (bench25m needs a 32000-piece tokenizer; set TOKENIZER)" >&2; exit 1; }
LLAMA_BENCH=
[[ $LLAMA == 1 ]] && LLAMA_BENCH=$(bash scripts/build_llama_bench.sh)

OUT=bench/results/contention-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $CORES cores"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "busy processes under load: $BUSY"
    echo "environment: OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset} GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-unset}"
} > "$OUT/machine.txt"

model_dir() {
    case $1 in
        stories260K) echo models/stories260K ;;
        bench25m)
            [[ -f bench/models/bench25m/config.json ]] || "$PYTHON" scripts/make_bench_model.py --out bench/models/bench25m >&2
            echo bench/models/bench25m ;;
        *) echo "error: unknown model $1 (stories260K or bench25m)" >&2; exit 1 ;;
    esac
}
# The folder deploy serves and GGUF export reads: the model with a tokenizer (bench25m has none of its own).
serve_dir() {
    local dir
    dir=$(model_dir "$1")
    if [[ $1 == bench25m ]]; then
        mkdir -p "$OUT/files/bench25m"
        ln -sf "$PWD/$dir"/{config.json,generation_config.json,model.safetensors} "$OUT/files/bench25m/"
        cp "$TOKENIZER/tokenizer.model" "$OUT/files/bench25m/"
        echo "$OUT/files/bench25m"
    else
        echo "$dir"
    fi
}
train_shape() { [[ $1 == stories260K ]] && echo "8 128" || echo "4 256"; }

BUSY_PIDS=()
start_busy() {
    for _ in $(seq "$BUSY"); do sh -c 'while :; do :; done' & BUSY_PIDS+=($!); done
    sleep 1
}
stop_busy() {
    ((${#BUSY_PIDS[@]})) && kill "${BUSY_PIDS[@]}" 2>/dev/null || true
    wait "${BUSY_PIDS[@]}" 2>/dev/null || true
    BUSY_PIDS=()
}
trap stop_busy EXIT

# The batches and initial adapter PyTorch trains on, written once per model by our benchmark.
for m in $MODELS; do
    dir=$(model_dir "$m")
    read -r b s < <(train_shape "$m")
    "$TRAIN" --model "$dir" --mode lora --batch "$b" --seq "$s" --warmup 1 --steps "$STEPS" --threads 1 --runs 1 \
        --write-batches "$OUT/$m.batches.jsonl" --write-init-adapter "$OUT/$m.adapter" >/dev/null 2>"$OUT/$m.prep.log" ||
        { echo "error: swiftcpp_bench_train failed; see $OUT/$m.prep.log" >&2; exit 1; }
done

for m in $MODELS; do
    sdir=$(serve_dir "$m")
    if [[ -n $LLAMA_BENCH ]]; then
        "$BIN" export --model "$sdir" --format gguf --quant f32 --output "$OUT/$m.gguf" 2>"$OUT/$m.export.log" ||
            { echo "error: GGUF export failed; see $OUT/$m.export.log" >&2; exit 1; }
    fi
done
[[ -n $LLAMA_BENCH ]] && echo "llama.cpp: $(git -C bench/llama/src log -1 --format=%h), node-llama-cpp 3.21.1" >> "$OUT/machine.txt"

PORT=18731
serve() {  # model folder, threads, result file
    local port pid
    PORT=$((PORT + 1)); port=$PORT  # a fresh port each run: the last one may linger in TIME_WAIT
    "$BIN" --threads "$2" deploy --model "$1" --port $port --parallel 8 --max-model-len 512 --served-model-name bench \
        2>"$3.log" &
    pid=$!
    for _ in $(seq 1 600); do
        [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true) == 200 ]] && break
        sleep 0.1
    done
    node bench/serve_load.mjs --url "http://127.0.0.1:$port" --concurrency 8 --requests "$SERVE_REQUESTS" \
        --max-tokens "$SERVE_TOKENS" --model bench >"$3" || { kill "$pid"; echo "error: see $3.log" >&2; exit 1; }
    kill -TERM "$pid"; wait "$pid" || true
}

SETTINGS="0 $(seq -s ' ' 1 "$CORES")"
run_all() {  # load, round
    local load=$1 round=$2
    for m in $MODELS; do
        local dir sdir
        dir=$(model_dir "$m")
        sdir=$(serve_dir "$m")
        read -r b s < <(train_shape "$m")
        for t in $SETTINGS; do
            local tag="$m.$load.t$t.r$round"
            echo "[$tag]" >&2
            "$INFER" --model "$dir" --prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" --threads "$t" --runs 1 \
                >"$OUT/$tag.infer.json" 2>"$OUT/$tag.infer.log" || { echo "error: see $OUT/$tag.infer.log" >&2; exit 1; }
            "$TRAIN" --model "$dir" --mode lora --batch "$b" --seq "$s" --warmup 1 --steps "$STEPS" --threads "$t" \
                --runs 1 >"$OUT/$tag.train.json" 2>"$OUT/$tag.train.log" || { echo "error: see $OUT/$tag.train.log" >&2; exit 1; }
            serve "$sdir" "$t" "$OUT/$tag.serve.json"
            if [[ -n $LLAMA_BENCH ]]; then  # llama-bench's default: no -t
                "$LLAMA_BENCH" -m "$OUT/$m.gguf" -p 0 -n "$NEW_TOKENS" -r 1 -o json $([[ $t != 0 ]] && echo "-t $t") \
                    >"$OUT/$tag.llama.json" 2>"$OUT/$tag.llama.log" || { echo "error: see $OUT/$tag.llama.log" >&2; exit 1; }
            fi
            if [[ $t != 0 ]]; then  # PyTorch has no "default" of ours: its explicit counts only
                "$PYTHON" bench/baseline_train.py --model "$dir" --batches "$OUT/$m.batches.jsonl" \
                    --adapter "$OUT/$m.adapter" --mode lora --dtype float32 --warmup 1 --steps "$STEPS" --threads "$t" \
                    --runs 1 >"$OUT/$tag.pytorch.json" 2>"$OUT/$tag.pytorch.log" ||
                    { echo "error: see $OUT/$tag.pytorch.log" >&2; exit 1; }
            fi
        done
    done
}

for r in $(seq "$ROUNDS"); do
    run_all quiet "$r"
    start_busy
    run_all busy "$r"
    stop_busy
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

"$PYTHON" bench/report_contention.py "$OUT" > "$OUT/report.md"
cat "$OUT/report.md"
