#!/usr/bin/env bash
# How long the build takes, measured on a fresh clone of this checkout's HEAD with the compiler cache off:
#
#   first   cold build of the targets the README's first command builds (the swiftcpp program)
#   all     then the rest of what a plain `cmake --build build` builds (the tests): first + all + suite is CI's run
#   bench   then the benchmarks (`--target bench`): first + all + bench is a cold build of every target
#   cpp     one .cpp edit (lib/train/run.cpp touched), the program and the tests rebuilt
#   header  one widely included header edit (lib/nn/layers.h touched), the program and the tests rebuilt
#   suite   the test suite, as CI runs it (ctest -j2)
#
#   bash scripts/build_time.sh [STEP ...]      (default: every step, in the order above)
#
# Knobs: JOBS (build parallelism; default: ninja's), WORK (the folder of the clone; default a fresh temporary
# one, removed at the end unless KEEP=1), CPP / HEADER (the files the edit steps touch). Each step prints one
# table row: seconds, the translation units compiled, and the load average before and after. docs/benchmarks.md
# ("Build") keeps the results.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Ninja picks its own parallelism (cores + 2), as a plain `cmake --build` does, unless JOBS is given.
jobs=(); [ -n "${JOBS:-}" ] && jobs=(-j "$JOBS")
CPP=${CPP:-lib/train/run.cpp}
HEADER=${HEADER:-lib/nn/layers.h}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(first all bench cpp header suite)
for s in "${steps[@]}"; do
  case "$s" in first|all|bench|cpp|header|suite) ;; *) echo "build_time: unknown step '$s' (first all bench cpp header suite)" >&2; exit 2 ;; esac
done

work=${WORK:-}
if [ -z "$work" ]; then
  work=$(mktemp -d /tmp/swiftcpp_build_time.XXXXXX)
  [ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
fi
tree="$work/swiftcpp"
if [ ! -d "$tree" ]; then
  git clone -q --no-local "$src" "$tree"
  # The assets the suite reads sit beside the checkout, as ../shared does for this one.
  [ -e "$work/shared" ] || { [ -d "$src/../shared" ] && ln -s "$(cd "$src/../shared" && pwd)" "$work/shared"; } || true
fi
export CCACHE_DISABLE=1
build="$tree/build"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$tree" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER_LAUNCHER= >"$work/configure.log"
fi

load() { cut -d' ' -f1 /proc/loadavg; }
now() { date +%s.%N; }
# compiled <ninja log lines before>: translation units compiled since (object files in .ninja_log)
compiled() { tail -n +"$(( $1 + 1 ))" "$build/.ninja_log" | awk -F'\t' '$4 ~ /\.o$/ { n++ } END { print n + 0 }'; }

echo "| step | seconds | translation units | load before | load after |"
echo "|---|---:|---:|---:|---:|"
row() {  # step, command...
  local step=$1; shift
  local log="$work/step_${step%% *}.log"
  local before l0 t0 t1
  before=0; [ -f "$build/.ninja_log" ] && before=$(wc -l < "$build/.ninja_log")
  l0=$(load); t0=$(now)
  "$@" >"$log" 2>&1 || { echo "build_time: step '$step' failed (log: $log)" >&2; tail -20 "$log" >&2; exit 1; }
  t1=$(now)
  printf '| %s | %.0f | %s | %s | %s |\n' "$step" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$(compiled "$before")" "$l0" "$(load)"
}
for s in "${steps[@]}"; do
  case "$s" in
    first) row first cmake --build "$build" --target swiftcpp "${jobs[@]}" ;;
    all) row all cmake --build "$build" "${jobs[@]}" ;;
    bench) row bench cmake --build "$build" --target bench "${jobs[@]}" ;;
    cpp) touch "$tree/$CPP"; row "cpp ($CPP)" cmake --build "$build" --target swiftcpp swiftcpp_tests "${jobs[@]}" ;;
    header) touch "$tree/$HEADER"; row "header ($HEADER)" cmake --build "$build" --target swiftcpp swiftcpp_tests "${jobs[@]}" ;;
    suite) row suite ctest --test-dir "$build" -j2 ;;
  esac
done
echo
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%Y-%m-%d)"
