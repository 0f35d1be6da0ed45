#!/usr/bin/python3
"""Write swiftcpp's benchmark Qwen2-VL: bench25m's language model as Qwen2 (q/k/v biases, M-RoPE) with a Qwen2-VL
vision tower of bench25m-llava's CLIP tower's width and depth, random weights, in Hugging Face's
Qwen2VLForConditionalGeneration layout (transformers 4.46-4.49: `model.*`, `lm_head`, `visual.*`).

Usage:
    /usr/bin/python3 scripts/make_bench_qwen2_vl.py --out bench/models/bench25m-qwen2-vl [--seed 0] [--force]

It is the Qwen2-VL row of the vision-language training benchmark (bench/run_mm_train.sh), beside
bench/models/bench25m-llava (scripts/make_bench_llava.py), so the two differ only where the families differ:
    language model   bench25m's sizes (hidden 512, MLP 1408, 8 layers, 8 heads, 4 KV heads, head_dim 64,
                     rope_theta 1e4, RMSNorm eps 1e-6, untied lm_head) and bench25m-llava's vocabulary of 32064
                     rows (the Llama 2 tokenizer's 32000 pieces, Qwen2-VL's 14 added tokens at 32000-32013 in
                     Qwen's order, 50 unused rows); as Qwen2: biases on q/k/v, M-RoPE with mrope_section
                     [8, 12, 12] (Qwen2-VL-7B's [16, 24, 24] for head_dim 128, halved)
    vision tower     `visual`: VISION below, embed_dim 256, depth 6, 4 heads, MLP 1024 (mlp_ratio 4), patch 14,
                     temporal patch 2, quick_gelu: the CLIP tower's width, depth, heads and MLP (which runs 5 of
                     its 6 layers, vision_feature_layer -2); about the same parameters (5.04M both)
    merger           `visual.merger`: LayerNorm(256), 2x2 patches concatenated (1024), Linear 1024 -> 1024, GELU,
                     Linear 1024 -> 512 (the language model's width)
    image processor  Qwen2VLImageProcessor with min_pixels = max_pixels = PIXELS = 28 * 28 * 550: each of the five
                     images of ../shared/assets/images (all at most 512 px a side, so max_pixels alone would leave
                     them at about 240 tokens) is scaled up to 576 tokens (the two square ones: 24 x 24 merged
                     tokens, as bench25m-llava's 576 CLIP patches) or 580 (the three 3:2 ones, 20 x 29), i.e.
                     2304-2320 patches through the tower. 28 * 28 * 576 would give the 3:2 images 600 (each side
                     is rounded up).

Output folder:
    config.json               Qwen2VLForConditionalGeneration, the language model at the top level,
                              vision_config = VISION (hidden_size = the merger's output = 512), token ids TOKEN
    model.safetensors         float32, Hugging Face tensor names (../shared/assets/reference/qwen2_vl README,
                              "Tensor names")
    preprocessor_config.json  Qwen2VLImageProcessor, min/max_pixels PIXELS, CLIP mean/std, bicubic
    tokenizer.model           the Llama 2 sentencepiece model from ../shared/assets/tokenizers/llama2
    tokenizer_config.json, special_tokens_map.json, generation_config.json
                              LlamaTokenizer (no BOS added, as Qwen2's) with Qwen2-VL's added tokens (ADDED), eos
                              <|im_end|>, pad <|endoftext|> (the layout of scripts/make_qwen2_vl_demo.py)

Weights (deterministic for a given seed): rng = numpy.random.default_rng(seed), every tensor drawn in the order
of tensor_specs(): the language model (bench25m's order, each q/k/v bias after its weight), then the vision tower
and the merger. make_bench_llava.py's rules: matrices, embeddings and the patch convolution N(0, 0.02);
LayerNorm / RMSNorm weights 1 + 0.1 N(0, 1); biases 0.02 N(0, 1). Only the shapes matter to the benchmark.

Idempotent: a folder that already holds a checkpoint made from the same config and seed is left alone (--force
rewrites it). Tensors are generated and written one at a time, to a temporary file renamed into place when
complete; config.json is written last.
"""

import argparse
import os
import shutil
import struct
import sys

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_bench_llava as llava  # noqa: E402  (draw(), the CLIP constants, the tokenizer path)
import make_bench_model as bench  # noqa: E402  (the bench25m preset and safetensors helpers)

GENERATOR = "swiftcpp scripts/make_bench_qwen2_vl.py v1"
FIRST_ADDED = 32000  # after the Llama 2 tokenizer's pieces
# Qwen2-VL's added tokens in Qwen's order (there 151643-151656).
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
         "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
