#!/usr/bin/env bash
# swiftcpp inference benchmark: swiftcpp vs the PyTorch eager baseline, back to back, on the same machine.
#
#   bash bench/run_pytorch.sh            (after: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target swiftcpp bench -j)
#
# For each model, runs build/bin/swiftcpp_bench_infer and then bench/baseline_infer.py with identical settings
# (batch 1, greedy, KV cache; see the measurement contract at the top of bench/baseline_infer.py), checks that
# both generated the same ids, and prints a markdown table with the ratios. Raw JSON results and the report go to
# bench/results/<UTC timestamp>/. bench/models/bench25m is generated first if missing.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3]  THREADS [2]  PROMPT_LEN [128]  NEW_TOKENS [128]
#   MODELS ["models/stories260K bench/models/bench25m"]  (space-separated checkpoint folders)
#   BASELINES ["eager mv"]   PyTorch variants: eager = plain F.linear everywhere (impl pytorch-eager);
#                            mv = torch.mv for one-token projections (impl pytorch-eager-mv, a tuned baseline)
#   PYTHON [/usr/bin/python3]  (Debian's interpreter, which has python3-torch)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
PROMPT_LEN=${PROMPT_LEN:-128}
NEW_TOKENS=${NEW_TOKENS:-128}
MODELS=${MODELS:-"models/stories260K bench/models/bench25m"}
BASELINES=${BASELINES:-"eager mv"}
PYTHON=${PYTHON:-/usr/bin/python3}
BENCH_MODEL=bench/models/bench25m

BENCH_BIN=$BUILD_DIR/bin/swiftcpp_bench_infer
if [[ ! -x $BENCH_BIN ]]; then
    echo "error: $BENCH_BIN not found. Build first:" >&2
    echo "  cmake -S . -B $BUILD_DIR -DCMAKE_BUILD_TYPE=Release && cmake --build $BUILD_DIR --target swiftcpp bench -j" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import torch, numpy' 2>/dev/null; then
    echo "error: $PYTHON cannot import torch and numpy (install Debian's python3-torch, or set PYTHON)" >&2
    exit 1
fi

for m in $MODELS; do
    if [[ $m == "$BENCH_MODEL" && ! -f $m/config.json ]]; then
        echo "generating $m ..." >&2
        "$PYTHON" scripts/make_bench_model.py --out "$m" >&2
    fi
    if [[ ! -f $m/config.json || ! -f $m/model.safetensors ]]; then
        echo "error: $m is not a checkpoint folder (config.json + model.safetensors)" >&2
        exit 1
    fi
done

# Same thread count for both programs (OpenMP and OpenBLAS pools; both also set it explicitly).
export OMP_NUM_THREADS=$THREADS
export OPENBLAS_NUM_THREADS=$THREADS

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/$STAMP
mkdir -p "$OUT"

COMMON=(--prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" --threads "$THREADS" --runs "$RUNS")
FILES=()
for m in $MODELS; do
    name=$(basename "$m")
    f=$OUT/$name.swiftcpp.json
    echo "[$name] swiftcpp: $BENCH_BIN --model $m ${COMMON[*]}" >&2
    if ! "$BENCH_BIN" --model "$m" "${COMMON[@]}" >"$f" 2>"$OUT/$name.swiftcpp.log"; then
        echo "error: swiftcpp_bench_infer failed on $m; see $OUT/$name.swiftcpp.log" >&2
        tail -n 20 "$OUT/$name.swiftcpp.log" >&2 || true
        exit 1
    fi
    FILES+=("$f")
    for v in $BASELINES; do
        case $v in
            eager) extra=(); impl=pytorch-eager ;;
            mv) extra=(--single-row-mv); impl=pytorch-eager-mv ;;
            *) echo "error: unknown baseline variant '$v' (eager, mv)" >&2; exit 1 ;;
        esac
        f=$OUT/$name.$impl.json
        echo "[$name] $impl: $PYTHON bench/baseline_infer.py --model $m ${COMMON[*]} ${extra[*]-}" >&2
        if ! "$PYTHON" bench/baseline_infer.py --model "$m" "${COMMON[@]}" ${extra[@]+"${extra[@]}"} \
                >"$f" 2>"$OUT/$name.$impl.log"; then
            echo "error: baseline failed on $m; see $OUT/$name.$impl.log" >&2
            tail -n 20 "$OUT/$name.$impl.log" >&2 || true
            exit 1
        fi
        FILES+=("$f")
    done
done

# Spell out every setting so the line reproduces the run.
CMD="BUILD_DIR=$BUILD_DIR RUNS=$RUNS THREADS=$THREADS PROMPT_LEN=$PROMPT_LEN NEW_TOKENS=$NEW_TOKENS"
CMD+=" MODELS='$MODELS' BASELINES='$BASELINES' bash bench/run_pytorch.sh"

rc=0
"$PYTHON" bench/report.py --command "$CMD" "${FILES[@]}" | tee "$OUT/report.md" || rc=$?
# report.py exits 2 when generated ids differ (a warning, printed in the report); anything else is an error.
if [[ $rc -ne 0 && $rc -ne 2 ]]; then
    exit "$rc"
fi
echo "" >&2
echo "raw results: $OUT/" >&2
