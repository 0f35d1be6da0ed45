#!/usr/bin/env python3
"""Markdown table of a bench/run_builds.sh results folder: per measurement, each build's median over the rounds,
the per-round ratios new / old (rounds alternate, so a ratio compares runs minutes apart) and their median.

    /usr/bin/python3 bench/report_builds.py bench/results/builds-<timestamp>
"""
import json
import re
import statistics
import sys
from pathlib import Path

# (file prefix, label, how to read the figure from the JSON)
MEASURES = [
    ("train", "LoRA step, batch 4 x 512 (tokens/s)", lambda d: d["tokens_per_s"]),
    ("decode1", "prefill 128, batch 1 (tokens/s)", lambda d: d["prefill_tok_s"]["median"]),
    ("decode1", "decode, batch 1 (tokens/s)", lambda d: d["decode_tok_s"]["median"]),
    ("decode8", "prefill 128, batch 8 (tokens/s)", lambda d: d["prefill_tok_s"]["median"]),
    ("decode8", "decode, batch 8 (tokens/s)", lambda d: d["decode_tok_s"]["median"]),
]
NAME = re.compile(r"^(train|decode1|decode8)\.(old|new)\.r(\d+)\.json$")


def load(folder):
    runs = {}
    for path in sorted(folder.iterdir()):
        m = NAME.match(path.name)
        if not m:
            continue
        try:
            runs[(m.group(1), m.group(2), int(m.group(3)))] = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            sys.exit(f"error: {path}: not a benchmark's JSON ({e})")
    return runs


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: report_builds.py RESULTS_FOLDER")
    folder = Path(sys.argv[1])
    if not folder.is_dir():
        sys.exit(f"error: {folder}: not a folder")
    runs = load(folder)
    rounds = sorted({r for (_, _, r) in runs})
    if not rounds:
        sys.exit(f"error: {folder}: no results (train|decode1|decode8).(old|new).rN.json")
    machine = folder / "machine.txt"
    if machine.exists():
        for line in machine.read_text().splitlines():
            print(f"- {line}")
    load_file = folder / "load.txt"
    if load_file.exists():
        loads = [float(l.split("load")[1].split()[0]) for l in load_file.read_text().splitlines() if "load" in l]
        if loads:
            print(f"- load average (1 min) after each side: {min(loads):.2f} to {max(loads):.2f}")
    print()
    print("| measurement | old (median) | new (median) | new / old per round | median |")
    print("|---|---:|---:|---|---:|")
    for prefix, label, read in MEASURES:
        old, new, ratios = [], [], []
        for r in rounds:
            a, b = runs.get((prefix, "old", r)), runs.get((prefix, "new", r))
            if a is None or b is None:
                continue
            try:
                x, y = float(read(a)), float(read(b))
            except (KeyError, TypeError, ValueError) as e:
                sys.exit(f"error: {folder}: {prefix} round {r} lacks its figure ({e})")
            old.append(x)
            new.append(y)
            ratios.append(y / x if x > 0 else float("nan"))
        if not ratios:
            continue
        per_round = ", ".join(f"{q:.2f}" for q in ratios)
        print(f"| {label} | {statistics.median(old):.1f} | {statistics.median(new):.1f} | {per_round} | "
              f"**{statistics.median(ratios):.2f}x** |")


if __name__ == "__main__":
    main()
