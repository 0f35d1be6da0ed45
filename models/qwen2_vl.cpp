// Qwen2-VL and Qwen2.5-VL (Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration): a ViT over
// patches of any image size with 2-D rotary positions (`visual`), a PatchMerger folding each 2x2 block of patches
// into one language-model token (`visual.merger`), and Qwen2 with M-RoPE as the language model (`model`,
// `lm_head` at the top, as transformers 4.46-4.49 name them). Qwen2.5-VL's tower uses RMSNorm, a gated SiLU MLP
// and window attention in every block but `fullatt_block_indexes`.
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/json.h"
#include "models/decoder/decoder.h"
#include "models/registry.h"
#include "models/vision/clip.h"

namespace swiftcpp {

namespace {

at::Tensor placeholder(at::IntArrayRef shape) { return at::empty({1}).expand(shape); }

/// vision_config of either version, with the class defaults transformers leaves out of a saved config.
struct QwenVisionSettings {
  bool v2_5 = false;           // Qwen2.5-VL: RMSNorm, gated MLP, window attention
  int64_t depth = 32;
  int64_t width = 1280;        // Qwen2-VL embed_dim; Qwen2.5-VL hidden_size
  int64_t heads = 16;
  int64_t mlp_width = 5120;    // Qwen2-VL embed_dim * mlp_ratio; Qwen2.5-VL intermediate_size
  int64_t out_width = 3584;    // the merger's output: Qwen2-VL hidden_size; Qwen2.5-VL out_hidden_size
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge = 2;           // spatial_merge_size
  std::string act = "quick_gelu";
  int64_t window_size = 112;   // Qwen2.5-VL, in pixels
  std::vector<int64_t> full_blocks;  // Qwen2.5-VL fullatt_block_indexes

  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merged_dim() const { return width * merge * merge; }
  int64_t parameter_count() const {
    CheckedCount n;
    const int64_t w = width;
    int64_t block = n.add(n.mul(3 * w, w + 1), n.mul(w, w + 1));       // qkv, proj with biases
    block = v2_5 ? n.add(block, n.add(n.mul(2 * mlp_width, w + 1), n.mul(w, mlp_width + 1)))
                 : n.add(block, n.add(n.mul(mlp_width, w + 1), n.mul(w, mlp_width + 1)));
    block = n.add(block, (v2_5 ? 2 : 4) * w);                            // norms
    int64_t total = n.add(n.mul(w, patch_dim()), n.mul(depth, block));
    total = n.add(total, n.add(n.mul(merged_dim(), merged_dim() + 1), n.mul(out_width, merged_dim() + 1)));
    total = n.add(total, (v2_5 ? 1 : 2) * w);
    return n.overflow ? -1 : total;
  }
};

/// `patch_embed.proj`: a Conv3d whose kernel equals its stride, stored [width, C, T, P, P] without bias.
class PatchProjImpl : public torch::nn::Module {
 public:
  explicit PatchProjImpl(const QwenVisionSettings& s) {
    weight = register_parameter("weight", placeholder({s.width, s.in_channels, s.temporal_patch_size, s.patch_size,
                                                       s.patch_size}));
  }
  at::Tensor weight;
};
TORCH_MODULE(PatchProj);

class PatchEmbedImpl : public torch::nn::Module {
 public:
  explicit PatchEmbedImpl(const QwenVisionSettings& s) { proj = register_module("proj", PatchProj(s)); }
  /// patches [N, C T P P] (the processor's row layout is the kernel's flattening order) -> [N, width]
  at::Tensor forward(const at::Tensor& patches) {
    return at::matmul(patches.to(proj->weight.scalar_type()), proj->weight.reshape({proj->weight.size(0), -1}).t());
  }
  PatchProj proj{nullptr};
};
TORCH_MODULE(PatchEmbed);

class VisionAttentionImpl : public torch::nn::Module {
 public:
  explicit VisionAttentionImpl(const QwenVisionSettings& s) : heads_(s.heads), head_dim_(s.width / s.heads) {
    qkv = register_module("qkv", nn::Linear(s.width, 3 * s.width, true));
    proj = register_module("proj", nn::Linear(s.width, s.width, true));
  }
  /// x [N, width] -> [N, width]: each patch attends to the patches of its own segment (image or window);
  /// `segments` are consecutive row counts summing to N. cos/sin [1, 1, N, Dh] (signed sine, nn::apply_rotary).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& segments) {
    const int64_t N = x.size(0);
    const at::Tensor qkv_out = qkv(x).view({N, 3, heads_, head_dim_});          // [N, 3, H, Dh]
    // Rotary in float32 and cast back, as transformers' apply_rotary_pos_emb_vision (bf16 autocast included).
    const auto rotate = [&](int64_t which) {
      const at::Tensor part = qkv_out.select(1, which).transpose(0, 1).unsqueeze(0);  // [1, H, N, Dh]
      return nn::apply_rotary(part.to(at::kFloat), cos, sin).to(part.scalar_type());
    };
    const at::Tensor q = rotate(0), k = rotate(1);
    const at::Tensor v = qkv_out.select(1, 2).transpose(0, 1).unsqueeze(0);
    std::vector<at::Tensor> outs;
    outs.reserve(segments.size());
    int64_t start = 0;
    for (const int64_t n : segments) {
      outs.push_back(nn::attention(q.narrow(2, start, n), k.narrow(2, start, n), v.narrow(2, start, n), at::Tensor()));
      start += n;
    }
    const at::Tensor out = outs.size() == 1 ? outs[0] : at::cat(outs, 2);  // [1, H, N, Dh]
    return proj(out.squeeze(0).transpose(0, 1).reshape({N, heads_ * head_dim_}));
  }
  nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  int64_t heads_, head_dim_;
};
TORCH_MODULE(VisionAttention);

class VisionMlpImpl : public torch::nn::Module {
 public:
  explicit VisionMlpImpl(const QwenVisionSettings& s) : act_(s.act) {
    if (s.v2_5) {
      gate_proj = register_module("gate_proj", nn::Linear(s.width, s.mlp_width, true));
      up_proj = register_module("up_proj", nn::Linear(s.width, s.mlp_width, true));
      down_proj = register_module("down_proj", nn::Linear(s.mlp_width, s.width, true));
    } else {
      fc1 = register_module("fc1", nn::Linear(s.width, s.mlp_width, true));
      fc2 = register_module("fc2", nn::Linear(s.mlp_width, s.width, true));
    }
  }
  /// [N, width] -> [N, width]
  at::Tensor forward(const at::Tensor& x) {
    if (fc1) return fc2(apply_activation(act_, fc1(x)));
    return down_proj(apply_activation(act_, gate_proj(x)) * up_proj(x));
  }
  nn::Linear fc1{nullptr}, fc2{nullptr}, gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(VisionMlp);

constexpr double kVisionEps = 1e-6;  // hard-coded in both towers

class VisionBlockImpl : public torch::nn::Module {
 public:
  explicit VisionBlockImpl(const QwenVisionSettings& s) {
    const nn::NormKind kind = s.v2_5 ? nn::NormKind::kRMSNorm : nn::NormKind::kLayerNorm;
    norm1 = register_module("norm1", nn::Norm(kind, s.width, kVisionEps));
    norm2 = register_module("norm2", nn::Norm(kind, s.width, kVisionEps));
    attn = register_module("attn", VisionAttention(s));
    mlp = register_module("mlp", VisionMlp(s));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& segments) {
    const at::Tensor h = x + attn(norm1(x), cos, sin, segments);
    return h + mlp(norm2(h));
  }
  nn::Norm norm1{nullptr}, norm2{nullptr};
  VisionAttention attn{nullptr};
  VisionMlp mlp{nullptr};
};
TORCH_MODULE(VisionBlock);

/// `merger.mlp`: Linear (index 0), GELU, Linear (index 2), as nn.Sequential names them.
class MergerMlpImpl : public torch::nn::Module {
 public:
  explicit MergerMlpImpl(const QwenVisionSettings& s) {
    first = register_module("0", nn::Linear(s.merged_dim(), s.merged_dim(), true));
    second = register_module("2", nn::Linear(s.merged_dim(), s.out_width, true));
  }
  at::Tensor forward(const at::Tensor& x) { return second(at::gelu(first(x))); }
  nn::Linear first{nullptr}, second{nullptr};
};
TORCH_MODULE(MergerMlp);

class PatchMergerImpl : public torch::nn::Module {
 public:
  explicit PatchMergerImpl(const QwenVisionSettings& s) : merged_(s.merged_dim()) {
    ln_q = register_module("ln_q", nn::Norm(s.v2_5 ? nn::NormKind::kRMSNorm : nn::NormKind::kLayerNorm, s.width,
                                            kVisionEps));
    mlp = register_module("mlp", MergerMlp(s));
  }
  /// [N, width] (4 consecutive rows per merged token) -> [N / 4, out_width]
  at::Tensor forward(const at::Tensor& x) { return mlp(ln_q(x).reshape({-1, merged_})); }
  nn::Norm ln_q{nullptr};
  MergerMlp mlp{nullptr};

