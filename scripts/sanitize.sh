#!/usr/bin/env bash
# Builds the suite with sanitizers and runs it.
#
#   bash scripts/sanitize.sh [asan|tsan|all] [extra ctest arguments...]     (default: all)
#
# asan: AddressSanitizer + UndefinedBehaviorSanitizer (every finding fatal) over the whole suite, in build-asan/.
# tsan: ThreadSanitizer over the threaded parts, in build-tsan/: the data pipeline's workers, concurrent
#       tokenizer use, the gradient reducer (Gloo's threads), the launcher and the multi-process tests.
#
# Both run the suite at one intra-op thread (SWIFTCPP_TEST_THREADS=1): LibTorch's OpenMP runtime is not
# instrumented, so its worker pool would only add reports about code we do not own; the threads above are ours.
# A finding exits the process with a sanitizer's exit code, so the test that triggered it fails; the report is
# in the test's output (ctest --output-on-failure) and, for child processes, in build-*/sanitizer-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=${1:-all}
[ $# -gt 0 ] && shift
jobs=${SANITIZE_JOBS:-2}

configure_and_build() {  # folder, sanitizers
  local dir=$1 sanitize=$2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DSWIFTCPP_SANITIZE="$sanitize" -DSWIFTCPP_BUILD_BENCH=OFF -DSWIFTCPP_TEST_TIMEOUT=900 >/dev/null
  # The build runs the test binary to list its tests: no leak report there (the suite's own run checks leaks), and
  # the fixed address layout ThreadSanitizer needs (setarch -R, below).
  ASAN_OPTIONS=detect_leaks=0 nice -n "${SANITIZE_NICE:-0}" setarch "$(uname -m)" -R cmake --build "$dir" -j "$jobs"
}

run_asan() {
  configure_and_build build-asan address,undefined
  local logs=$root/build-asan/sanitizer-logs
  rm -rf "$logs" && mkdir -p "$logs"
  # detect_leaks: LeakSanitizer on; suppressions name the leaks of uninstrumented libraries we do not own.
  # verify_asan_link_order=0: one test preloads the reference BLAS (LD_PRELOAD), ahead of the ASan runtime.
  ASAN_OPTIONS="verify_asan_link_order=0:detect_leaks=1:abort_on_error=0:exitcode=86:strict_string_checks=1:detect_stack_use_after_return=0:log_path=$logs/asan" \
  LSAN_OPTIONS="suppressions=$root/scripts/sanitize/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87:log_path=$logs/ubsan" \
  SWIFTCPP_TEST_THREADS=1 OMP_NUM_THREADS=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" "$@"
  report build-asan
}

run_tsan() {
  configure_and_build build-tsan thread
  local logs=$root/build-tsan/sanitizer-logs
  rm -rf "$logs" && mkdir -p "$logs"
  # The threaded parts of the suite (see the header of this script), by CTest name: a GoogleTest suite is one test
  # ("BpeLoad.*", tests/discover_tests.cmake), the *Cli suites one per test.
  local threaded='Pipeline\.|BpeLoad\.|TokenizerSentencePiece\.|GradientReducer\.|ContextParallel\.|DistCli\.|TrainCli\.|Launcher'
  # setarch -R: ThreadSanitizer needs the fixed layout that high mmap randomisation of newer kernels breaks.
  TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$root/scripts/sanitize/tsan.supp:log_path=$logs/tsan" \
  SWIFTCPP_TEST_THREADS=1 OMP_NUM_THREADS=1 \
    setarch "$(uname -m)" -R ctest --test-dir build-tsan --output-on-failure -j "$jobs" -R "$threaded" "$@"
  report build-tsan
}

# A finding in a child process (a CLI the tests started) fails that child; its report is kept in the logs.
report() {
  local logs=$root/$1/sanitizer-logs
  if compgen -G "$logs/*" >/dev/null; then
    echo "sanitize: reports written to $logs:" >&2
    ls "$logs" >&2
    return 1
  fi
  echo "sanitize: $1 clean"
}

case "$mode" in
  asan) run_asan "$@" ;;
  tsan) run_tsan "$@" ;;
  all) run_asan "$@"; run_tsan "$@" ;;
  *) echo "usage: scripts/sanitize.sh [asan|tsan|all] [ctest arguments...]" >&2; exit 2 ;;
esac
