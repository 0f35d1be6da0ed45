#!/usr/bin/env bash
# GPU check: on a machine whose python3 has a CUDA PyTorch, configures swiftcpp against that LibTorch 2.x,
# builds it, runs the test suite with the device-aware tests on CUDA, and runs the inference benchmark on CUDA
# and CPU. Prints a summary to paste into docs/benchmarks.md; copies logs to $OUT (or ./gpu_check_out).
#
#   bash scripts/gpu_check.sh
#
# Debian -dev packages (fmt, nlohmann-json, CLI11, GoogleTest, sentencepiece) are taken from the system when
# present, else from .debs/ (prepared by scripts/fetch_gpu_debs.sh on a Debian machine), unpacked to a prefix.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || { log "python3 has no torch"; exit 1; }
log "torch $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/== gpu: /' | tee -a "$OUT/summary.txt"

PREFIX="$TORCH_PREFIX"
LIBPATH=""
if [ -d .debs ] && ls .debs/*.deb >/dev/null 2>&1; then
  DEBROOT=/tmp/swiftcpp_debroot
  mkdir -p "$DEBROOT"
  for f in .debs/*.deb; do dpkg -x "$f" "$DEBROOT"; done
  PREFIX="$PREFIX;$DEBROOT/usr;$DEBROOT/usr/lib/x86_64-linux-gnu/cmake;$DEBROOT/usr/share/cmake;$DEBROOT/usr/lib/cmake"
  LIBPATH="$DEBROOT/usr/lib/x86_64-linux-gnu"
  export LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  log "using Debian packages unpacked from .debs/ into $DEBROOT"
fi
JOBS=$(nproc)

log "configure"
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DCMAKE_INCLUDE_PATH="${DEBROOT:-/nonexistent}/usr/include" -DCMAKE_LIBRARY_PATH="${LIBPATH:-/nonexistent}" \
  > "$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; log "configure FAILED"; exit 1; }
grep "swiftcpp:" "$OUT/configure.log" | tee -a "$OUT/summary.txt"

log "build"
start=$(date +%s)
cmake --build build-cuda -j "$JOBS" > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60; log "build FAILED"; exit 1; }
log "build took $(( $(date +%s) - start )) s"

log "tests (device-aware tests on cuda)"
SWIFTCPP_TEST_DEVICE=cuda ctest --test-dir build-cuda --output-on-failure -j "$JOBS" > "$OUT/ctest.log" 2>&1
rc=$?
tail -15 "$OUT/ctest.log" | tee -a "$OUT/summary.txt"
SWIFTCPP_TEST_DEVICE=cuda build-cuda/bin/swiftcpp_tests --gtest_filter='GoldenLogits.*:Generate.*:Attention.*' 2>&1 \
  | grep -E "max \||OK|FAILED|SKIPPED" | tee -a "$OUT/summary.txt"

log "benchmark"
BENCH_MODEL=bench/models/bench25m
[ -f "$BENCH_MODEL/model.safetensors" ] || python3 scripts/make_bench_model.py --out "$BENCH_MODEL" >> "$OUT/bench.log" 2>&1
for model in models/stories260K "$BENCH_MODEL"; do
  for cfg in "cuda float32" "cuda bfloat16" "cpu float32"; do
    set -- $cfg
    threads=2; [ "$1" = cuda ] && threads=$JOBS
    line=$(build-cuda/bin/swiftcpp_bench_infer --model "$model" --device "$1" --dtype "$2" --threads "$threads" \
      --prompt-len 128 --new-tokens 128 --runs 3 2>>"$OUT/bench.log")
    echo "$line" >> "$OUT/bench.jsonl"
    python3 - "$line" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
r = json.loads(sys.argv[1])
print(f"| {r['model']} | {r['device']} | {r['dtype']} | prefill {r['prefill_tok_s']['median']:.0f} tok/s | "
      f"decode {r['decode_tok_s']['median']:.0f} tok/s | peak RSS {r['peak_rss_mb']:.0f} MB |")
PY
  done
done
log "ctest exit code $rc"
exit $rc