 private:
  int64_t merged_;
};
TORCH_MODULE(PatchMerger);

/// `visual`: patch embedding, blocks and merger.
class QwenVisionTowerImpl : public torch::nn::Module {
 public:
  explicit QwenVisionTowerImpl(const QwenVisionSettings& s) {
    patch_embed = register_module("patch_embed", PatchEmbed(s));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < s.depth; ++i) blocks->push_back(VisionBlock(s));
    merger = register_module("merger", PatchMerger(s));
  }
  PatchEmbed patch_embed{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  PatchMerger merger{nullptr};
};
TORCH_MODULE(QwenVisionTower);

class QwenVisionEncoderImpl : public VisionEncoderImpl {
 public:
  explicit QwenVisionEncoderImpl(const QwenVisionSettings& s) : s_(s) {
    visual = register_module("visual", QwenVisionTower(s));
    // Vision RoPE: theta 10000 over half the head width (hard-coded in both towers), float32 as transformers.
    const int64_t dim = s.width / s.heads / 2;
    inv_freq_ = 1.0 / at::pow(10000.0, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim));
  }

  int64_t feature_rows(const at::Tensor& pixel_values, const at::Tensor& grid) const override {
    if (!grid.defined() || grid.dim() != 2 || grid.size(1) != 3) {
      fail<ModelError>("Qwen2-VL images need image_grid_thw [N, 3] beside pixel_values");
    }
    const at::Tensor g = grid.to(at::kCPU, at::kLong).contiguous();
    const int64_t* p = g.data_ptr<int64_t>();
    int64_t patches = 0, tokens = 0;
    for (int64_t i = 0; i < g.size(0); ++i) {
      const int64_t t = p[i * 3], h = p[i * 3 + 1], w = p[i * 3 + 2];
      if (t < 1 || h < 1 || w < 1 || h % s_.merge != 0 || w % s_.merge != 0 || h > (1 << 16) || w > (1 << 16) ||
          t > (1 << 12)) {
        fail<ModelError>("image {}: grid {}x{}x{} must be positive with h and w multiples of the merge size {}", i, t,
                         h, w, s_.merge);
      }
      patches += t * h * w;
      tokens += t * h * w / (s_.merge * s_.merge);
    }
    if (pixel_values.dim() != 2 || pixel_values.size(0) != patches || pixel_values.size(1) != s_.patch_dim()) {
      fail<ModelError>("Qwen2-VL pixel_values must be [{} patches, {}] for these grids, got [{}]", patches,
                       s_.patch_dim(), fmt::join(pixel_values.sizes(), ", "));
    }
    return tokens;
  }

