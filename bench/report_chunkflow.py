"""Markdown tables from swiftcpp_bench_chunkflow's JSON (memory and throughput results of one run)."""
import argparse
import json
import platform
import subprocess


def cpu_line():
    try:
        model = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
    except (OSError, IndexError):
        model = platform.processor() or "unknown CPU"
    cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return f"{model}, {cores} cores"


def mib(b):
    return b / 1048576.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", default="")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    results = []
    for f in a.files:  # throughput files of one mix (one per mode) merge into one table
        r = json.load(open(f))
        same = [x for x in results if x["benchmark"] == "throughput" == r["benchmark"] and x["mix"] == r["mix"]]
        if same:
            same[0]["results"] += r["results"]
        else:
            results.append(r)
    first = results[0]
    print(f"Machine: {cpu_line()}, BLAS {first.get('blas')}, {first.get('threads')} threads; model {first['model']}.")
    print(f"Command: `{a.command}`\n")
    for r in results:
        if r["benchmark"] == "memory":
            C, K = r["chunk_size"], r["keep"]
            print(f"**Peak tensor memory, one LoRA step on one sequence** (C = {C}, K = {K}; tensor memory through the "
                  "counting allocator, the memory-mapped base weights excluded)\n")
            print("| sequence | chunks | unchunked peak | ChunkFlow peak | ChunkFlow minus K/V store | K/V store | "
                  "unchunked s | ChunkFlow s | forwards |")
            print("|---|---|---|---|---|---|---|---|---|")
            for row in r["rows"]:
                u, c, s = mib(row["unchunked_peak_bytes"]), mib(row["chunkflow_peak_bytes"]), mib(row["kv_store_bytes"])
                print(f"| {row['length']} | {row['chunks']} | {u:.1f} MiB | {c:.1f} MiB | {c - s:.1f} MiB | {s:.1f} MiB | "
                      f"{row['unchunked_seconds']:.2f} | {row['chunkflow_seconds']:.2f} | {row['chunkflow_forwards']} |")
            rows = r["rows"]
            if len(rows) >= 2:
                du = mib(rows[-1]["unchunked_peak_bytes"] - rows[0]["unchunked_peak_bytes"])
                dc = mib(rows[-1]["chunkflow_peak_bytes"] - rows[0]["chunkflow_peak_bytes"])
                ds = mib(rows[-1]["kv_store_bytes"] - rows[0]["kv_store_bytes"])
                print(f"\nFrom {rows[0]['length']} to {rows[-1]['length']} tokens: unchunked +{du:.1f} MiB, ChunkFlow "
                      f"+{dc:.1f} MiB, of which the K/V store +{ds:.1f} MiB.\n")
        else:
            res = {x["mode"]: x for x in r["results"]}
            print(f"**Throughput, {r['mix']}-like mix** (lengths / {r['scale']:g}, capped at {r['max_length']}; mean "
                  f"{r['mean_length']:.1f} tokens, longest {r['longest']}; {r['global_batch']} sequences per step, "
                  f"padding micro-batch {r['micro_batch']}, packing rows of {r['max_length']}, ChunkFlow C = "
                  f"{r['chunk_size']}, K = {r['keep']}; {r['warmup']} warm-up + {r['steps']} timed steps)\n")
            print("| batching | tokens/s | vs padding | vs packing | peak tensor memory | forwards |")
            print("|---|---|---|---|---|---|")
            pad = res.get("padding", {}).get("tokens_per_s")
            pack = res.get("packing", {}).get("tokens_per_s")
            for mode in ("padding", "packing", "chunkflow"):
                if mode not in res:
                    continue
                x = res[mode]
                vs_pad = f"{x['tokens_per_s'] / pad:.2f}x" if pad else "-"
                vs_pack = f"{x['tokens_per_s'] / pack:.2f}x" if pack else "-"
                print(f"| {mode} | {x['tokens_per_s']:.1f} | {vs_pad} | {vs_pack} | {mib(x['peak_bytes']):.1f} MiB | "
                      f"{x['forwards']} |")
            print()


if __name__ == "__main__":
    main()