TOKEN = {t: FIRST_ADDED + i for i, t in enumerate(ADDED)}
VOCAB = llava.VOCAB  # 32064, as bench25m-llava
MROPE_SECTION = [8, 12, 12]  # 2 * 32 = head_dim 64
PIXELS = 28 * 28 * 550

VISION = {
    "model_type": "qwen2_vl",
    "depth": 6,
    "embed_dim": 256,
    "num_heads": 4,
    "mlp_ratio": 4,
    "hidden_size": 512,  # the merger's output width = the language model's hidden size
    "hidden_act": "quick_gelu",
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}


def model_config():
    text = bench.PRESETS["bench25m"]
    if 2 * sum(MROPE_SECTION) != text["head_dim"] or VISION["hidden_size"] != text["hidden_size"]:
        raise SystemExit("mrope_section / the merger's width do not fit bench25m")
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "attention_dropout": 0.0,
        "bos_token_id": TOKEN["<|endoftext|>"],
        "eos_token_id": TOKEN["<|im_end|>"],
        "hidden_act": text["hidden_act"],
        "hidden_size": text["hidden_size"],
        "image_token_id": TOKEN["<|image_pad|>"],
        "initializer_range": llava.INIT_STD,
        "intermediate_size": text["intermediate_size"],
        "max_position_embeddings": text["max_position_embeddings"],
        "max_window_layers": text["num_hidden_layers"],
        "num_attention_heads": text["num_attention_heads"],
        "num_hidden_layers": text["num_hidden_layers"],
        "num_key_value_heads": text["num_key_value_heads"],
        "rms_norm_eps": text["rms_norm_eps"],
        "rope_scaling": {"type": "mrope", "mrope_section": MROPE_SECTION},
        "rope_theta": text["rope_theta"],
        "sliding_window": text["max_position_embeddings"],
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "video_token_id": TOKEN["<|video_pad|>"],
        "vision_config": dict(VISION),
        "vision_end_token_id": TOKEN["<|vision_end|>"],
        "vision_start_token_id": TOKEN["<|vision_start|>"],
        "vision_token_id": TOKEN["<|vision_pad|>"],
        "vocab_size": VOCAB,
    }


def tensor_specs(cfg):
    """[(name, shape, kind)] in generation/file order; kind is 'matrix', 'norm' or 'bias'."""
    text = dict(bench.PRESETS["bench25m"], vocab_size=cfg["vocab_size"])
    specs = []
    for name, shape, kind in bench.tensor_specs(text):
        specs.append((name, shape, kind))
        if any(name.endswith("self_attn.%s.weight" % p) for p in ("q_proj", "k_proj", "v_proj")):
            specs.append((name[: -len("weight")] + "bias", (shape[0],), "bias"))
    v = cfg["vision_config"]
    d = v["embed_dim"]
    f = int(d * v["mlp_ratio"])
    m = d * v["spatial_merge_size"] ** 2
    specs.append(("visual.patch_embed.proj.weight",
                  (d, v["in_channels"], v["temporal_patch_size"], v["patch_size"], v["patch_size"]), "matrix"))
    for i in range(v["depth"]):
        p = "visual.blocks.%d." % i
        specs += [
            (p + "norm1.weight", (d,), "norm"), (p + "norm1.bias", (d,), "bias"),
            (p + "norm2.weight", (d,), "norm"), (p + "norm2.bias", (d,), "bias"),
            (p + "attn.qkv.weight", (3 * d, d), "matrix"), (p + "attn.qkv.bias", (3 * d,), "bias"),
            (p + "attn.proj.weight", (d, d), "matrix"), (p + "attn.proj.bias", (d,), "bias"),
            (p + "mlp.fc1.weight", (f, d), "matrix"), (p + "mlp.fc1.bias", (f,), "bias"),
            (p + "mlp.fc2.weight", (d, f), "matrix"), (p + "mlp.fc2.bias", (d,), "bias"),
        ]
    specs += [
        ("visual.merger.ln_q.weight", (d,), "norm"), ("visual.merger.ln_q.bias", (d,), "bias"),
        ("visual.merger.mlp.0.weight", (m, m), "matrix"), ("visual.merger.mlp.0.bias", (m,), "bias"),
        ("visual.merger.mlp.2.weight", (v["hidden_size"], m), "matrix"),
        ("visual.merger.mlp.2.bias", (v["hidden_size"],), "bias"),
    ]
    return specs