  at::Tensor encode(const at::Tensor& pixel_values, const at::Tensor& grid) override {
    (void)feature_rows(pixel_values, grid);
    const at::Tensor g = grid.to(at::kCPU, at::kLong).contiguous();
    const int64_t images = g.size(0);
    const int64_t* p = g.data_ptr<int64_t>();
    const at::Device device = visual->merger->ln_q->weight.device();
    const int64_t m2 = s_.merge * s_.merge;
    // Per patch: its row and column in its image (the layout rule: merge blocks in raster order, 2x2 inside),
    // and the order the blocks run in (window order for Qwen2.5-VL, else as given), with the segments.
    std::vector<int64_t> rows, cols, token_order;
    std::vector<int64_t> image_segments, window_segments;
    int64_t token_base = 0;
    for (int64_t i = 0; i < images; ++i) {
      const int64_t t = p[i * 3], h = p[i * 3 + 1], w = p[i * 3 + 2];
      const int64_t bh = h / s_.merge, bw = w / s_.merge;
      for (int64_t f = 0; f < t; ++f) {
        for (int64_t block = 0; block < bh * bw; ++block) {
          for (int64_t k = 0; k < m2; ++k) {
            rows.push_back((block / bw) * s_.merge + k / s_.merge);
            cols.push_back((block % bw) * s_.merge + k % s_.merge);
          }
        }
      }
      image_segments.push_back(t * h * w);
      if (s_.v2_5) {
        // Windows of ws x ws merged tokens from the top-left (the last ones partial), per frame, raster order.
        const int64_t ws = std::max<int64_t>(1, s_.window_size / s_.merge / s_.patch_size);
        for (int64_t f = 0; f < t; ++f) {
          for (int64_t wr = 0; wr < bh; wr += ws) {
            for (int64_t wc = 0; wc < bw; wc += ws) {
              int64_t n = 0;
              for (int64_t r = wr; r < std::min(bh, wr + ws); ++r) {
                for (int64_t c = wc; c < std::min(bw, wc + ws); ++c) {
                  token_order.push_back(token_base + f * bh * bw + r * bw + c);
                  ++n;
                }
              }
              window_segments.push_back(n * m2);
            }
          }
        }
      }
      token_base += t * bh * bw;
    }
    bool tower_trains = false;
    for (const auto& param : visual->parameters()) tower_trains = tower_trains || param.requires_grad();
    at::Tensor hidden;  // [N, width]
    {
      // Profiler ranges named after the modules (bench/bench_mm_train.cpp splits a training step by them).
      RECORD_USER_SCOPE_WITH_INPUTS("visual", std::vector<c10::IValue>{pixel_values});
      // A frozen tower (freeze_vit) runs without autograd; the merger below still records when it trains.
      bool blocks_train = false;
      for (const auto& param : visual->blocks->parameters()) blocks_train = blocks_train || param.requires_grad();
      for (const auto& param : visual->patch_embed->parameters()) blocks_train = blocks_train || param.requires_grad();
      at::AutoGradMode grad(blocks_train && at::GradMode::is_enabled());
      hidden = visual->patch_embed(pixel_values.to(device));  // [N, width]
      // Angles [N, Dh/2] = [row * inv, col * inv]; cos/sin of [a, a] with the rotate-half sign folded into sin.
      const at::Tensor inv = inv_freq_.to(device);
      const auto longs = at::TensorOptions().dtype(at::kLong);
      const at::Tensor r = at::tensor(rows, longs).to(device, at::kFloat).unsqueeze(1);
      const at::Tensor c = at::tensor(cols, longs).to(device, at::kFloat).unsqueeze(1);
      const at::Tensor angles = at::cat({r * inv.unsqueeze(0), c * inv.unsqueeze(0)}, 1);  // [N, Dh/2]
      at::Tensor emb = at::cat({angles, angles}, 1);                                      // [N, Dh]
      std::vector<int64_t> patch_order;
      if (s_.v2_5) {
        // Blocks run in window order: each window's patches consecutive; the merger's output is put back.
        patch_order.reserve(token_order.size() * static_cast<size_t>(m2));
        for (const int64_t tok : token_order) {
          for (int64_t k = 0; k < m2; ++k) patch_order.push_back(tok * m2 + k);
        }
        const at::Tensor order = at::tensor(patch_order, longs).to(device);
        hidden = hidden.index_select(0, order);
        emb = emb.index_select(0, order);
      }
      const int64_t half = emb.size(1) / 2;
      const at::Tensor cos = emb.cos().view({1, 1, emb.size(0), emb.size(1)});  // float32
      const at::Tensor sin_raw = emb.sin();
      const at::Tensor sin = at::cat({-sin_raw.narrow(1, 0, half), sin_raw.narrow(1, half, half)}, 1)
                                 .view({1, 1, emb.size(0), emb.size(1)});
      for (size_t b = 0; b < visual->blocks->size(); ++b) {
        const bool full = !s_.v2_5 || std::find(s_.full_blocks.begin(), s_.full_blocks.end(),
                                                static_cast<int64_t>(b)) != s_.full_blocks.end();
        hidden = visual->blocks[b]->as<VisionBlock>()->forward(hidden, cos, sin, full ? image_segments : window_segments);
      }
    }
    RECORD_USER_SCOPE("visual.merger");
    at::Tensor out = visual->merger(hidden);  // [M, out_width]
    if (s_.v2_5) {
      std::vector<int64_t> inverse(token_order.size());
      for (size_t i = 0; i < token_order.size(); ++i) inverse[static_cast<size_t>(token_order[i])] = static_cast<int64_t>(i);
      out = out.index_select(0, at::tensor(inverse, at::kLong).to(out.device()));
    }
    return out;
  }

