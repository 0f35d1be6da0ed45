#!/usr/bin/python3
"""Write swiftcpp's benchmark LLaVA: bench25m's language model with a CLIP-style vision tower at 336 px and the
LLaVA-1.5 projector, random weights, in Hugging Face's LlavaForConditionalGeneration layout.

Usage:
    /usr/bin/python3 scripts/make_bench_llava.py --out bench/models/bench25m-llava [--seed 0] [--force]

Output folder:
    config.json               LlavaForConditionalGeneration: text_config = bench25m's config (see
                              scripts/make_bench_model.py) with vocab_size 32064 (the Llama 2 vocabulary's 32000
                              pieces, <image> = 32000, 63 unused rows, as llava-1.5-hf pads it), vision_config =
                              VISION below (336 px, patch 14: 576 patches), projector_hidden_act gelu,
                              vision_feature_layer -2, vision_feature_select_strategy default
    model.safetensors         float32, Hugging Face tensor names (language_model.*, multi_modal_projector.*,
                              vision_tower.vision_model.*; the layout of ../shared/assets/reference/llava/tiny-llava)
    preprocessor_config.json  CLIPImageProcessor at 336 (shortest_edge and crop), CLIP mean/std, bicubic
    tokenizer.model           the Llama 2 sentencepiece model from ../shared/assets/tokenizers/llama2 (the
                              vocabulary bench25m is shaped for)
    tokenizer_config.json, special_tokens_map.json, generation_config.json
                              LlamaTokenizer with <image> as added special token 32000 (tiny-llava's layout)

Weights (deterministic for a given seed): rng = numpy.random.default_rng(seed), every tensor drawn in the order
of tensor_specs(): the language model in bench25m's order (prefixed language_model.), then the projector, then the
vision tower.
    - matrices, embeddings, the patch convolution and class_embedding: N(0, 0.02)
    - RMSNorm / LayerNorm weights: 1 + 0.1 N(0, 1); biases: 0.02 N(0, 1)
The benchmark measures time, so only the shapes matter; the norms and biases are perturbed so that no weight is a
constant that a kernel could skip.

Idempotent: a folder that already holds a checkpoint made from the same config and seed is left alone (--force
rewrites it). Tensors are generated and written one at a time, to a temporary file renamed into place when
complete; config.json is written last.
"""

import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_bench_model as bench  # noqa: E402  (the bench25m preset and safetensors helpers)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(REPO, "..", "shared", "assets", "tokenizers", "llama2", "tokenizer.model")

GENERATOR = "swiftcpp scripts/make_bench_llava.py v1"
IMAGE_TOKEN = 32000
VOCAB = 32064  # 32000 pieces + <image> + 63 unused rows (llava-1.5-hf's size)
INIT_STD = 0.02
NORM_JITTER = 0.1
BIAS_STD = 0.02

VISION = {
    "model_type": "clip_vision_model",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "image_size": 336,
    "patch_size": 14,
    "num_channels": 3,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "projection_dim": 256,
}

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def text_config():
    cfg = dict(bench.PRESETS["bench25m"])
    del cfg["architectures"]
    cfg["vocab_size"] = VOCAB
    return cfg


def model_config():
    return {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "ignore_index": -100,
        "image_token_index": IMAGE_TOKEN,
        "pad_token_id": 0,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "text_config": text_config(),
        "vision_config": dict(VISION),
    }


