#!/usr/bin/env bash
# swiftcpp evaluation benchmark: `swiftcpp eval` on MMLU vs the PyTorch eager baseline, back to back, on the same
# machine and the same token ids.
#
#   bash bench/run_eval.sh       (after: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target swiftcpp bench -j)
#
# For each run i = 1..RUNS:
#   1. build/bin/swiftcpp eval scores MMLU (5-shot, the first LIMIT questions of each of the 57 subjects) with
#      bench25m and the Llama 2 tokenizer, writing results.json (items, seconds, tokenisation seconds) and
#      samples_mmlu.jsonl (log-likelihoods) to swiftcpp-$i/; run 1 also dumps the token ids it scored
#      (requests.jsonl), peak RSS comes from /usr/bin/time -v when present;
#   2. bench/baseline_eval.py scores the same requests the way lm-evaluation-harness's Hugging Face backend does,
#      in eager PyTorch (the method is the docstring of bench/baseline_eval.py), in a fresh process as swiftcpp;
# then bench/report_eval.py prints a markdown table: items/s of swiftcpp (total and model only, i.e. without its
# tokenisation) and of the baseline, their ratios, peak RSS, and the largest log-likelihood difference between the
# two programs (they must compute the same numbers). Raw results, logs and the report go to
# bench/results/eval-<UTC timestamp>/.
# The model folder bench/models/bench25m-llama2tok is bench25m (generated first if missing) plus the Llama 2
# tokenizer from ../shared/assets (same 32000-token vocabulary); it is made when missing.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3]  THREADS [2]  LIMIT [2] (questions per subject: 2 = 114 items)  BATCH [8]
#   MODEL [bench/models/bench25m-llama2tok]  DATA [../shared/assets/data/eval]
#   PYTHON [/usr/bin/python3]  (Debian's interpreter, which has python3-torch)
# On the 2-core dev machine one run of LIMIT=2 (both programs) takes about 5 minutes: RUNS=3 about 16.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
LIMIT=${LIMIT:-2}
BATCH=${BATCH:-8}
MODEL=${MODEL:-bench/models/bench25m-llama2tok}
DATA=${DATA:-../shared/assets/data/eval}
PYTHON=${PYTHON:-/usr/bin/python3}
BENCH_MODEL=bench/models/bench25m
EVAL_MODEL=bench/models/bench25m-llama2tok
TOKENIZER=../shared/assets/tokenizers/llama2/tokenizer.model

SWIFTCPP=$BUILD_DIR/bin/swiftcpp
if [[ ! -x $SWIFTCPP ]]; then
    echo "error: $SWIFTCPP not found. Build first:" >&2
    echo "  cmake -S . -B $BUILD_DIR -DCMAKE_BUILD_TYPE=Release && cmake --build $BUILD_DIR --target swiftcpp bench -j" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import torch, numpy' 2>/dev/null; then
    echo "error: $PYTHON cannot import torch and numpy (install Debian's python3-torch, or set PYTHON)" >&2
    exit 1
fi
for v in RUNS THREADS LIMIT BATCH; do
    if [[ ! ${!v} =~ ^[1-9][0-9]*$ ]]; then
        echo "error: $v must be a positive integer (got '${!v}')" >&2
        exit 1
    fi
done
if [[ ! -d $DATA/mmlu ]]; then
    echo "error: no MMLU data under $DATA (expected $DATA/mmlu/; the shared assets live in ../shared," \
         "next to this checkout; set DATA to use another copy)" >&2
    exit 1
fi

if [[ $MODEL == "$EVAL_MODEL" && ! -f $MODEL/tokenizer.model ]]; then
    if [[ ! -f $TOKENIZER ]]; then
        echo "error: $TOKENIZER not found: the benchmark model needs the Llama 2 tokenizer from the shared" \
             "assets (../shared, next to this checkout), or set MODEL to a folder with a tokenizer" >&2
        exit 1
    fi
    if [[ ! -f $BENCH_MODEL/config.json ]]; then
        echo "generating $BENCH_MODEL ..." >&2
        "$PYTHON" scripts/make_bench_model.py --out "$BENCH_MODEL" >&2
    fi
    echo "making $MODEL (bench25m + the Llama 2 tokenizer) ..." >&2
    mkdir -p "$MODEL"
    for f in config.json generation_config.json model.safetensors; do
        ln -sfn "../bench25m/$f" "$MODEL/$f"
    done
    cp "$TOKENIZER" "$MODEL/tokenizer.model.tmp"
    mv "$MODEL/tokenizer.model.tmp" "$MODEL/tokenizer.model"
