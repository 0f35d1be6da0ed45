"""Markdown report for bench/run.sh: swiftcpp beside llama.cpp's llama-bench on the same GGUF files.

Reads <dir>/<row>.swiftcpp.json (swiftcpp_bench_infer), <dir>/<row>.llama.json (llama-bench -o json) and
<dir>/<row>.llama.rss (GNU time's peak RSS in KiB), prints one table of medians and ratios plus the targets of the
inference issue. Exits 1 when a file is missing or malformed (naming it).
"""
import argparse
import json
import statistics
import sys
from pathlib import Path


def fail(msg):
    print(f"report_llama: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path, last_line=False):
    """JSON from `path`: the whole file, or its last line (swiftcpp_bench_infer prints one line)."""
    try:
        text = path.read_text()
        return json.loads(text.strip().splitlines()[-1] if last_line else text)
    except (OSError, ValueError, IndexError) as e:
        fail(f"{path}: {e}")


def ours(d, row):
    j = load(d / f"{row}.swiftcpp.json", last_line=True)
    return {"prefill": j["prefill_tok_s"]["median"], "decode": j["decode_tok_s"]["median"], "rss": j["peak_rss_mb"],
            "kernels": j.get("kernels", "?"), "ids": j.get("generated_ids")}


def theirs(d, row):
    runs = load(d / f"{row}.llama.json")
    out = {}
    for r in runs:
        key = "prefill" if r["n_gen"] == 0 else "decode"
        out[key] = statistics.median(r["samples_ts"])
    try:
        out["rss"] = int((d / f"{row}.llama.rss").read_text().split()[-1]) / 1024.0
    except (OSError, ValueError, IndexError) as e:
        fail(f"{d / (row + '.llama.rss')}: {e}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--command", default="bash bench/run.sh")
    a = ap.parse_args()
    d = Path(a.dir)
    machine = (d / "machine.txt").read_text().strip() if (d / "machine.txt").exists() else "unknown"

    lines = ["| row | program | prefill tok/s | decode tok/s | peak RSS MiB | prefill vs llama.cpp | decode vs llama.cpp |",
             "|---|---|---|---|---|---|---|"]
    targets = []
    for row, label in (("float32", "float32"), ("int8", "int8 / Q8_0"), ("int4", "int4 / Q4_0")):
        ref = theirs(d, row)
        lines.append(f"| {label} | llama.cpp (GGUF) | {ref['prefill']:.1f} | {ref['decode']:.1f} | {ref['rss']:.0f} | 1.00x | 1.00x |")
        for variant, program in ((row, "swiftcpp (own layout)"), (f"{row}-gguf", "swiftcpp (same GGUF)")):
            o = ours(d, variant)
            p, t = o["prefill"] / ref["prefill"], o["decode"] / ref["decode"]
            lines.append(f"| {label} | {program} | {o['prefill']:.1f} | {o['decode']:.1f} | {o['rss']:.0f} | {p:.2f}x | {t:.2f}x |")
            targets.append((f"{label} {program}: prefill >= 1.0x llama.cpp", p, 1.0))
            targets.append((f"{label} {program}: decode >= 1.0x llama.cpp", t, 1.0))
    f32, bf16, batched = ours(d, "float32"), ours(d, "bfloat16"), ours(d, "batched")
    lines.append(f"| bfloat16 | swiftcpp | {bf16['prefill']:.1f} | {bf16['decode']:.1f} | {bf16['rss']:.0f} | | "
                 f"{bf16['decode'] / f32['decode']:.2f}x swiftcpp float32 |")
    lines.append(f"| float32, batch of sequences | swiftcpp | {batched['prefill']:.1f} | {batched['decode']:.1f} | "
                 f"{batched['rss']:.0f} | | {batched['decode'] / f32['decode']:.2f}x one sequence |")
    targets.append(("bfloat16 decode >= 1.3x float32", bf16["decode"] / f32["decode"], 1.3))
    targets.append(("batched decode >= 4x one sequence", batched["decode"] / f32["decode"], 4.0))

    print(f"Machine: {machine.replace(chr(10), '; ')}")
    print(f"Kernels: {f32['kernels']}. Command: `{a.command}`")
    print()
    print("\n".join(lines))
    print()
    print("| target | measured | met |")
    print("|---|---|---|")
    for name, value, goal in targets:
        print(f"| {name} | {value:.2f}x | {'yes' if value >= goal else 'no'} |")


if __name__ == "__main__":
    main()
