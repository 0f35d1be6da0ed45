#!/usr/bin/python3
"""Markdown table of bench/run_image.sh's results: one row per processor setting, images/s as the median [min-max]
of the rounds, and each setting's speed against CLIPImageProcessor's as the median of the per-round ratios (the
settings alternate within a round, so a ratio compares measurements taken side by side).

Usage: /usr/bin/python3 bench/report_image.py RESULTS.jsonl   (one JSON line per measurement, in run order)
"""

import json
import statistics
import sys


def setting(r):
    if r["processor"] == "CLIPImageProcessor":
        return "CLIPImageProcessor, size %d" % r["size"]
    return "Qwen2VLImageProcessor, max_pixels %d (min %d)" % (r["max_pixels"], r["min_pixels"])


def tokens(r):
    if r["processor"] == "CLIPImageProcessor":
        return "(model's count; LLaVA-1.5: 576)"
    per = [str(i["tokens"]) for i in r["per_image"]]
    return "%.1f (%s)" % (r["mean_tokens"], ", ".join(per))


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    order, by_setting = [], {}
    for r in rows:
        key = setting(r)
        if key not in by_setting:
            order.append(key)
            by_setting[key] = []
        by_setting[key].append(r)
    rounds = min(len(v) for v in by_setting.values())
    clip = [k for k in order if k.startswith("CLIP")]
    base = by_setting[clip[0]] if clip else None
    first = rows[0]
    print("%d threads, %g s per measurement, %d rounds (settings alternating within each round); images/s: median "
          "[min-max] of the rounds. Input: the %d images, mean %d pixels." % (
              first["threads"], first["seconds"], rounds, first["images"], first["mean_input_pixels"]))
    print()
    print("| processor | LM tokens per image: mean (coffee, rocket, chelsea, camera, astronaut) | patches per image "
          "| decode + preprocess images/s | preprocess images/s | vs %s (decode + preprocess / preprocess) |"
          % (clip[0] if clip else "CLIP"))
    print("|---|---|---|---|---|---|")
    fmt = lambda v: "%.1f [%.1f-%.1f]" % (statistics.median(v), min(v), max(v))
    for key in order:
        rs = by_setting[key]
        full = [r["decode_preprocess_images_per_s"] for r in rs]
        pre = [r["preprocess_images_per_s"] for r in rs]
        if base is not None:
            n = min(len(rs), len(base))
            rf = statistics.median(rs[i]["decode_preprocess_images_per_s"] / base[i]["decode_preprocess_images_per_s"]
                                   for i in range(n))
            rp = statistics.median(rs[i]["preprocess_images_per_s"] / base[i]["preprocess_images_per_s"]
                                   for i in range(n))
            ratio = "%.2fx / %.2fx" % (rf, rp)
        else:
            ratio = "-"
        patches = "-" if rs[0]["mean_patches"] is None else "%.1f" % rs[0]["mean_patches"]
        print("| %s | %s | %s | %s | %s | %s |" % (key, tokens(rs[0]), patches, fmt(full), fmt(pre), ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