fi
if [[ ! -f $MODEL/config.json || ! -f $MODEL/model.safetensors ]]; then
    echo "error: $MODEL is not a checkpoint folder (config.json + model.safetensors)" >&2
    exit 1
fi

# Same thread count for both programs (OpenMP and OpenBLAS pools; both also set it explicitly).
export OMP_NUM_THREADS=$THREADS
export OPENBLAS_NUM_THREADS=$THREADS

TIME=()
if [[ -x /usr/bin/time ]]; then
    TIME=(/usr/bin/time -v)
fi

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/eval-$STAMP
mkdir -p "$OUT"
REQUESTS=$OUT/requests.jsonl

fail() {  # fail NAME LOG
    echo "error: $1 failed; see $2" >&2
    tail -n 20 "$2" >&2 || true
    exit 1
}

REPORT_ARGS=()
for ((i = 1; i <= RUNS; i++)); do
    sw_out=$OUT/swiftcpp-$i
    cmd=("$SWIFTCPP" --threads "$THREADS" eval --model "$MODEL" --tasks mmlu --data-dir "$DATA" --limit "$LIMIT"
         --batch-size "$BATCH" --output-dir "$sw_out" --log-samples)
    if [[ $i -eq 1 ]]; then
        cmd+=(--dump-requests "$REQUESTS")
    fi
    echo "[run $i/$RUNS] swiftcpp: ${cmd[*]}" >&2
    tlog=-
    if [[ ${#TIME[@]} -gt 0 ]]; then
        tlog=$OUT/swiftcpp-$i.time
        "${TIME[@]}" -o "$tlog" "${cmd[@]}" >"$OUT/swiftcpp-$i.stdout" 2>"$OUT/swiftcpp-$i.log" ||
            fail "swiftcpp eval (run $i)" "$OUT/swiftcpp-$i.log"
    else
        "${cmd[@]}" >"$OUT/swiftcpp-$i.stdout" 2>"$OUT/swiftcpp-$i.log" ||
            fail "swiftcpp eval (run $i)" "$OUT/swiftcpp-$i.log"
    fi
    if [[ ! -s $sw_out/results.json || ! -s $sw_out/samples_mmlu.jsonl ]]; then
        echo "error: swiftcpp eval did not write $sw_out/results.json and samples_mmlu.jsonl" >&2
        exit 1
    fi
    if [[ ! -s $REQUESTS ]]; then
        echo "error: swiftcpp eval did not write $REQUESTS (--dump-requests)" >&2
        exit 1
    fi

    base=$OUT/pytorch-eager-$i.json
    bcmd=("$PYTHON" bench/baseline_eval.py --model "$MODEL" --requests "$REQUESTS" --batch-size "$BATCH"
          --threads "$THREADS" --runs 1 --output "$base")
    echo "[run $i/$RUNS] pytorch-eager: ${bcmd[*]}" >&2
    "${bcmd[@]}" >/dev/null 2>"$OUT/pytorch-eager-$i.log" ||
        fail "baseline_eval.py (run $i)" "$OUT/pytorch-eager-$i.log"
    REPORT_ARGS+=(--run "$sw_out" "$tlog" "$base")
done

# Spell out every setting so the line reproduces the run.
CMD="BUILD_DIR=$BUILD_DIR RUNS=$RUNS THREADS=$THREADS LIMIT=$LIMIT BATCH=$BATCH MODEL=$MODEL DATA=$DATA"
CMD+=" bash bench/run_eval.sh"

rc=0
"$PYTHON" bench/report_eval.py --command "$CMD" "${REPORT_ARGS[@]}" | tee "$OUT/report.md" || rc=$?
# report_eval.py exits 2 when the two programs' log-likelihoods differ beyond tolerance (a warning, printed in
# the report); anything else is an error.
if [[ $rc -ne 0 && $rc -ne 2 ]]; then
    exit "$rc"
fi
echo "" >&2
echo "raw results: $OUT/" >&2
