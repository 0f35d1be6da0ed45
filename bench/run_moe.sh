#!/usr/bin/env bash
# Mixture of experts against its dense twin: bench-moe (bench25m with each MLP replaced by 8 experts of half the
# width, 2 active per token, so the same active parameters per token) and bench25m, decoded and trained with the
# same programs and settings, back to back. Builds nothing.
#
#   bash bench/run_moe.sh      (after: cmake --build build --target bench)
#
# Decode: build/bin/swiftcpp_bench_infer (prefill PROMPT_LEN, then greedy decode of NEW_TOKENS at batch 1, KV cache).
# Train: build/bin/swiftcpp_bench_train (LoRA r 16 on every linear layer but the routers, float32, packed batches
# of BATCH x SEQ tokens, WARMUP untimed steps, then STEPS timed; the load-balancing loss is on for bench-moe).
# Each program runs RUNS times per model, interleaved; the table gives medians and the MoE / dense ratios. Raw JSON
# lines and the table go to bench/results/moe-<UTC timestamp>/.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3]  THREADS [2]  PROMPT_LEN [128]  NEW_TOKENS [128]  BATCH [2]  SEQ [512]  WARMUP [1]
#   STEPS [3]  PYTHON [/usr/bin/python3]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
PROMPT_LEN=${PROMPT_LEN:-128}
NEW_TOKENS=${NEW_TOKENS:-128}
BATCH=${BATCH:-2}
SEQ=${SEQ:-512}
WARMUP=${WARMUP:-1}
STEPS=${STEPS:-3}
PYTHON=${PYTHON:-/usr/bin/python3}

for b in swiftcpp_bench_infer swiftcpp_bench_train; do
    if [[ ! -x $BUILD_DIR/bin/$b ]]; then
        echo "error: $BUILD_DIR/bin/$b not found. Build first: cmake --build $BUILD_DIR --target bench" >&2
        exit 1
    fi
done
for v in RUNS THREADS PROMPT_LEN NEW_TOKENS BATCH SEQ WARMUP STEPS; do
    if [[ ! ${!v} =~ ^[0-9]+$ ]] || [[ ${!v} -lt 1 ]]; then
        echo "error: $v must be a positive integer (got '${!v}')" >&2
        exit 1
    fi
done
"$PYTHON" scripts/make_bench_model.py --out bench/models/bench25m >&2
"$PYTHON" scripts/make_bench_model.py --out bench/models/bench-moe --preset bench-moe >&2

export OMP_NUM_THREADS=$THREADS
export OPENBLAS_NUM_THREADS=$THREADS
OUT=bench/results/moe-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"

for run in $(seq "$RUNS"); do
    for model in bench25m bench-moe; do
        echo "run $run/$RUNS: $model decode" >&2
        "$BUILD_DIR/bin/swiftcpp_bench_infer" --model "bench/models/$model" --prompt-len "$PROMPT_LEN" \
            --new-tokens "$NEW_TOKENS" --threads "$THREADS" --runs 1 | tail -n 1 >>"$OUT/infer-$model.jsonl"
        echo "run $run/$RUNS: $model train" >&2
        "$BUILD_DIR/bin/swiftcpp_bench_train" --model "bench/models/$model" --mode lora --dtype float32 \
            --batching packing --batch "$BATCH" --seq "$SEQ" --warmup "$WARMUP" --steps "$STEPS" --threads "$THREADS" \
            --runs 1 | tail -n 1 >>"$OUT/train-$model.jsonl"
    done
done

"$PYTHON" - "$OUT" "$THREADS" <<'PY' | tee "$OUT/report.md"
import json, statistics, sys
out, threads = sys.argv[1], sys.argv[2]

def rows(kind, model):
    with open("%s/%s-%s.jsonl" % (out, kind, model)) as fh:
        return [json.loads(line) for line in fh if line.strip()]

def median(kind, model, *path):
    values = []
    for r in rows(kind, model):
        v = r
        for p in path:
            v = v[p]
        values.append(v["median"] if isinstance(v, dict) else v)
    return statistics.median(values)

metrics = [("decode tokens/s", "infer", ("decode_tok_s",)),
           ("prefill tokens/s", "infer", ("prefill_tok_s",)),
           ("decode peak RSS (MB)", "infer", ("peak_rss_mb",)),
           ("LoRA train tokens/s", "train", ("tokens_per_s",)),
           ("train peak RSS (MB)", "train", ("train_peak_rss_mb",))]
print("| %s threads | bench25m | bench-moe | MoE / dense |" % threads)
print("|---|---|---|---|")
for name, kind, path in metrics:
    dense, moe = median(kind, "bench25m", *path), median(kind, "bench-moe", *path)
    print("| %s | %.1f | %.1f | %.2fx |" % (name, dense, moe, moe / dense))
PY
echo "results: $OUT" >&2
