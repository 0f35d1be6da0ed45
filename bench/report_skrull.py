#!/usr/bin/python3
"""Report of bench/run_skrull.sh: the modelled tables, then per process count and length distribution one row per
scheduler from the runs' logging.jsonl (steps 2.. of each run; step 1 warms up).

Usage: /usr/bin/python3 bench/report_skrull.py bench/results/skrull-<stamp>
"""
import glob
import json
import os
import sys

SCHEDULERS = ["skrull", "skrull_paper", "round_robin", "sorted", "flops_balanced"]
DISTS = ["wikipedia_zh", "lmsys_chat_1m", "chatqa2_long_sft"]


def records(run):
    logs = glob.glob(os.path.join(run, "v*", "logging.jsonl"))
    if not logs:
        return []
    with open(logs[0]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "loss" in r]


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0] * len(values)
    for r, i in enumerate(order):
        out[i] = r + 1
    return out


def main(out):
    with open(os.path.join(out, "machine.txt")) as f:
        print("".join("    " + line for line in f))
    print("## (a) Cost model at paper scale (paper device constants)\n")
    with open(os.path.join(out, "modelled.md")) as f:
        print(f.read())
    print("## (b) Real runs: bench25m LoRA, Gloo processes on this machine\n")
    worlds = sorted({int(os.path.basename(p).split("-")[0][1:]) for p in glob.glob(os.path.join(out, "w*-*"))
                     if os.path.isdir(p)})
    for world in worlds:
        for dist in DISTS:
            rows = []
            for sched in SCHEDULERS:
                recs = records(os.path.join(out, f"w{world}-{dist}-{sched}"))[1:]
                if not recs:
                    continue
                seconds = sum(r["step_s"] for r in recs)
                tokens = sum(r["tokens_per_s"] * r["step_s"] for r in recs)
                per_rank = [sum(r["rank_compute_s"][g] for r in recs) for g in range(world)]
                critical = sum(max(r["rank_compute_s"]) for r in recs)
                modelled = sum(r["modelled_step_s"] for r in recs)
                sharded = sum(r.get("sharded_samples", 0) for r in recs)
                rows.append((sched, tokens / seconds, seconds / len(recs), critical / len(recs),
                             max(per_rank) / (sum(per_rank) / world), modelled / len(recs), sharded, per_rank))
            if not rows:
                continue
            print(f"### {world} processes, {dist}\n")
            print("| scheduler | tokens/s | step (s, mean) | slowest rank's compute (s, mean) | max/mean compute "
                  "| modelled step (s, mean) | rank by measured step | rank by model | sharded samples | "
                  "per-rank compute (s, total) |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            measured_rank = ranks([r[2] for r in rows])
            model_rank = ranks([r[5] for r in rows])
            for r, mr, pr in zip(rows, measured_rank, model_rank):
                sharded = r[6] if world > 2 else "-"  # 2 processes run DP 2 x CP 1: nothing is sharded
                print(f"| {r[0]} | {r[1]:.0f} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.2f} | {r[5]:.4f} | {mr} | {pr} | "
                      f"{sharded} | {' / '.join(f'{x:.2f}' for x in r[7])} |")
            print()


if __name__ == "__main__":
    main(sys.argv[1])
