#!/usr/bin/env bash
# swiftcpp vision-language training benchmark: a LLaVA training step (real Trainer::step) split into vision tower,
# projector and language model, with a count of how often the tower ran per step. Builds nothing.
#
#   bash bench/run_mm_train.sh      (after: cmake --build build --target swiftcpp_bench_mm_train)
#
# Generates bench/models/bench25m-llava if missing (scripts/make_bench_llava.py: bench25m's language model, a CLIP
# tower at 336 px with 576 patches, random weights), then runs build/bin/swiftcpp_bench_mm_train once per case:
#   frozen   LoRA r 16 / alpha 32 on the language model, projector trained in full, tower frozen (freeze_vit)
#   trained  the same with the tower trained in full (freeze_vit false)
# Each case: RUNS model loads, each with WARMUP warm-up steps, STEPS timed steps and PROFILED_STEPS profiled steps
# spread among them; B = BATCH samples a step, one real image and 64 text tokens each (how the batches are made and
# how the split is measured: the header of bench/bench_mm_train.cpp). Prints a markdown table for
# docs/benchmarks.md; raw JSON, per-step logs and the table go to bench/results/mm-train-<UTC timestamp>/.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3]  THREADS [2]  WARMUP [3]  STEPS [10]  PROFILED_STEPS [4]  BATCH [4]
#   CASES ["frozen trained"]  MODEL [bench/models/bench25m-llava]  IMAGES [../shared/assets/images]
#   TOP_OPS [0]  (N > 0: each log also lists the N ops with the most self time in each part)
#   PYTHON [/usr/bin/python3]  (for the model generator and the table; needs numpy)
# On the 2-core dev machine, idle, a case takes about 3 minutes with the defaults. Other processes on the cores
# slow the OpenMP threads down by far more than their share (a busy machine measured 10-20x slower steps), so the
# table records the load average at the start and end of each case.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
WARMUP=${WARMUP:-3}
STEPS=${STEPS:-10}
PROFILED_STEPS=${PROFILED_STEPS:-4}
BATCH=${BATCH:-4}
CASES=${CASES:-frozen trained}
MODEL=${MODEL:-bench/models/bench25m-llava}
IMAGES=${IMAGES:-../shared/assets/images}
TOP_OPS=${TOP_OPS:-0}
PYTHON=${PYTHON:-/usr/bin/python3}
BENCH_MODEL=bench/models/bench25m-llava

BENCH_BIN=$BUILD_DIR/bin/swiftcpp_bench_mm_train
if [[ ! -x $BENCH_BIN ]]; then
    echo "error: $BENCH_BIN not found. Build first: cmake --build $BUILD_DIR --target swiftcpp_bench_mm_train" >&2
    exit 1
fi
for v in RUNS THREADS STEPS PROFILED_STEPS BATCH; do
    if [[ ! ${!v} =~ ^[1-9][0-9]*$ ]]; then
        echo "error: $v must be a positive integer (got '${!v}')" >&2
        exit 1
    fi
done
for v in WARMUP TOP_OPS; do
    if [[ ! ${!v} =~ ^[0-9]+$ ]]; then
        echo "error: $v must be a non-negative integer (got '${!v}')" >&2
        exit 1
    fi
done
for c in $CASES; do
    if [[ ! $c =~ ^(frozen|trained)$ ]]; then
        echo "error: unknown case '$c' (frozen or trained)" >&2
        exit 1
    fi
done
if [[ ! -d $IMAGES ]]; then
    echo "error: $IMAGES not found (the five test images of the shared assets, ../shared next to this checkout)" >&2
    exit 1
fi

if [[ $MODEL == "$BENCH_MODEL" && ! -f $MODEL/config.json ]]; then
    echo "generating $MODEL ..." >&2
    "$PYTHON" scripts/make_bench_llava.py --out "$MODEL" >&2
fi
if [[ ! -f $MODEL/config.json || ! -f $MODEL/model.safetensors || ! -f $MODEL/preprocessor_config.json ]]; then
    echo "error: $MODEL is not a LLaVA checkpoint folder (config.json, model.safetensors, preprocessor_config.json)" >&2
    exit 1
