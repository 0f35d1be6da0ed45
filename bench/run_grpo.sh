#!/usr/bin/env bash
# GRPO rollout speed and step time split: `swiftcpp rlhf` with rlhf_type grpo on bench25m (LoRA r 16, alpha 32, all
# linear layers, beta 0.04 so every step runs the reference forward) against plain batched `swiftcpp infer` of the
# same prompts, each repeated num_generations times, with the same sampling settings and new-token budget, once on
# the base model and once with the run's adapter. Builds nothing.
#
#   bash bench/run_grpo.sh      (after: cmake --build build)
#
# Per run (RUNS times, interleaved grpo / infer base / infer adapter): a GRPO job of STEPS steps of PROMPTS prompts x
# GENERATIONS completions of up to NEW tokens (bench25m's random weights never sample EOS, so every completion is
# NEW tokens long), rewarded by recipes/rewards/mentions_target.sh; then infer on the same PROMPTS x GENERATIONS rows
# in one batch. Reports the rollout tokens/s (median over the steps after the first) against infer's tokens/s, and
# the step's time split (rollout, reward, reference, policy). Raw files and the table go to
# bench/results/grpo-<UTC timestamp>/.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3]  THREADS [2]  STEPS [4]  PROMPTS [2]  GENERATIONS [8]  NEW [64]
#   MODEL [bench/models/bench25m]  PYTHON [/usr/bin/python3]  SHARED [../shared/assets] (the Llama 2 tokenizer
#   bench25m's vocabulary is made for)
# About 6 minutes on the idle 2-core dev machine.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
STEPS=${STEPS:-4}
PROMPTS=${PROMPTS:-2}
GENERATIONS=${GENERATIONS:-8}
NEW=${NEW:-64}
MODEL=${MODEL:-bench/models/bench25m}
PYTHON=${PYTHON:-/usr/bin/python3}
SHARED=${SHARED:-../shared/assets}

BIN=$BUILD_DIR/bin/swiftcpp
if [[ ! -x $BIN ]]; then
    echo "error: $BIN not found. Build first: cmake --build $BUILD_DIR" >&2
    exit 1
fi
for v in RUNS THREADS STEPS PROMPTS GENERATIONS NEW; do
    if [[ ! ${!v} =~ ^[0-9]+$ ]] || [[ ${!v} -lt 1 ]]; then
        echo "error: $v must be a positive integer (got '${!v}')" >&2
        exit 1
    fi
done
if [[ $STEPS -lt 2 ]]; then
    echo "error: STEPS must be at least 2 (the first step is not timed)" >&2
    exit 1
fi
if [[ ! -f $MODEL/config.json ]]; then
    if [[ $MODEL != bench/models/bench25m ]]; then
        echo "error: $MODEL/config.json not found" >&2
        exit 1
    fi
    "$PYTHON" scripts/make_bench_model.py --out "$MODEL"
fi

[[ -f $SHARED/tokenizers/llama2/tokenizer.model ]] ||
    { echo "error: $SHARED/tokenizers/llama2/tokenizer.model not found (bench25m needs a 32000-token tokenizer)" >&2; exit 1; }