def preprocessor_config():
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": llava.CLIP_MEAN,
        "image_processor_type": "Qwen2VLImageProcessor",
        "image_std": llava.CLIP_STD,
        "max_pixels": PIXELS,
        "merge_size": VISION["spatial_merge_size"],
        "min_pixels": PIXELS,
        "patch_size": VISION["patch_size"],
        "processor_class": "Qwen2VLProcessor",
        "resample": 3,
        "rescale_factor": 1.0 / 255.0,
        "size": {"max_pixels": PIXELS, "min_pixels": PIXELS},
        "temporal_patch_size": VISION["temporal_patch_size"],
    }


def tokenizer_config(max_length):
    decoder = {"0": llava.added_token("<unk>"), "1": llava.added_token("<s>"), "2": llava.added_token("</s>")}
    decoder.update({str(TOKEN[t]): llava.added_token(t) for t in ADDED})
    return {
        "add_bos_token": False,  # Qwen2's tokenizer adds nothing; its template starts with <|im_start|>
        "add_eos_token": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ADDED[1:],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "legacy": True,
        "model_max_length": max_length,
        "pad_token": "<|endoftext|>",
        "padding_side": "right",
        "processor_class": "Qwen2VLProcessor",
        "sp_model_kwargs": {},
        "split_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
    }


SPECIAL_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>",
                  "additional_special_tokens": ADDED[1:]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created if missing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=llava.TOKENIZER, help="the Llama 2 tokenizer.model to copy")
    ap.add_argument("--force", action="store_true", help="rewrite even if an identical checkpoint exists")
    args = ap.parse_args(argv)

    if not os.path.isfile(args.tokenizer):
        print("error: %s not found (the shared assets live in ../shared, next to this checkout; or give "
              "--tokenizer)" % args.tokenizer, file=sys.stderr)
        return 1
    cfg = model_config()
    specs = tensor_specs(cfg)
    total = sum(bench.numel(s) for _, s, _ in specs)
    merger = sum(bench.numel(s) for n, s, _ in specs if n.startswith("visual.merger."))
    vision = sum(bench.numel(s) for n, s, _ in specs if n.startswith("visual.")) - merger
    metadata = {
        "format": "pt",
        "generator": GENERATOR,
        "seed": str(args.seed),
        "init": "matrices N(0,%g), norms 1+%g*N(0,1), biases %g*N(0,1), numpy default_rng float32"
                % (llava.INIT_STD, llava.NORM_JITTER, llava.BIAS_STD),
    }
    header, data_bytes = bench.build_header(specs, metadata)
    print("bench25m-qwen2-vl seed %d: %d parameters (%.1fM): vision tower %.2fM, merger %.2fM, language model %.1fM"
          % (args.seed, total, total / 1e6, vision / 1e6, merger / 1e6, (total - vision - merger) / 1e6))

    out = args.out
    if not args.force and bench.existing_matches(out, cfg, metadata, data_bytes) and all(
            os.path.isfile(os.path.join(out, f)) for f in
            ("preprocessor_config.json", "tokenizer.model", "tokenizer_config.json")):
        print("%s already holds this checkpoint; nothing to do (--force rewrites it)" % out)
        return 0
    os.makedirs(out, exist_ok=True)
    cfg_path = os.path.join(out, "config.json")
    if os.path.exists(cfg_path):  # a folder whose config.json is present is a finished checkpoint
        os.remove(cfg_path)

    st_path = os.path.join(out, "model.safetensors")
    tmp = "%s.tmp-%d" % (st_path, os.getpid())
    rng = np.random.default_rng(args.seed)
    try:
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", len(header)))
            fh.write(header)
            for _, shape, kind in specs:
                x = llava.draw(rng, shape, kind)
                fh.write(np.ascontiguousarray(x, dtype="<f4").data)
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

    tok_tmp = os.path.join(out, "tokenizer.model.tmp-%d" % os.getpid())
    shutil.copyfile(args.tokenizer, tok_tmp)
    os.replace(tok_tmp, os.path.join(out, "tokenizer.model"))
    bench.write_json_atomic(os.path.join(out, "tokenizer_config.json"), tokenizer_config(cfg["max_position_embeddings"]))
    bench.write_json_atomic(os.path.join(out, "special_tokens_map.json"), SPECIAL_TOKENS)
    bench.write_json_atomic(os.path.join(out, "preprocessor_config.json"), preprocessor_config())
    bench.write_json_atomic(os.path.join(out, "generation_config.json"),
                            {"bos_token_id": TOKEN["<|endoftext|>"],
                             "eos_token_id": [TOKEN["<|im_end|>"], TOKEN["<|endoftext|>"]],
                             "pad_token_id": TOKEN["<|endoftext|>"], "do_sample": False})
    bench.write_json_atomic(cfg_path, cfg)
    print("wrote %s (%.1f MB)" % (out, (8 + len(header) + data_bytes) / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