def tensor_specs(cfg):
    """[(name, shape, kind)] in generation/file order; kind is 'matrix', 'norm' or 'bias'."""
    specs = [("language_model." + n, s, k) for n, s, k in bench.tensor_specs(cfg["text_config"])]
    v = cfg["vision_config"]
    d, f = v["hidden_size"], v["intermediate_size"]
    dt = cfg["text_config"]["hidden_size"]
    specs += [
        ("multi_modal_projector.linear_1.weight", (dt, d), "matrix"),
        ("multi_modal_projector.linear_1.bias", (dt,), "bias"),
        ("multi_modal_projector.linear_2.weight", (dt, dt), "matrix"),
        ("multi_modal_projector.linear_2.bias", (dt,), "bias"),
    ]
    p = "vision_tower.vision_model."
    patches = (v["image_size"] // v["patch_size"]) ** 2
    specs += [
        (p + "embeddings.class_embedding", (d,), "matrix"),
        (p + "embeddings.patch_embedding.weight", (d, v["num_channels"], v["patch_size"], v["patch_size"]), "matrix"),
        (p + "embeddings.position_embedding.weight", (patches + 1, d), "matrix"),
        (p + "pre_layrnorm.weight", (d,), "norm"),
        (p + "pre_layrnorm.bias", (d,), "bias"),
    ]
    for i in range(v["num_hidden_layers"]):
        q = p + "encoder.layers.%d." % i
        specs += [(q + "layer_norm1.weight", (d,), "norm"), (q + "layer_norm1.bias", (d,), "bias")]
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            specs += [(q + "self_attn.%s.weight" % proj, (d, d), "matrix"), (q + "self_attn.%s.bias" % proj, (d,), "bias")]
        specs += [
            (q + "layer_norm2.weight", (d,), "norm"),
            (q + "layer_norm2.bias", (d,), "bias"),
            (q + "mlp.fc1.weight", (f, d), "matrix"),
            (q + "mlp.fc1.bias", (f,), "bias"),
            (q + "mlp.fc2.weight", (d, f), "matrix"),
            (q + "mlp.fc2.bias", (d,), "bias"),
        ]
    specs += [(p + "post_layernorm.weight", (d,), "norm"), (p + "post_layernorm.bias", (d,), "bias")]
    return specs


def draw(rng, shape, kind):
    x = rng.standard_normal(shape, dtype=np.float32)
    if kind == "matrix":
        x *= np.float32(INIT_STD)
    elif kind == "bias":
        x *= np.float32(BIAS_STD)
    else:
        x *= np.float32(NORM_JITTER)
        x += np.float32(1.0)
    return x


def preprocessor_config(size):
    return {
        "crop_size": {"height": size, "width": size},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "CLIPImageProcessor",
        "image_std": CLIP_STD,
        "processor_class": "LlavaProcessor",
        "resample": 3,
        "rescale_factor": 1.0 / 255.0,
        "size": {"shortest_edge": size},
    }


def added_token(content):
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True}


def tokenizer_config(max_length):
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {"0": added_token("<unk>"), "1": added_token("<s>"), "2": added_token("</s>"),
                                 str(IMAGE_TOKEN): added_token("<image>")},
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": max_length,
        "padding_side": "right",
        "processor_class": "LlavaProcessor",
        "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizer",
    }


SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
                  "additional_special_tokens": ["<image>"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created if missing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=TOKENIZER, help="the Llama 2 tokenizer.model to copy")
    ap.add_argument("--force", action="store_true", help="rewrite even if an identical checkpoint exists")
    args = ap.parse_args(argv)

    if not os.path.isfile(args.tokenizer):
        print("error: %s not found (the shared assets live in ../shared, next to this checkout; or give "
              "--tokenizer)" % args.tokenizer, file=sys.stderr)
        return 1
    cfg = model_config()
    specs = tensor_specs(cfg)
    total = sum(bench.numel(s) for _, s, _ in specs)
    vision = sum(bench.numel(s) for n, s, _ in specs if n.startswith("vision_tower."))
    projector = sum(bench.numel(s) for n, s, _ in specs if n.startswith("multi_modal_projector."))
    metadata = {
        "format": "pt",
        "generator": GENERATOR,
        "seed": str(args.seed),
        "init": "matrices N(0,%g), norms 1+%g*N(0,1), biases %g*N(0,1), numpy default_rng float32"
                % (INIT_STD, NORM_JITTER, BIAS_STD),
    }
    header, data_bytes = bench.build_header(specs, metadata)
    print("bench25m-llava seed %d: %d parameters (%.1fM): vision tower %.2fM, projector %.2fM, language model %.1fM"
          % (args.seed, total, total / 1e6, vision / 1e6, projector / 1e6, (total - vision - projector) / 1e6))

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
                x = draw(rng, shape, kind)
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
    text = cfg["text_config"]
    bench.write_json_atomic(os.path.join(out, "tokenizer_config.json"),
                            tokenizer_config(text["max_position_embeddings"]))
    bench.write_json_atomic(os.path.join(out, "special_tokens_map.json"), SPECIAL_TOKENS)
    bench.write_json_atomic(os.path.join(out, "preprocessor_config.json"), preprocessor_config(VISION["image_size"]))
    bench.write_json_atomic(os.path.join(out, "generation_config.json"),
                            {"bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"],
                             "pad_token_id": 0, "do_sample": False})
    bench.write_json_atomic(cfg_path, cfg)
    print("wrote %s (%.1f MB)" % (out, (8 + len(header) + data_bytes) / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
