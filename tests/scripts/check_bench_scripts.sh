#!/usr/bin/env bash
# CTest BenchScripts: the benchmark and project scripts CI does not run still parse (bash -n, py_compile), and
# bench/report_contention.py and bench/report_builds.py turn results folders into their tables (fixtures written here).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON=${PYTHON:-/usr/bin/python3}
for f in bench/*.sh scripts/*.sh; do
    bash -n "$f" || { echo "FAIL: $f does not parse" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in bench/*.py scripts/*.py; do
    "$PYTHON" -c "import sys, py_compile; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)" \
        "$f" "$tmp/compiled.pyc" || { echo "FAIL: $f does not compile" >&2; exit 1; }
done

# Two rounds, quiet and busy, default (t0) and 1..2 threads: busy decode at the default is 450 against the best
# explicit count's 900 (0.50x); quiet prefill at 2 threads is the best (1.00x).
res=$tmp/contention
mkdir -p "$res"
echo "cpu: fixture" > "$res/machine.txt"
for r in 1 2; do
    for load in quiet busy; do
        for t in 0 1 2; do
            case $load.$t in
                quiet.0) d=1000 p=5000 s=300 ;; quiet.1) d=800 p=3000 s=200 ;; quiet.2) d=1000 p=5000 s=300 ;;
                busy.0) d=450 p=2000 s=100 ;; busy.1) d=900 p=2500 s=150 ;; busy.2) d=400 p=2000 s=90 ;;
            esac
            echo "{\"prefill_tok_s\": {\"median\": $p}, \"decode_tok_s\": {\"median\": $d}}" \
                > "$res/stories260K.$load.t$t.r$r.infer.json"
            echo "{\"tokens_per_s\": $s}" > "$res/stories260K.$load.t$t.r$r.train.json"
            [[ $t == 0 ]] || echo "{\"tokens_per_s\": $((s / 2))}" > "$res/stories260K.$load.t$t.r$r.pytorch.json"
            echo "{\"tokens_per_s\": $((d * 2)), \"ttft_p50_ms\": 5}" > "$res/stories260K.$load.t$t.r$r.serve.json"
            printf '[\n  {"n_prompt": 0, "n_gen": 128, "avg_ts": %d.5}\n]\n' $((d + 100 * t)) \
                > "$res/stories260K.$load.t$t.r$r.llama.json"
        done
    done
done
report=$("$PYTHON" bench/report_contention.py "$res")
expect() {
    grep -qF -- "$1" <<<"$report" || { echo "FAIL: the report lacks: $1" >&2; echo "$report" >&2; exit 1; }
}
expect "| stories260K | decode | swiftcpp | busy | 450 (0.50x) | 900 (1.00x) | 400 (0.44x) | **0.50x** |"
expect "| stories260K | prefill | swiftcpp | quiet | 5000 (1.00x) | 3000 (0.60x) | 5000 (1.00x) | **1.00x** |"
expect "| stories260K | lora step | pytorch | busy | - | 75 (1.00x) | 45 (0.60x) | - |"
expect "| stories260K | serve 8 streams | swiftcpp | busy | 900 (0.50x) | 1800 (1.00x) | 800 (0.44x) | **0.50x** |"
expect "| stories260K | decode | llama.cpp | quiet | 1000 (0.83x) | 900 (0.75x) | 1200 (1.00x) | **0.83x** |"
# A result that is not what its name says names the file.
echo '{"tokens_per_s": 1}' > "$res/stories260K.quiet.t1.r1.llama.json"
if "$PYTHON" bench/report_contention.py "$res" 2>"$tmp/err"; then
    echo "FAIL: the report accepted a llama.cpp result without avg_ts" >&2
    exit 1
fi
grep -q "stories260K.quiet.t1.r1.llama.json" "$tmp/err" || { echo "FAIL: the error does not name the file" >&2; cat "$tmp/err" >&2; exit 1; }
# A results folder without results is an error, not an empty table.
if "$PYTHON" bench/report_contention.py "$tmp/compiled.pyc" 2>/dev/null; then
    echo "FAIL: the report accepted a folder that is not one" >&2
    exit 1
fi
mkdir "$tmp/empty"
if "$PYTHON" bench/report_contention.py "$tmp/empty" 2>/dev/null; then
    echo "FAIL: the report accepted a folder without results" >&2
    exit 1
fi
# bench/report_builds.py: two rounds of two builds; the new build trains 10% and 20% faster (median 1.15x), decodes
# at the same speed, and a round whose file is not JSON names the file.
builds=$tmp/builds
mkdir -p "$builds"
for r in 1 2; do
    echo "{\"tokens_per_s\": 1000}" > "$builds/train.old.r$r.json"
    echo "{\"tokens_per_s\": $((1000 + 100 * r))}" > "$builds/train.new.r$r.json"
    for side in old new; do
        echo '{"prefill_tok_s": {"median": 3000}, "decode_tok_s": {"median": 200}}' > "$builds/decode1.$side.r$r.json"
        echo '{"prefill_tok_s": {"median": 4000}, "decode_tok_s": {"median": 600}}' > "$builds/decode8.$side.r$r.json"
    done
done
report=$("$PYTHON" bench/report_builds.py "$builds")
expect "| LoRA step, batch 4 x 512 (tokens/s) | 1000.0 | 1150.0 | 1.10, 1.20 | **1.15x** |"
expect "| decode, batch 8 (tokens/s) | 600.0 | 600.0 | 1.00, 1.00 | **1.00x** |"
echo "not json" > "$builds/train.new.r2.json"
if "$PYTHON" bench/report_builds.py "$builds" 2>"$tmp/err"; then
    echo "FAIL: the builds report accepted a result that is not JSON" >&2
    exit 1
fi
grep -q "train.new.r2.json" "$tmp/err" || { echo "FAIL: the builds report's error does not name the file" >&2; exit 1; }
# bench/report_vision_memory.py: two rounds at one size; the old build's tensor peak is 600 and 800 MiB, the new
# one's 30 (median ratio 0.04x); an old run that died shows its exit status; a run without its fields is an error.
vm=$tmp/vision-memory
mkdir -p "$vm"
for r in 1 2; do
    echo "{\"model\": \"qwen2_vl\", \"pixels\": 1003520, \"side\": \"old\", \"round\": $r, \"rc\": 0, \"tensor_peak_mib\": $((400 + 200 * r)), \"rss_peak_mib\": 900, \"seconds\": 2.0, \"load\": \"1.0 1.0 1.0\"}" >> "$vm/runs.jsonl"
    echo "{\"model\": \"qwen2_vl\", \"pixels\": 1003520, \"side\": \"new\", \"round\": $r, \"rc\": 0, \"tensor_peak_mib\": 30, \"rss_peak_mib\": 300, \"seconds\": 1.0, \"load\": \"1.0 1.0 1.0\"}" >> "$vm/runs.jsonl"
    echo "{\"model\": \"qwen2_vl\", \"pixels\": 4014080, \"side\": \"old\", \"round\": $r, \"rc\": 137, \"tensor_peak_mib\": null, \"rss_peak_mib\": null, \"seconds\": null, \"load\": \"1.0 1.0 1.0\"}" >> "$vm/runs.jsonl"
done
report=$("$PYTHON" bench/report_vision_memory.py "$vm")
expect "| qwen2_vl | 1,003,520 | 5,120 | 700 / 30 | 900 / 300 | 2.00 / 1.00 | 0.04x | 0.50x |"
expect "| qwen2_vl | 4,014,080 | 20,480 | exit 137 / - |"
echo '{"model": "qwen2_vl"}' >> "$vm/runs.jsonl"
if "$PYTHON" bench/report_vision_memory.py "$vm" 2>"$tmp/err"; then
    echo "FAIL: the vision memory report accepted a run without its fields" >&2
    exit 1
fi
grep -q "runs.jsonl" "$tmp/err" || { echo "FAIL: the vision memory report's error does not name the file" >&2; exit 1; }
# bench/report_mm_eval.py: two rounds, batch 1 at 2.0 and 2.5 items/s, batch 8 at 5.0 both times (ratios 2.5 and
# 2.0, median 2.25x); a measurement without its fields is an error naming the file.
mme=$tmp/mm-eval
mkdir -p "$mme"
for r in 1 2; do
    echo "{\"round\": $r, \"batch\": 1, \"load\": 1.0, \"rows\": 54, \"items_per_s\": $([[ $r == 1 ]] && echo 2.0 || echo 2.5)}" >> "$mme/results.jsonl"
    echo "{\"round\": $r, \"batch\": 8, \"load\": 2.0, \"rows\": 54, \"items_per_s\": 5.0}" >> "$mme/results.jsonl"
done
report=$("$PYTHON" bench/report_mm_eval.py "$mme")
expect "| 1 | 2.25 [2.00-2.50] | 1.00x | 1.0, 1.0 |"
expect "| 8 | 5.00 [5.00-5.00] | 2.25x | 2.0, 2.0 |"
echo '{"round": 3}' >> "$mme/results.jsonl"
if "$PYTHON" bench/report_mm_eval.py "$mme" 2>"$tmp/err"; then
    echo "FAIL: the mm eval report accepted a measurement without its fields" >&2
    exit 1
fi
grep -q "results.jsonl:5" "$tmp/err" || { echo "FAIL: the mm eval report's error does not name the file" >&2; exit 1; }
echo "bench scripts parse; the contention, builds, vision memory and mm eval reports read their results"
