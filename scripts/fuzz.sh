#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, SWIFTCPP_FUZZ=ON) with clang in build-fuzz/ and runs each for SECONDS
# (default 600) from a copy of its seed corpus. Writes one summary line per target (executions, crashes) to stdout
# and build-fuzz/fuzz-summary.txt; exits non-zero when any target crashed (or failed to run).
#   scripts/fuzz.sh [SECONDS] [TARGET...]      FUZZ_JOBS=2 runs two targets at once; FUZZ_NICE=19 renices them;
#   FUZZ_MAX_LEN caps the input size of the text-format targets (default 65536); SWIFTCPP_SHARED_DIR overrides ../shared.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-600}"
shift || true
jobs="${FUZZ_JOBS:-1}"
build="$root/build-fuzz"
shared="${SWIFTCPP_SHARED_DIR:-$root/../shared}"

# Every fuzz/fuzz_*.cpp is a target (fuzz/CMakeLists.txt builds them all).
all_targets=()
for f in "$root"/fuzz/fuzz_*.cpp; do all_targets+=("$(basename "$f" .cpp)"); done
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")

# Debian's clang with its compiler-rt (libFuzzer, ASan, UBSan).
for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool not found; install: apt-get install clang libclang-rt-14-dev" >&2; exit 2; }
done
rt_dir="$(clang --print-resource-dir)/lib/linux"
if ! ls "$rt_dir"/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "fuzz.sh: libFuzzer runtime missing under $rt_dir; install: apt-get install libclang-rt-14-dev" >&2
  exit 2
fi

if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWIFTCPP_FUZZ=ON \
    -DSWIFTCPP_BUILD_TESTS=OFF -DSWIFTCPP_BUILD_BENCH=OFF
fi
nice -n 10 cmake --build "$build" -j "${FUZZ_BUILD_JOBS:-2}" --target "${targets[@]}"

# Big seeds that stay in ../shared (read at run time when present).
extra_seeds() {
  local a="$shared/assets"
  case "$1" in
    fuzz_gguf) ls "$a"/tokenizers/llamacpp-vectors/*.gguf 2>/dev/null || true ;;
    fuzz_safetensors) ls "$a"/models/*/model.safetensors 2>/dev/null || true ;;
    fuzz_sentencepiece) ls "$a"/tokenizers/llama2/tokenizer.model "$a"/models/*/tokenizer.model 2>/dev/null || true ;;
    fuzz_dataset) find "$a/data/sft" -type f \( -name '*.jsonl' -o -name '*.json' \) -size -512k 2>/dev/null || true ;;
  esac
}

run_one() {
  local t="$1" work="$build/fuzz-work/$t" log="$build/fuzz-logs/$t.log"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts" "$build/fuzz-logs"
  if [ -d "$root/fuzz/corpus/$t" ]; then cp -r "$root/fuzz/corpus/$t/." "$work/corpus/"; fi
  # libFuzzer reads seeds from folders: the big ones are copied into a second, read-only one.
  local seeds=()
  while IFS= read -r f; do
    if [ -n "$f" ]; then
      mkdir -p "$work/shared-seeds"
      cp "$f" "$work/shared-seeds/$(echo "$f" | tr '/' '_')"
      seeds=("$work/shared-seeds")
    fi
  done < <(extra_seeds "$t")
  local dict=()
  if [ -f "$root/fuzz/$t.dict" ]; then dict=("-dict=$root/fuzz/$t.dict"); fi
  # Text formats gain little from inputs the size of the biggest shared seed (half a megabyte of dataset rows
  # runs at ~20 executions/s under ASan); binary formats keep their whole seeds (GGUF's tensor data is at the end).
  local max_len=()
  case "$t" in
    fuzz_gguf|fuzz_safetensors|fuzz_sentencepiece) ;;
    *) max_len=("-max_len=${FUZZ_MAX_LEN:-65536}") ;;
  esac
  local rc=0
  (cd "$work" && ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}" \
     UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
     nice -n "${FUZZ_NICE:-0}" "$build/bin/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
     -malloc_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${dict[@]}" "${max_len[@]}" \
     "$work/corpus" "${seeds[@]}") >"$log" 2>&1 || rc=$?
  local execs crashes
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)"
  crashes="$(find "$work/artifacts" -type f | wc -l)"
  local state="ok"
  [ "$rc" -ne 0 ] && state="FAILED (exit $rc; $log)"
  printf '%-24s seconds %-5s executions %-10s crashes %-3s corpus %-6s %s\n' "$t" "$seconds" "${execs:-?}" \
    "$crashes" "$(find "$work/corpus" -type f | wc -l)" "$state" >"$work/summary.txt"
  cat "$work/summary.txt"
  [ "$rc" -eq 0 ] && [ "$crashes" -eq 0 ]
}

status=0
pids=()
names=()
wait_one() {
  if ! wait "${pids[0]}"; then status=1; fi
  pids=("${pids[@]:1}")
  names=("${names[@]:1}")
}
for t in "${targets[@]}"; do
  while [ ${#pids[@]} -ge "$jobs" ]; do wait_one; done
  run_one "$t" &
  pids+=($!)
  names+=("$t")
done
while [ ${#pids[@]} -gt 0 ]; do wait_one; done

: >"$build/fuzz-summary.txt"
for t in "${targets[@]}"; do
  cat "$build/fuzz-work/$t/summary.txt" >>"$build/fuzz-summary.txt" 2>/dev/null || echo "$t no summary" >>"$build/fuzz-summary.txt"
done
echo "summary: $build/fuzz-summary.txt"
exit "$status"