OUT=bench/results/grpo-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT/model"
for f in "$MODEL"/*; do ln -sf "$(realpath "$f")" "$OUT/model/"; done
cp "$SHARED/tokenizers/llama2/tokenizer.model" "$OUT/model/"
MODEL=$OUT/model
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/machine.txt"
DATA=tests/data/grpo/story_names.jsonl
# The prompts every step of the GRPO job sees, repeated GENERATIONS times, for infer (dataset_shuffle false: the
# job takes the file's first PROMPTS x STEPS rows in order; infer gets the first step's).
head -n "$PROMPTS" "$DATA" > "$OUT/prompts.jsonl"
: > "$OUT/infer_prompts.jsonl"
while IFS= read -r row; do
    for _ in $(seq 1 "$GENERATIONS"); do echo "$row" >> "$OUT/infer_prompts.jsonl"; done
done < "$OUT/prompts.jsonl"
BATCH=$((PROMPTS * GENERATIONS))
SAMPLING="--temperature 0.9 --top-k 50 --top-p 0.9 --max-new-tokens $NEW --ignore-eos"
for run in $(seq 1 "$RUNS"); do
    echo "run $run/$RUNS: grpo" >&2
    rm -rf "$OUT/grpo-$run"
    "$BIN" --threads "$THREADS" rlhf rlhf_type=grpo model="$MODEL" dataset="$DATA" template=raw dataset_shuffle=false \
        output_dir="$OUT/grpo-$run" "reward_funcs=external:sh recipes/rewards/mentions_target.sh" \
        num_generations="$GENERATIONS" max_completion_length="$NEW" per_device_train_batch_size="$BATCH" \
        gradient_accumulation_steps=1 max_steps="$STEPS" save_steps="$STEPS" logging_steps=1 beta=0.04 \
        lora_rank=16 lora_alpha=32 lora_dropout=0 learning_rate=1e-4 seed=1 > "$OUT/grpo-$run.out" 2> "$OUT/grpo-$run.err"
    adapter=$(tail -n 1 "$OUT/grpo-$run.out")
    for mode in base adapter; do
        echo "run $run/$RUNS: infer $mode" >&2
        extra=""
        [[ $mode == adapter ]] && extra="--adapters $adapter"
        "$BIN" --threads "$THREADS" infer --model "$MODEL" --template raw --prompts-file "$OUT/infer_prompts.jsonl" \
            --output "$OUT/infer-$mode-$run.jsonl" --batch-size "$BATCH" $SAMPLING --seed 1 $extra 2> "$OUT/infer-$mode-$run.err"
    done
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"

"$PYTHON" - "$OUT" "$RUNS" "$THREADS" "$PROMPTS" "$GENERATIONS" "$NEW" <<'PY' | tee "$OUT/report.md"
import glob, json, os, re, statistics, sys
out, runs, threads, prompts, gens, new = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
def infer_tps(path):
    m = re.findall(r"\(([0-9.]+) tokens/s\)", open(path).read())
    return float(m[-1])
grpo, split = [], {k: [] for k in ("time/rollout_s", "time/reward_s", "time/reference_s", "time/policy_s")}
for r in range(1, runs + 1):
    log = glob.glob(os.path.join(out, f"grpo-{r}", "v*", "logging.jsonl"))[0]
    rows = [json.loads(l) for l in open(log) if l.strip()]
    rows = [j for j in rows if "rollout_tokens_per_s" in j and j["global_step"] > 1]
    grpo.append(statistics.median(j["rollout_tokens_per_s"] for j in rows))
    for k in split:
        split[k].append(statistics.median(j[k] for j in rows))
base = [infer_tps(os.path.join(out, f"infer-base-{r}.err")) for r in range(1, runs + 1)]
adapter = [infer_tps(os.path.join(out, f"infer-adapter-{r}.err")) for r in range(1, runs + 1)]
def fmt(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
print(f"bench25m, LoRA r16 policy, {prompts} prompts x {gens} completions x {new} new tokens per step "
      f"(temperature 0.9, top-k 50, top-p 0.9); {threads} threads; median of {runs} runs (min-max)")
print()
print("| generator | tokens/s | x infer (base) |")
print("|---|---|---|")
b = statistics.median(base)
print(f"| swiftcpp infer, base model, batch {int(prompts) * int(gens)} | {fmt(base)} | 1.00 |")
print(f"| swiftcpp infer, base + the run's adapter | {fmt(adapter)} | {statistics.median(adapter) / b:.2f} |")
print(f"| GRPO rollout (LoRA policy, engine batch {int(prompts) * int(gens)}) | {fmt(grpo)} | {statistics.median(grpo) / b:.2f} |")
print()
total = sum(statistics.median(v) for v in split.values())
print("| part of a GRPO step | s (median) | share |")
print("|---|---|---|")
for k, v in split.items():
    print(f"| {k[5:-2]} | {statistics.median(v):.3f} | {statistics.median(v) / total:.0%} |")
PY