fi

export OMP_NUM_THREADS=$THREADS
export OPENBLAS_NUM_THREADS=$THREADS

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/mm-train-$STAMP
mkdir -p "$OUT"

for c in $CASES; do
    args=(--model "$MODEL" --images "$IMAGES" --batch "$BATCH" --warmup "$WARMUP" --steps "$STEPS"
          --profiled-steps "$PROFILED_STEPS" --runs "$RUNS" --threads "$THREADS" --top-ops "$TOP_OPS")
    [[ $c == trained ]] && args+=(--train-vit)
    echo "[$c] $BENCH_BIN ${args[*]}" >&2
    cut -d' ' -f1-3 /proc/loadavg >"$OUT/$c.load-start"
    if ! "$BENCH_BIN" "${args[@]}" >"$OUT/$c.json" 2>"$OUT/$c.log"; then
        echo "error: $BENCH_BIN failed for case $c; see $OUT/$c.log" >&2
        tail -n 20 "$OUT/$c.log" >&2 || true
        exit 1
    fi
    cut -d' ' -f1-3 /proc/loadavg >"$OUT/$c.load-end"
done

"$PYTHON" - "$OUT" $CASES <<'EOF' | tee "$OUT/report.md"
import json
import os
import sys

out, cases = sys.argv[1], sys.argv[2:]
rows = []
for c in cases:
    with open(os.path.join(out, c + ".json")) as fh:
        r = json.load(fh)
    r["load"] = [open(os.path.join(out, "%s.load-%s" % (c, w))).read().split()[0] for w in ("start", "end")]
    rows.append(r)

first = rows[0]
print("Batch %d (one %d-token image run + 64 text tokens each: %d tokens, %d images a step), %d threads, "
      "%d warm-up + %d timed steps per run, %d runs; split: median of %d profiled steps (%d a run)."
      % (first["batch"], first["image_tokens_per_step"] // first["batch"], first["tokens_per_step"],
         first["images_per_step"], first["threads"], first["warmup"], first["steps"], first["runs"],
         first["split"]["steps"], first["profiled_steps"]))
print()
print("| case | trainable | step ms, median [min-max] of runs | tokens/s | images/s | tower runs / step "
      "| images through the tower / images in the step | load average (1 min) start / end |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    runs = r["tower_runs_per_step_min"], r["tower_runs_per_step_max"]
    imgs = r["tower_images_per_step_min"], r["tower_images_per_step_max"]
    fmt_range = lambda p: str(p[0]) if p[0] == p[1] else "%d-%d" % p
    print("| %s | %.2fM | %.0f [%.0f-%.0f] | %.0f | %.2f | %s | %s / %d%s | %s / %s |"
          % (r["case"], r["trainable_parameters"] / 1e6, r["step_ms_median"], r["step_ms_min"], r["step_ms_max"],
             r["tokens_per_s"], r["images_per_s"], fmt_range(runs), fmt_range(imgs), r["images_per_step"],
             "" if r["tower_images_equal_step_images"] else " (MISMATCH)", r["load"][0], r["load"][1]))
print()
print("| case | profiled step ms (vs unprofiled) | tower forward | tower backward | projector forward + backward "
      "| language model forward | language model backward | optimizer |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    s = r["split"]
    total = s["step_ms"]
    cell = lambda ms: "%.0f (%.1f%%)" % (ms, 100.0 * ms / total)
    unprof = r["step_ms_median"]
    print("| %s | %.0f (%+.1f%%) | %s | %s | %s | %s | %s | %s |"
          % (r["case"], total, 100.0 * (total / unprof - 1), cell(s["tower_fwd_ms"]), cell(s["tower_bwd_ms"]),
             cell(s["projector_fwd_ms"] + s["projector_bwd_ms"]), cell(s["lm_fwd_ms"]), cell(s["lm_bwd_ms"]),
             cell(s["optimizer_ms"])))
EOF
echo "(raw results and logs: $OUT)" >&2