  QwenVisionTower visual{nullptr};

 private:
  QwenVisionSettings s_;
  at::Tensor inv_freq_;  // [Dh / 4] float32, CPU
};

int64_t positive(const JsonObject& j, const char* key, int64_t fallback, int64_t limit) {
  const int64_t v = j.get_or<int64_t>(key, fallback);
  if (v <= 0 || v > limit) {
    fail<ConfigError>("{}: 'vision_config.{}' must be in [1, {}], got {}", j.origin(), key, limit, v);
  }
  return v;
}

QwenVisionSettings parse_vision(const JsonObject& v, bool v2_5) {
  QwenVisionSettings s;
  s.v2_5 = v2_5;
  s.depth = positive(v, "depth", 32, kMaxLayers);
  s.heads = positive(v, "num_heads", 16, kMaxHeads);
  s.in_channels = positive(v, "in_channels", v.get_or<int64_t>("in_chans", 3), 16);
  s.patch_size = positive(v, "patch_size", 14, 1024);
  s.temporal_patch_size = positive(v, "temporal_patch_size", 2, 64);
  s.merge = positive(v, "spatial_merge_size", 2, 64);
  if (v2_5) {
    s.width = positive(v, "hidden_size", 3584, kMaxHiddenSize);
    s.mlp_width = positive(v, "intermediate_size", 3420, kMaxIntermediateSize);
    s.out_width = positive(v, "out_hidden_size", 3584, kMaxHiddenSize);
    s.act = v.get_or<std::string>("hidden_act", "silu");
    s.window_size = positive(v, "window_size", 112, 1 << 20);
    // The windows are whole merged patches (transformers divides window_size by both and relies on the rest being 0).
    if (s.window_size % (s.patch_size * s.merge) != 0) {
      fail<ConfigError>("{}: 'vision_config.window_size' {} must be a multiple of patch_size * spatial_merge_size = {}",
                        v.origin(), s.window_size, s.patch_size * s.merge);
    }
    s.full_blocks = {7, 15, 23, 31};
    if (v.has("fullatt_block_indexes")) {
      const Json& list = v.raw().at("fullatt_block_indexes");
      if (!list.is_array()) fail<ConfigError>("{}: 'vision_config.fullatt_block_indexes' must be a list", v.origin());
      s.full_blocks.clear();
      for (const Json& e : list) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= s.depth) {
          fail<ConfigError>("{}: 'vision_config.fullatt_block_indexes' must hold block indexes in [0, {}), got {}",
                            v.origin(), s.depth, describe_json(e));
        }
        s.full_blocks.push_back(e.get<int64_t>());
      }
    }
  } else {
    s.width = positive(v, "embed_dim", 1280, kMaxHiddenSize);
    s.out_width = positive(v, "hidden_size", 3584, kMaxHiddenSize);
    const double ratio = v.get_or<double>("mlp_ratio", 4.0);
    if (!(ratio > 0) || ratio > 64) fail<ConfigError>("{}: 'vision_config.mlp_ratio' must be in (0, 64]", v.origin());
    s.mlp_width = static_cast<int64_t>(static_cast<double>(s.width) * ratio);
    s.act = v.get_or<std::string>("hidden_act", "quick_gelu");
  }
  (void)apply_activation(s.act, at::zeros({1}));  // an unknown activation fails here, with its name
  if (s.width % s.heads != 0 || (s.width / s.heads) % 4 != 0) {
    fail<ConfigError>("{}: the vision width {} must split into {} heads of a width divisible by 4 (2-D rotary)",
                      v.origin(), s.width, s.heads);
  }
  return s;
}

