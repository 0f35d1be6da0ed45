#!/usr/bin/env bash
# Skrull benchmark: the schedulers compared (a) by the cost model at the paper's scale and (b) in real training runs
# with 2 and 4 Gloo processes on this machine.
#
#   bash bench/run_skrull.sh        (after a Release build)
#
# (a) build/bin/swiftcpp_skrull_model: LONG_CONTEXT.md's settings (0.5B-like at DP 4 x CP 8, 7B-like at DP 2 x CP 16,
#     the three length distributions, 20 global batches of 128), paper device constants; no training.
# (b) bench25m with LoRA (r 16, alpha 32, all projections), one global batch of BATCH samples per step drawn from each
#     distribution by skrull::sample_lengths with every length divided by SCALE (a CPU scale; LONG_CONTEXT.md), cut
#     to bench25m's 2048 positions. Each sample is a chat row whose reply is " 7" repeated (two Llama 2 tokens per
#     repeat), so lengths are met to within the template's few tokens. 2 processes: DP 2, 2048 tokens per process
#     and micro-batch; 4 processes: DP 2 x CP 2, 1024 tokens per process (samples over 1024 tokens are sharded or
#     not as each scheduler decides). Every scheduler trains the same batches; the device profile is measured once
#     per process count (by the first run) and given to all the others. Steps 2.. are reported (step 1 warms up).
# Everything lands in bench/results/skrull-<UTC stamp>/; report.md there is what docs/benchmarks.md quotes.
#
# Environment knobs (defaults in brackets): BUILD_DIR [build]  BATCH [32]  STEPS [4]  SCALE [32]
#   SHARED [../shared/assets]  PYTHON [/usr/bin/python3]  WORLDS ["2 4"]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
BATCH=${BATCH:-32}
STEPS=${STEPS:-4}
SCALE=${SCALE:-32}
SHARED=${SHARED:-../shared/assets}
PYTHON=${PYTHON:-/usr/bin/python3}
WORLDS=${WORLDS:-"2 4"}
BIN=$BUILD_DIR/bin/swiftcpp
MODELBIN=$BUILD_DIR/bin/swiftcpp_skrull_model
SCHEDULERS="skrull skrull_paper round_robin sorted flops_balanced"
DISTS="wikipedia_zh lmsys_chat_1m chatqa2_long_sft"

for f in "$BIN" "$MODELBIN"; do
    [[ -x $f ]] || { echo "error: $f not found; build first (cmake -S . -B $BUILD_DIR && cmake --build $BUILD_DIR --target swiftcpp bench)" >&2; exit 1; }
done
[[ -f $SHARED/tokenizers/llama2/tokenizer.model ]] || { echo "error: $SHARED/tokenizers/llama2 not found" >&2; exit 1; }
[[ -d bench/models/bench25m ]] || "$PYTHON" scripts/make_bench_model.py --out bench/models/bench25m >&2

OUT=bench/results/skrull-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$OUT/machine.txt"

# (a) the cost model at paper scale.
"$MODELBIN" > "$OUT/modelled.md"

# (b) bench25m with the Llama 2 tokenizer its vocabulary is made for.
model=$OUT/bench25m
mkdir -p "$model"
for f in bench/models/bench25m/*; do ln -sf "$(realpath "$f")" "$model/"; done
cp "$SHARED/tokenizers/llama2/tokenizer.model" "$model/"
for dist in $DISTS; do
    "$MODELBIN" --sample "$dist" --scale "$SCALE" --batch-size "$BATCH" --batches "$STEPS" --seed 1 > "$OUT/$dist.lengths"
    "$PYTHON" - "$OUT/$dist.lengths" "$OUT/$dist.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        n = min(int(line), 2000)  # bench25m has 2048 positions; the template adds a few tokens
        reply = " 7" * max(1, (n - 12) // 2)
        out.write(json.dumps({"messages": [{"role": "user", "content": "Count."},
                                           {"role": "assistant", "content": reply}]}) + "\n")
EOF
done

for world in $WORLDS; do
    if [[ $world == 2 ]]; then cp=1; budget=2048; else cp=2; budget=1024; fi
    dp=$((world / cp))
    ga=$((BATCH / dp))
    profile=""
    for dist in $DISTS; do
        for sched in $SCHEDULERS; do
            run=$OUT/w$world-$dist-$sched
            extra=()
            [[ -n $profile ]] && extra=("skrull_profile=$profile")
            "$BIN" train --nproc-per-node "$world" model="$model" dataset="$OUT/$dist.jsonl" template=default \
                max_length=2048 truncation_strategy=right dataset_shuffle=false per_device_train_batch_size=1 \
                gradient_accumulation_steps="$ga" max_steps="$STEPS" logging_steps=1 save_steps=100000 \
                save_only_model=true lora_rank=16 lora_alpha=32 lora_dropout=0 learning_rate=1e-4 \
                scheduler="$sched" context_parallel_size="$cp" skrull_budget="$budget" output_dir="$run" \
                "${extra[@]}" > "$run.stdout" 2> "$run.log"
            runs=("$run"/v*)
            [[ -z $profile ]] && profile=$(realpath "${runs[0]}/device_profile.json")
            echo "$world processes, $dist, $sched: $(grep -c '"loss"' "${runs[0]}/logging.jsonl") steps" >&2
        done
    done
done

"$PYTHON" bench/report_skrull.py "$OUT" | tee "$OUT/report.md"
