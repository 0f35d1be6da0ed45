#!/usr/bin/python3
"""Markdown table of bench/run_mm_eval.sh's results: items/s of `swiftcpp eval` on the MMBench fixture at each
generation batch size, as the median [min-max] of the rounds, and each size's speed against the first size's as
the median of the per-round ratios (the sizes alternate within a round), with the load average of each
measurement's start.

Usage: /usr/bin/python3 bench/report_mm_eval.py RESULTS_DIR   (holding results.jsonl and machine.txt)
"""

import json
import os
import statistics
import sys


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = os.path.join(argv[1], "results.jsonl")
    if not os.path.isfile(path):
        print("error: %s not found (not a bench/run_mm_eval.sh results folder)" % path, file=sys.stderr)
        return 1
    rows = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            for key in ("round", "batch", "items_per_s", "load", "rows"):
                if key not in r:
                    print("error: %s:%d lacks '%s'" % (path, n, key), file=sys.stderr)
                    return 1
            rows.append(r)
    if not rows:
        print("error: %s holds no measurements" % path, file=sys.stderr)
        return 1
    batches = []
    for r in rows:
        if r["batch"] not in batches:
            batches.append(r["batch"])
    speed = {(r["round"], r["batch"]): r["items_per_s"] for r in rows}
    rounds = sorted({r["round"] for r in rows})
    machine = os.path.join(argv[1], "machine.txt")
    if os.path.isfile(machine):
        with open(machine) as fh:
            for line in fh:
                print("- " + line.rstrip())
        print()
    print("| batch | items/s median [min-max] | vs batch %d (median of per-round ratios) | load averages |"
          % batches[0])
    print("|---:|---:|---:|---|")
    for b in batches:
        values = [r["items_per_s"] for r in rows if r["batch"] == b]
        ratios = [speed[(k, b)] / speed[(k, batches[0])] for k in rounds if (k, b) in speed and (k, batches[0]) in speed]
        loads = ", ".join("%.1f" % r["load"] for r in rows if r["batch"] == b)
        print("| %d | %.2f [%.2f-%.2f] | %.2fx | %s |" % (b, statistics.median(values), min(values), max(values),
                                                         statistics.median(ratios) if ratios else float("nan"), loads))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
