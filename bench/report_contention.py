#!/usr/bin/python3
"""Report of bench/run_contention.sh: reads OUT/<model>.<load>.t<threads>.r<round>.{infer,train,pytorch}.json
and prints a Markdown table: for each row (model x workload) and load (quiet, busy), the median tokens/s of each
thread setting over the rounds, and its ratio to the best explicit thread count of our own under the same load
(PyTorch's and llama.cpp's rows: to their own best count).

    /usr/bin/python3 bench/report_contention.py OUT > OUT/report.md
"""
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path


IMPL = {"infer": "swiftcpp", "train": "swiftcpp", "serve": "swiftcpp", "pytorch": "pytorch", "llama": "llama.cpp"}


def rate(kind, data):
    if kind == "infer":
        return {"prefill": data["prefill_tok_s"]["median"], "decode": data["decode_tok_s"]["median"]}
    if kind == "serve":
        return {"serve 8 streams": data["tokens_per_s"]}
    if kind == "llama":  # llama-bench -o json: a list with one test (tg)
        return {"decode": data[0]["avg_ts"]}
    return {"lora step": data["tokens_per_s"]}


def read_result(f, kind):
    text = f.read_text().strip()
    if kind == "llama":
        return json.loads(text)
    return json.loads(text.splitlines()[-1])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: report_contention.py OUT")
    out = Path(sys.argv[1])
    if not out.is_dir():
        sys.exit(f"{out}: not a results folder of bench/run_contention.sh")
    pattern = re.compile(r"^(?P<model>[^.]+)\.(?P<load>quiet|busy)\.t(?P<t>\d+)\.r(?P<r>\d+)\.(?P<kind>infer|train|pytorch|serve|llama)\.json$")
    # (model, workload, impl) -> load -> threads -> [tokens/s]
    table = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for f in sorted(out.iterdir()):
        m = pattern.match(f.name)
        if not m:
            continue
        try:
            data = read_result(f, m["kind"])
        except (ValueError, IndexError, KeyError) as e:
            sys.exit(f"{f}: not a benchmark JSON line ({e})")
        impl = IMPL[m["kind"]]
        try:
            rates = rate(m["kind"], data)
        except (TypeError, IndexError, KeyError) as e:
            sys.exit(f"{f}: not a {m['kind']} result ({e})")
        for workload, value in rates.items():
            table[(m["model"], workload, impl)][m["load"]][int(m["t"])].append(value)
    if not table:
        sys.exit(f"{out}: no results")
    machine = (out / "machine.txt").read_text() if (out / "machine.txt").exists() else ""
    print("# Speed beside busy processes\n")
    print("```\n" + machine.strip() + "\n```\n")
    counts = sorted({t for rows in table.values() for load in rows.values() for t in load})
    header = ["model", "workload", "impl", "load"] + [("default" if t == 0 else f"{t} thr") for t in counts]
    print("| " + " | ".join(header) + " | default / best explicit |")
    print("|" + "---|" * (len(header) + 1))
    for (model, workload, impl), loads in sorted(table.items()):
        for load in ("quiet", "busy"):
            if load not in loads:
                continue
            med = {t: statistics.median(v) for t, v in loads[load].items()}
            explicit = [v for t, v in med.items() if t != 0]
            best = max(explicit) if explicit else None
            cells = []
            for t in counts:
                if t not in med:
                    cells.append("-")
                else:
                    cells.append(f"{med[t]:.0f} ({med[t] / best:.2f}x)" if best else f"{med[t]:.0f}")
            ratio = f"**{med[0] / best:.2f}x**" if 0 in med and best else "-"
            print(f"| {model} | {workload} | {impl} | {load} | " + " | ".join(cells) + f" | {ratio} |")
    print("\nTokens/s, median over rounds; in brackets the ratio to the best explicit count of the same row and load.")


if __name__ == "__main__":
    main()
