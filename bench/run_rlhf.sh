#!/usr/bin/env bash
# swiftcpp preference-training cost: a DPO step against an SFT step over the same tokens on bench25m with LoRA
# (r 16, alpha 32, all linear layers), through the real Trainer (how the data and steps are made: the header of
# bench/bench_rlhf.cpp). Builds nothing.
#
#   bash bench/run_rlhf.sh      (after: cmake --build build --target swiftcpp_bench_rlhf)
#
# Objectives, run interleaved (sft, dpo, dpo-precomputed, sft, ...) RUNS times, one process each so that each peak
# RSS is its own: sft (token cross-entropy over the 2 x PAIRS rows), dpo (policy forward + backward of both answers
# in one concatenated batch + the reference forward without autograd: the LoRA base, adapters off) and
# dpo-precomputed (the reference log-probabilities computed once before the timed steps). Prints a markdown table
# for docs/benchmarks.md with each objective's median step time, its ratio to sft, peak RSS and peak tensor memory
# and their ratios; raw JSON and the table go to bench/results/rlhf-<UTC timestamp>/.
#
# Environment knobs (defaults in brackets):
#   BUILD_DIR [build]  RUNS [3]  THREADS [2]  WARMUP [3]  STEPS [10]  PAIRS [2]  PROMPT [256]  ANSWER [256]
#   MODEL [bench/models/bench25m]  PYTHON [/usr/bin/python3]
#   IMAGE [unset] a JPEG/PNG each prompt holds, for a vision-language MODEL: with images, SFT trains each row with
#   its own copy of the image and DPO encodes a prompt's image once for both answers. With IMAGE set, MODEL
#   defaults to bench/models/bench25m-qwen2-vl (scripts/make_bench_qwen2_vl.py; coffee.jpg takes 580 tokens there)
#   and PROMPT to 768:
#     IMAGE=../shared/assets/images/coffee.jpg bash bench/run_rlhf.sh
# PAIRS 2 x (PROMPT 256 + ANSWER 256) is the standard 4 x 512 training batch. About 5 minutes on the idle 2-core
# dev machine.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
WARMUP=${WARMUP:-3}
STEPS=${STEPS:-10}
PAIRS=${PAIRS:-2}
IMAGE=${IMAGE:-}
if [[ -n $IMAGE ]]; then
    PROMPT=${PROMPT:-768}
    MODEL=${MODEL:-bench/models/bench25m-qwen2-vl}
    [[ -f $IMAGE ]] || { echo "error: IMAGE $IMAGE not found" >&2; exit 1; }
fi
PROMPT=${PROMPT:-256}
ANSWER=${ANSWER:-256}
MODEL=${MODEL:-bench/models/bench25m}
PYTHON=${PYTHON:-/usr/bin/python3}

BENCH_BIN=$BUILD_DIR/bin/swiftcpp_bench_rlhf
if [[ ! -x $BENCH_BIN ]]; then
    echo "error: $BENCH_BIN not found. Build first: cmake --build $BUILD_DIR --target swiftcpp_bench_rlhf" >&2
    exit 1
fi
for v in RUNS THREADS WARMUP STEPS PAIRS PROMPT ANSWER; do
    if [[ ! ${!v} =~ ^[0-9]+$ ]] || [[ ${!v} -lt 1 ]]; then
        echo "error: $v must be a positive integer (got '${!v}')" >&2
        exit 1
    fi
done
if [[ ! -f $MODEL/config.json ]]; then
    case $MODEL in
        bench/models/bench25m) "$PYTHON" scripts/make_bench_model.py --out "$MODEL" ;;
        bench/models/bench25m-qwen2-vl) "$PYTHON" scripts/make_bench_qwen2_vl.py --out "$MODEL" >&2 ;;
        *) echo "error: $MODEL/config.json not found" >&2; exit 1 ;;
    esac
fi
# Every side runs with the same BLAS settings (../shared/docs/BENCHMARKS.md).
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
IMAGE_ARGS=()
[[ -z $IMAGE ]] || IMAGE_ARGS=(--image "$IMAGE")

OUT=bench/results/rlhf-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/machine.txt"
for run in $(seq 1 "$RUNS"); do
    for objective in sft dpo dpo-precomputed; do
        echo "run $run/$RUNS: $objective" >&2
        "$BENCH_BIN" --model "$MODEL" --objective "$objective" --pairs "$PAIRS" --prompt "$PROMPT" --answer "$ANSWER" \
            --warmup "$WARMUP" --steps "$STEPS" --threads "$THREADS" "${IMAGE_ARGS[@]}" | tee -a "$OUT/results.jsonl"
    done
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"

"$PYTHON" - "$OUT/results.jsonl" <<'PY' | tee "$OUT/report.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["objective"], []).append(r)
def med(obj, key):
    return statistics.median(r[key] for r in by[obj])
base_s, base_rss, base_t = med("sft", "step_s_median"), med("sft", "peak_rss_mib"), med("sft", "peak_tensor_mib")
r0 = rows[0]
image = f", each prompt holding {r0['image']} ({r0['image_tokens']} image tokens)" if r0.get("image") else ""
print(f"{r0['model']} LoRA r16, {r0['pairs']} pairs x ({r0['prompt']} prompt + {r0['answer']} answer) tokens = "
      f"{2 * r0['pairs']} rows{image}; {r0['threads']} threads; median of {len(by['sft'])} runs x {r0['steps']} steps")
print()
print("| objective | step s (median, min-max of runs) | x SFT | of which reference forward s | peak RSS MiB | x SFT | peak tensor MiB | x SFT |")
print("|---|---|---|---|---|---|---|---|")
for obj in ["sft", "dpo", "dpo-precomputed"]:
    s = [r["step_s_median"] for r in by[obj]]
    ref = [r["reference_s_median"] for r in by[obj] if "reference_s_median" in r]
    ref_text = f"{statistics.median(ref):.3f}" if ref else "-"
    print(f"| {obj} | {statistics.median(s):.3f} ({min(s):.3f}-{max(s):.3f}) | {med(obj, 'step_s_median') / base_s:.3f} | {ref_text} | "
          f"{med(obj, 'peak_rss_mib'):.0f} | {med(obj, 'peak_rss_mib') / base_rss:.3f} | "
          f"{med(obj, 'peak_tensor_mib'):.0f} | {med(obj, 'peak_tensor_mib') / base_t:.3f} |")
PY
