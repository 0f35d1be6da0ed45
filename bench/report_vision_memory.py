#!/usr/bin/env python3
"""Markdown table of a bench/run_vision_memory.sh results folder: per model and image size, each build's median
tensor peak, peak resident set and wall time over the rounds (a failed run shows its exit status), and the
per-round ratios new / old of the tensor peak and the time (rounds alternate), as medians.

    /usr/bin/python3 bench/report_vision_memory.py bench/results/vision-memory-<timestamp>
"""
import json
import statistics
import sys
from pathlib import Path

PATCH_PIXELS = 14 * 14  # one vision patch; four patches merge into one language-model token


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def cell(runs, key, fmt):
    failed = [r for r in runs if r["rc"] != 0]
    if failed:
        return f"exit {failed[0]['rc']}"
    m = median([r[key] for r in runs])
    return "-" if m is None else fmt.format(m)


def ratio(pairs, key):
    values = []
    for old, new in pairs:
        if old["rc"] == 0 and new["rc"] == 0 and old[key] and new[key] is not None:
            values.append(new[key] / old[key])
    return "-" if not values else f"{statistics.median(values):.2f}x"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: report_vision_memory.py RESULTS_FOLDER")
    path = Path(sys.argv[1]) / "runs.jsonl"
    try:
        runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"error: {path}: not a run_vision_memory.sh results file ({e})")
    for r in runs:
        for key in ("model", "pixels", "side", "round", "rc", "tensor_peak_mib", "rss_peak_mib", "seconds"):
            if key not in r:
                sys.exit(f"error: {path}: a run without '{key}'")
    keys = sorted({(r["model"], r["pixels"]) for r in runs})
    print("| model | pixels | patches | tensor peak old / new (MiB) | resident old / new (MiB) | time old / new (s) "
          "| tensor peak new/old | time new/old |")
    print("|---|---|---|---|---|---|---|---|")
    for model, pixels in keys:
        rows = [r for r in runs if r["model"] == model and r["pixels"] == pixels]
        old = [r for r in rows if r["side"] == "old"]
        new = [r for r in rows if r["side"] == "new"]
        by_round = {}
        for r in rows:
            by_round.setdefault(r["round"], {})[r["side"]] = r
        pairs = [(p["old"], p["new"]) for p in by_round.values() if "old" in p and "new" in p]
        print(f"| {model} | {pixels:,} | {pixels // PATCH_PIXELS:,} "
              f"| {cell(old, 'tensor_peak_mib', '{:.0f}')} / {cell(new, 'tensor_peak_mib', '{:.0f}')} "
              f"| {cell(old, 'rss_peak_mib', '{:.0f}')} / {cell(new, 'rss_peak_mib', '{:.0f}')} "
              f"| {cell(old, 'seconds', '{:.2f}')} / {cell(new, 'seconds', '{:.2f}')} "
              f"| {ratio(pairs, 'tensor_peak_mib')} | {ratio(pairs, 'seconds')} |")
    loads = [r["load"] for r in runs if r.get("load")]
    if loads:
        print(f"\nLoad average (1, 5, 15 min) after the runs: first {loads[0]}, last {loads[-1]}.")


if __name__ == "__main__":
    main()
