#!/usr/bin/env bash
# Vision-language memory: peak memory and time of one image through Qwen2-VL and Qwen2.5-VL (the tiny reference
# checkpoints of ../shared/assets/reference), at image sizes up to the class default max_pixels (1,003,520) and
# beyond, for two builds side by side. Each run is `swiftcpp infer` with the image resized to exactly PIXELS
# pixels (min_pixels = max_pixels = PIXELS; coffee.jpg, 600x400, upscaled by smart_resize) and one new token, so the
# figures are the vision tower's and the language model's prefill over the image's tokens. Reported per run: the
# tensor peak infer prints (LibTorch's CPU allocations, counted), the peak resident set (/usr/bin/time) and the
# wall time. Rounds alternate (old new old new ...), one measurement each per size and model.
#
#   bash bench/run_vision_memory.sh OLD_BIN NEW_BIN
#
# OLD_BIN and NEW_BIN are folders holding a swiftcpp binary (a build's bin/, or a copy of it made before
# rebuilding: `cp -r build/bin /tmp/old-bin`). A run that fails (out of memory, refused) is recorded with its exit
# status and its last line. Knobs: ROUNDS [2]  THREADS [2]  SIZES ["501760 1003520 2007040 4014080"]
# MODELS ["qwen2_vl qwen2_5_vl"]  IMAGE [../shared/assets/images/coffee.jpg]  PYTHON [/usr/bin/python3]
# Results (one JSON line per run, the load after each, the machine) go to bench/results/vision-memory-<UTC>/ and
# the table (bench/report_vision_memory.py) to its table.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[[ $# -eq 2 ]] || { echo "usage: bash bench/run_vision_memory.sh OLD_BIN NEW_BIN" >&2; exit 2; }
OLD=$1
NEW=$2
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-2}
SIZES=${SIZES:-501760 1003520 2007040 4014080}
MODELS=${MODELS:-qwen2_vl qwen2_5_vl}
IMAGE=${IMAGE:-../shared/assets/images/coffee.jpg}
PYTHON=${PYTHON:-/usr/bin/python3}
REF=${REF:-../shared/assets/reference}
for d in "$OLD" "$NEW"; do
    [[ -x $d/swiftcpp ]] || { echo "error: $d/swiftcpp not found (cmake --build BUILD --target swiftcpp)" >&2; exit 1; }
done
[[ -f $IMAGE ]] || { echo "error: $IMAGE not found (../shared/assets is needed)" >&2; exit 1; }
[[ -x /usr/bin/time ]] || { echo "error: /usr/bin/time not found (apt-get install time)" >&2; exit 1; }
# Every side runs with the same BLAS settings (../shared/docs/BENCHMARKS.md).
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

model_dir() {
    case $1 in
        qwen2_vl) echo "$REF/qwen2_vl/tiny-qwen2-vl" ;;
        qwen2_5_vl) echo "$REF/qwen2_5_vl/tiny-qwen2.5-vl" ;;
        *) echo "error: unknown model $1 (qwen2_vl, qwen2_5_vl)" >&2; exit 2 ;;
    esac
}
for m in $MODELS; do
    [[ -f $(model_dir "$m")/config.json ]] || { echo "error: $(model_dir "$m") not found" >&2; exit 1; }
done

OUT=bench/results/vision-memory-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    echo "old: $OLD"
    echo "new: $NEW"
    echo "rounds: $ROUNDS, threads: $THREADS, sizes: $SIZES, image: $IMAGE"
} > "$OUT/machine.txt"

RUNS=$OUT/runs.jsonl
for r in $(seq "$ROUNDS"); do
    for m in $MODELS; do
        for px in $SIZES; do
            for side in old new; do
                bin=$OLD
                [[ $side == new ]] && bin=$NEW
                echo "round $r/$ROUNDS: $m $px pixels, $side" >&2
                log=$OUT/$m.$px.$side.r$r.log
                set +e
                /usr/bin/time -f 'time: %M %e' -o "$log.time" "$bin/swiftcpp" infer --model "$(model_dir "$m")" \
                    --image "$IMAGE" --prompt "Describe the image." --max-new-tokens 1 --temperature 0 \
                    --min-pixels "$px" --max-pixels "$px" --threads "$THREADS" --no-stream > "$log" 2>&1
                rc=$?
                set -e
                "$PYTHON" - "$log" "$log.time" "$m" "$px" "$side" "$r" "$rc" "$(cut -d' ' -f1-3 /proc/loadavg)" \
                    >> "$RUNS" <<'EOF'
import json, re, sys
log, timing, model, px, side, rnd, rc, load = sys.argv[1:]
text = open(log, errors="replace").read()
tensors = re.search(r"peak memory: (\d+) MiB resident, (\d+) MiB of tensors", text)
t = re.search(r"time: (\d+) ([\d.]+)", open(timing).read())
lines = [l for l in text.splitlines() if l.strip()]
print(json.dumps({"model": model, "pixels": int(px), "side": side, "round": int(rnd), "rc": int(rc),
                  "tensor_peak_mib": int(tensors.group(2)) if tensors else None,
                  "rss_peak_mib": round(int(t.group(1)) / 1024) if t else None,
                  "seconds": float(t.group(2)) if t else None, "load": load,
                  "last_line": lines[-1][:200] if lines else ""}))
EOF
            done
        done
    done
done
"$PYTHON" bench/report_vision_memory.py "$OUT" | tee "$OUT/table.md"
