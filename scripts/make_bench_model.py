#!/usr/bin/python3
"""Write swiftcpp's standard benchmark model: a Llama-shaped Hugging Face checkpoint with random weights.

Usage:
    /usr/bin/python3 scripts/make_bench_model.py --out bench/models/bench25m [--preset bench25m] [--seed 0] [--force]
    /usr/bin/python3 scripts/make_bench_model.py --out bench/models/bench-moe --preset bench-moe

Output folder:
    config.json             LlamaForCausalLM (bench25m) or MixtralForCausalLM (bench-moe) config (see PRESETS)
    generation_config.json  bos/eos ids, greedy
    model.safetensors       float32 weights, Hugging Face tensor names

Weights (deterministic for a given preset and seed):
    rng = numpy.random.default_rng(seed); every tensor is drawn in the order listed below.
    - matrices (embedding, projections, lm_head): rng.standard_normal(shape, dtype=float32) * 0.02
    - RMSNorm weights: 1 + 0.1 * rng.standard_normal(shape, dtype=float32)
      (norms are perturbed away from 1 on purpose, so that a missing or misplaced norm weight changes outputs)
    Order: model.embed_tokens.weight; for each layer i: input_layernorm, self_attn.{q,k,v,o}_proj,
    post_attention_layernorm, mlp.{gate,up,down}_proj (bench-moe: block_sparse_moe.gate, then each expert's
    w1, w2, w3); then model.norm.weight, lm_head.weight (when untied).

No tokenizer is written: the benchmarks feed token ids directly.

The script is idempotent: when the folder already holds a checkpoint made from the same config, preset and seed
it does nothing (use --force to rewrite). Tensors are generated and written one at a time (at most one tensor in
memory), to a temporary file that is renamed into place only when complete.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

PRESETS = {
    "bench25m": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 32000,
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    },
    # bench25m with each MLP replaced by 8 experts of half its width, 2 active per token: the same active
    # parameters per token (2 x 704 = 1408 FFN columns), 4x the FFN weights.
    "bench-moe": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 512,
        "intermediate_size": 704,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": True,
        "torch_dtype": "float32",
    },
}

GENERATOR = "swiftcpp scripts/make_bench_model.py v1"
INIT_STD = 0.02
NORM_JITTER = 0.1


def tensor_specs(cfg):
    """[(name, shape, kind)] in generation/file order; kind is 'matrix' or 'norm'."""
    d = cfg["hidden_size"]
    f = cfg["intermediate_size"]
    v = cfg["vocab_size"]
    hd = cfg.get("head_dim", d // cfg["num_attention_heads"])
    q_out = cfg["num_attention_heads"] * hd
    kv_out = cfg["num_key_value_heads"] * hd
    specs = [("model.embed_tokens.weight", (v, d), "matrix")]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        specs += [
            (p + "input_layernorm.weight", (d,), "norm"),
            (p + "self_attn.q_proj.weight", (q_out, d), "matrix"),
            (p + "self_attn.k_proj.weight", (kv_out, d), "matrix"),
            (p + "self_attn.v_proj.weight", (kv_out, d), "matrix"),
            (p + "self_attn.o_proj.weight", (d, q_out), "matrix"),
            (p + "post_attention_layernorm.weight", (d,), "norm"),
        ]
        if "num_local_experts" in cfg:  # Mixtral: router, then each expert's w1 (gate), w2 (down), w3 (up)
            e = cfg["num_local_experts"]
            specs.append((p + "block_sparse_moe.gate.weight", (e, d), "matrix"))
            for j in range(e):
                q = p + "block_sparse_moe.experts.%d." % j
                specs += [(q + "w1.weight", (f, d), "matrix"), (q + "w2.weight", (d, f), "matrix"),
                          (q + "w3.weight", (f, d), "matrix")]
        else:
            specs += [
                (p + "mlp.gate_proj.weight", (f, d), "matrix"),
                (p + "mlp.up_proj.weight", (f, d), "matrix"),
                (p + "mlp.down_proj.weight", (d, f), "matrix"),
            ]
    specs.append(("model.norm.weight", (d,), "norm"))
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (v, d), "matrix"))
    return specs


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def build_header(specs, metadata):
    header = {"__metadata__": metadata}
    offset = 0
    for name, shape, _ in specs:
        nbytes = numel(shape) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)  # pad so the data section starts 8-byte aligned
    return raw, offset


def read_safetensors_header(path):
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError("truncated file")
        (n,) = struct.unpack("<Q", head)
        return json.loads(fh.read(n).decode("utf-8")), 8 + n


def existing_matches(out, cfg, metadata, data_bytes):
    cfg_path = os.path.join(out, "config.json")
    st_path = os.path.join(out, "model.safetensors")
    if not (os.path.isfile(cfg_path) and os.path.isfile(st_path)):
        return False
    try:
        with open(cfg_path) as fh:
            if json.load(fh) != cfg:
                return False
        header, data_start = read_safetensors_header(st_path)
    except (OSError, ValueError):
        return False
    if header.get("__metadata__") != metadata:
        return False
    return os.path.getsize(st_path) == data_start + data_bytes


def write_json_atomic(path, obj):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


def count_params(specs):
    total = sum(numel(s) for _, s, _ in specs)
    outer = sum(numel(s) for n, s, _ in specs if n in ("model.embed_tokens.weight", "lm_head.weight"))
    return total, total - outer


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created if missing)")
    ap.add_argument("--preset", default="bench25m", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rewrite even if an identical checkpoint exists")
    args = ap.parse_args(argv)

    cfg = dict(PRESETS[args.preset])
    specs = tensor_specs(cfg)
    total, inner = count_params(specs)
    metadata = {
        "format": "pt",
        "generator": GENERATOR,
        "preset": args.preset,
        "seed": str(args.seed),
        "init": "matrices N(0,%g), norms 1+%g*N(0,1), numpy default_rng float32" % (INIT_STD, NORM_JITTER),
    }
    header, data_bytes = build_header(specs, metadata)
    print("preset %s seed %d: %d parameters (%.1fM), %d (%.1fM) outside embed_tokens/lm_head"
          % (args.preset, args.seed, total, total / 1e6, inner, inner / 1e6))

    out = args.out
    if not args.force and existing_matches(out, cfg, metadata, data_bytes):
        print("%s already holds this checkpoint; nothing to do (--force rewrites it)" % out)
        return 0
    os.makedirs(out, exist_ok=True)
    # Drop config.json first: a folder whose config.json is present is a finished checkpoint.
    cfg_path = os.path.join(out, "config.json")
    if os.path.exists(cfg_path):
        os.remove(cfg_path)

    st_path = os.path.join(out, "model.safetensors")
    tmp = "%s.tmp-%d" % (st_path, os.getpid())
    rng = np.random.default_rng(args.seed)
    try:
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", len(header)))
            fh.write(header)
            for name, shape, kind in specs:
                x = rng.standard_normal(shape, dtype=np.float32)
                if kind == "matrix":
                    x *= np.float32(INIT_STD)
                else:
                    x *= np.float32(NORM_JITTER)
                    x += np.float32(1.0)
                fh.write(np.ascontiguousarray(x, dtype="<f4").data)  # no copy on little-endian hosts
                del x
            fh.flush()
            os.fsync(fh.fileno())
        if os.path.getsize(tmp) != 8 + len(header) + data_bytes:
            raise RuntimeError("size mismatch writing %s" % tmp)
        os.replace(tmp, st_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise

    write_json_atomic(os.path.join(out, "generation_config.json"),
                      {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                       "do_sample": False})
    write_json_atomic(cfg_path, cfg)
    print("wrote %s (%.1f MB)" % (out, (8 + len(header) + data_bytes) / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
