#!/usr/bin/env bash
# swiftcpp multimodal evaluation benchmark: `swiftcpp eval` answering the MMBench fixture (54 rows: 17 questions
# in all their rotations, five real photos as base64 in VLMEvalKit's TSV) with a vision-language model, scored by
# VLMEvalKit's rules; items/s at each generation batch size, the sizes alternating within each round so their
# ratio is taken side by side.
#
#   bash bench/run_mm_eval.sh      (after: cmake --build build --target swiftcpp)
#
# The model is bench/models/bench25m-qwen2-vl (scripts/make_bench_qwen2_vl.py: bench25m's language model as
# Qwen2 with a Qwen2-VL tower, each test photo 576-580 tokens; random weights, so its answers are noise and the
# generation always runs NEW_TOKENS tokens), generated when missing. Each measurement is one process: model load,
# image decoding, prompts, generation and scoring, as a user runs it; items/s is rows / the eval's own time
# (results.json, without the model load). bench/report_mm_eval.py prints the table for docs/benchmarks.md; raw
# results go to bench/results/mm-eval-<UTC timestamp>/.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3] (rounds)  THREADS [2]  BATCHES ["1 8"] (the first is the reference)
#   NEW_TOKENS [16]  RULES [vlmevalkit]  MODEL [bench/models/bench25m-qwen2-vl]
#   TSV [../shared/assets/reference/mm_eval/mmbench_dev_en_style.tsv]  PYTHON [/usr/bin/python3]
# On the 2-core dev machine a round takes about 2 minutes with the defaults.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
BATCHES=${BATCHES:-1 8}
NEW_TOKENS=${NEW_TOKENS:-16}
RULES=${RULES:-vlmevalkit}
MODEL=${MODEL:-bench/models/bench25m-qwen2-vl}
TSV=${TSV:-../shared/assets/reference/mm_eval/mmbench_dev_en_style.tsv}
PYTHON=${PYTHON:-/usr/bin/python3}

SWIFTCPP=$BUILD_DIR/bin/swiftcpp
if [[ ! -x $SWIFTCPP ]]; then
    echo "error: $SWIFTCPP not found. Build first: cmake --build $BUILD_DIR --target swiftcpp" >&2
    exit 1
fi
for v in RUNS THREADS NEW_TOKENS; do
    if [[ ! ${!v} =~ ^[1-9][0-9]*$ ]]; then
        echo "error: $v must be a positive integer (got '${!v}')" >&2
        exit 1
    fi
done
for b in $BATCHES; do
    if [[ ! $b =~ ^[1-9][0-9]*$ ]]; then
        echo "error: BATCHES must hold positive integers (got '$b')" >&2
        exit 1
    fi
done
if [[ ! -f $TSV ]]; then
    echo "error: $TSV not found (the ../shared assets, next to this checkout; or set TSV)" >&2
    exit 1
fi
if [[ ! -f $MODEL/config.json ]]; then
    if [[ $MODEL != bench/models/bench25m-qwen2-vl ]]; then
        echo "error: $MODEL/config.json not found" >&2
        exit 1
    fi
    echo "generating $MODEL ..." >&2
    "$PYTHON" scripts/make_bench_qwen2_vl.py --out "$MODEL" >&2
fi

# Old kernels forced by the machine's environment are not ours to time (../shared/docs/BENCHMARKS.md).
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

OUT=bench/results/mm-eval-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "cores: $(nproc)"
    echo "command: RUNS=$RUNS THREADS=$THREADS BATCHES=\"$BATCHES\" NEW_TOKENS=$NEW_TOKENS RULES=$RULES bash bench/run_mm_eval.sh"
    echo "model: $MODEL"
    echo "data: $TSV"
} > "$OUT/machine.txt"

for r in $(seq 1 "$RUNS"); do
    for b in $BATCHES; do
        dir=$OUT/r$r.b$b
        load=$(cut -d' ' -f1 /proc/loadavg)
        "$SWIFTCPP" --threads "$THREADS" eval --model "$MODEL" --tasks "mmbench=$TSV" --rules "$RULES" \
            --max-new-tokens "$NEW_TOKENS" --batch-size "$b" --output-dir "$dir" > "$dir.log" 2>&1 ||
            { echo "error: round $r, batch $b failed; see $dir.log" >&2; tail -5 "$dir.log" >&2; exit 1; }
        "$PYTHON" - "$dir/results.json" "$r" "$b" "$load" >> "$OUT/results.jsonl" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))["mm_results"][0]
print(json.dumps({"round": int(sys.argv[2]), "batch": int(sys.argv[3]), "load": float(sys.argv[4]),
                  "rows": res["rows"], "seconds": res["seconds"], "items_per_s": res["items_per_s"],
                  "generated_tokens": res["generated_tokens"], "headline": res["headline"]}))
PY
        echo "round $r, batch $b: $(tail -1 "$OUT/results.jsonl")" >&2
    done
done
"$PYTHON" bench/report_mm_eval.py "$OUT" | tee "$OUT/report.md"