DecoderConfig parse_qwen2_vl_family(const JsonObject& json, bool v2_5) {
  const std::string origin = json.origin();
  // The language model: the top level (transformers 4.46-4.49), or a nested text_config (later versions), read
  // as Qwen2 with the M-RoPE sections taken out of rope_scaling.
  Json text = json.raw();
  text.erase("vision_config");
  if (json.has("text_config")) {
    const Json& nested = json.raw().at("text_config");
    if (!nested.is_object()) fail<ConfigError>("{}: 'text_config' must be an object", origin);
    for (auto it = nested.begin(); it != nested.end(); ++it) text[it.key()] = it.value();
    text.erase("text_config");
  }
  std::vector<int64_t> sections;
  if (text.contains("rope_scaling") && text["rope_scaling"].is_object()) {
    Json rs = text["rope_scaling"];
    const std::string type = rs.value("type", rs.value("rope_type", std::string("default")));
    if (rs.contains("mrope_section")) {
      const Json& list = rs["mrope_section"];
      if (!list.is_array()) fail<ConfigError>("{}: 'rope_scaling.mrope_section' must be a list of 3 integers", origin);
      for (const Json& e : list) {
        if (!e.is_number_integer()) {
          fail<ConfigError>("{}: 'rope_scaling.mrope_section' must hold integers, got {}", origin, describe_json(e));
        }
        sections.push_back(e.get<int64_t>());
      }
      rs.erase("mrope_section");
    }
    // Qwen's checkpoints say "mrope"; transformers rewrites it to "default" on load: both are plain M-RoPE.
    if (type == "mrope" || type == "default") rs = Json{{"type", "default"}};
    text["rope_scaling"] = rs;
  }
  if (sections.empty()) fail<ConfigError>("{}: 'rope_scaling.mrope_section' is missing (Qwen2-VL uses M-RoPE)", origin);
  text["model_type"] = "qwen2";
  text.erase("architectures");
  const JsonObject text_json(text, origin);
  DecoderConfig c = find_architecture(text_json).parse_config(text_json);
  c.model_type = v2_5 ? "qwen2_5_vl" : "qwen2_vl";
  c.architecture = v2_5 ? "Qwen2_5_VLForConditionalGeneration" : "Qwen2VLForConditionalGeneration";
  c.rope_scaling.mrope_section = sections;
  int64_t sum = 0;
  for (const int64_t x : sections) sum += x;
  if (sections.size() != 3 || 2 * sum != c.head_dim) {
    fail<ConfigError>("{}: 'rope_scaling.mrope_section' [{}] must be three sizes summing to head_dim / 2 ({})", origin,
                      fmt::join(sections, ", "), c.head_dim / 2);
  }

  const Json vision = json.has("vision_config") ? json.raw().at("vision_config") : Json::object();
  if (!vision.is_object()) fail<ConfigError>("{}: 'vision_config' must be an object, got {}", origin, describe_json(vision));
  const QwenVisionSettings s = parse_vision(JsonObject(vision, origin + " (vision_config)"), v2_5);
  if (s.out_width != c.hidden_size) {
    fail<ConfigError>("{}: the vision merger's output width {} ('vision_config.{}') must equal the language model's "
                      "hidden_size {}", origin, s.out_width, v2_5 ? "out_hidden_size" : "hidden_size", c.hidden_size);
  }
  auto mm = std::make_shared<MultimodalConfig>();
  mm->language_model = "";
  mm->vision_tower = {"visual.patch_embed", "visual.blocks"};
  mm->aligner = {"visual.merger"};
  // The special tokens index the language model's embeddings, and each names one role.
  const auto token = [&](const char* key, int64_t fallback) {
    const int64_t id = json.get_or<int64_t>(key, fallback);
    if (id < 0 || id >= c.vocab_size) {
      fail<ConfigError>("{}: '{}' must be a token of the vocabulary, in [0, vocab_size {}), got {}", origin, key,
                        c.vocab_size, id);
    }
    return id;
  };
  mm->image_token_index = token("image_token_id", 151655);
  mm->vision_start_token_id = token("vision_start_token_id", 151652);
  if (mm->vision_start_token_id == mm->image_token_index) {
    fail<ConfigError>("{}: 'vision_start_token_id' and 'image_token_id' are both {}: the image's start and its "
                      "placeholder must be different tokens", origin, mm->image_token_index);
  }
  if (json.has("video_token_id")) {
    const int64_t video = token("video_token_id", 0);
    if (video == mm->image_token_index || video == mm->vision_start_token_id) {
      fail<ConfigError>("{}: 'video_token_id' {} must differ from 'image_token_id' and 'vision_start_token_id'", origin,
                        video);
    }
    mm->video_token_id = video;
  } else if (int64_t{151656} < c.vocab_size && mm->image_token_index != 151656 && mm->vision_start_token_id != 151656) {
    mm->video_token_id = 151656;  // the config class's default
  }
  mm->image_markup = "<|vision_start|><|image_pad|><|vision_end|>";
  mm->num_channels = s.in_channels;
  mm->spatial_merge_size = s.merge;
  mm->parameter_count = s.parameter_count();
  if (mm->parameter_count < 0) fail<ConfigError>("{}: the vision tower's parameter count overflows", origin);
  mm->make_encoder = [s]() -> std::shared_ptr<VisionEncoderImpl> { return std::make_shared<QwenVisionEncoderImpl>(s); };
  c.multimodal = mm;
  return c;
}

DecoderConfig parse_qwen2_vl(const JsonObject& json) { return parse_qwen2_vl_family(json, false); }
DecoderConfig parse_qwen2_5_vl(const JsonObject& json) { return parse_qwen2_vl_family(json, true); }

}  // namespace

ArchitectureSpec qwen2_vl_spec() {
  return {"qwen2_vl", {"Qwen2VLForConditionalGeneration"},
          "Qwen2-VL (dynamic-resolution ViT + PatchMerger + Qwen2 with M-RoPE)", &parse_qwen2_vl};
}

ArchitectureSpec qwen2_5_vl_spec() {
  return {"qwen2_5_vl", {"Qwen2_5_VLForConditionalGeneration"},
          "Qwen2.5-VL (window-attention ViT with RMSNorm and a gated MLP + Qwen2 with M-RoPE)", &parse_qwen2_5_vl};
}

}  // namespace swiftcpp
