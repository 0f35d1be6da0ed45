#!/usr/bin/env bash
# The main job on the bundled model and data: a LoRA fine-tune of stories260K on the bundled Alpaca demo rows
# (recipes/quickstart.yaml), the validation loss before and after, then the base model's and the fine-tuned
# model's answers side by side (`swiftcpp infer` without and with `--adapters`).
#
#   bash scripts/quickstart.sh [key=value ...]     (after the build; extra arguments override recipe keys)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${BIN:-build/bin/swiftcpp}
MODEL=models/stories260K

start=$(date +%s)
checkpoint=$("$BIN" train --recipe recipes/quickstart.yaml "$@")
seconds=$(( $(date +%s) - start ))
run=$(dirname "$checkpoint")

evals=$(grep -o '"eval_loss":[0-9.eE+-]*' "$run/logging.jsonl" | cut -d: -f2)
first=$(echo "$evals" | head -n 1)
last=$(echo "$evals" | tail -n 1)
echo
echo "trained in ${seconds} s: $run"
awk -v a="$first" -v b="$last" 'BEGIN { printf "validation loss %.4f -> %.4f (%.1f%% lower)\n", a, b, 100 * (a - b) / a }'
echo "loss curve: $run/images/train_loss.svg, log: $run/logging.jsonl"

for prompt in "Give three tips for staying healthy." "Write a short story about a cat."; do
  echo
  echo "### prompt: $prompt"
  echo "--- base model:"
  "$BIN" infer --model "$MODEL" --template default --prompt "$prompt" --temperature 0 --max-new-tokens 60 2>/dev/null
  echo
  echo "--- with the adapter ($checkpoint):"
  "$BIN" infer --model "$MODEL" --adapters "$checkpoint" --template default --prompt "$prompt" --temperature 0 \
    --max-new-tokens 60 2>/dev/null
  echo
done
