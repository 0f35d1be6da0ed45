#include "models/vision/clip.h"

#include <ATen/ATen.h>

#include <cmath>

#include "core/error.h"
#include "core/json.h"
#include "models/decoder/config.h"

namespace swiftcpp {

namespace {
at::Tensor placeholder(at::IntArrayRef shape) { return at::empty({1}).expand(shape); }

const char* const kActivations[] = {"quick_gelu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"};
}  // namespace

at::Tensor apply_activation(const std::string& name, const at::Tensor& x) {
  if (name == "quick_gelu") return x * at::sigmoid(x * 1.702);
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (name == "relu") return at::relu(x);
  if (name == "silu") return at::silu(x);
  fail<ConfigError>("activation '{}' is not supported", name);
}

ClipVisionConfig parse_clip_vision_config(const JsonObject& json) {
  ClipVisionConfig c;
  c.hidden_size = json.get_or<int64_t>("hidden_size", c.hidden_size);
  c.intermediate_size = json.get_or<int64_t>("intermediate_size", c.intermediate_size);
  c.num_hidden_layers = json.get_or<int64_t>("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = json.get_or<int64_t>("num_attention_heads", c.num_attention_heads);
  c.image_size = json.get_or<int64_t>("image_size", c.image_size);
  c.patch_size = json.get_or<int64_t>("patch_size", c.patch_size);
  c.num_channels = json.get_or<int64_t>("num_channels", c.num_channels);
  c.layer_norm_eps = json.get_or<double>("layer_norm_eps", c.layer_norm_eps);
  c.hidden_act = json.get_or<std::string>("hidden_act", c.hidden_act);
  if (json.has("model_type")) {
    const auto type = json.get<std::string>("model_type");
    if (type != "clip_vision_model") {
      fail<ConfigError>("{}: vision model_type '{}' is not supported (supported: clip_vision_model)", json.origin(),
                        type);
    }
  }
  return c;
}

void ClipVisionConfig::validate(const std::string& origin) const {
  auto bounded = [&](int64_t v, const char* key, int64_t limit) {
    if (v <= 0) fail<ConfigError>("{}: 'vision_config.{}' must be > 0, got {}", origin, key, v);
    if (v > limit) fail<ConfigError>("{}: 'vision_config.{}' is {}; at most {} is supported", origin, key, v, limit);
  };
  bounded(hidden_size, "hidden_size", kMaxHiddenSize);
  bounded(intermediate_size, "intermediate_size", kMaxIntermediateSize);
  bounded(num_hidden_layers, "num_hidden_layers", kMaxLayers);
  bounded(num_attention_heads, "num_attention_heads", kMaxHeads);
  bounded(image_size, "image_size", 16384);
  bounded(patch_size, "patch_size", 16384);
  bounded(num_channels, "num_channels", 16);
  if (image_size % patch_size != 0) {
    fail<ConfigError>("{}: 'vision_config.image_size' ({}) must be a multiple of 'patch_size' ({})", origin, image_size,
                      patch_size);
  }
  if (hidden_size % num_attention_heads != 0) {
    fail<ConfigError>("{}: 'vision_config.num_attention_heads' ({}) must divide 'hidden_size' ({})", origin,
                      num_attention_heads, hidden_size);
  }
  if (!(layer_norm_eps > 0) || !std::isfinite(layer_norm_eps)) {
    fail<ConfigError>("{}: 'vision_config.layer_norm_eps' must be a finite number > 0, got {}", origin, layer_norm_eps);
  }
  bool known = false;
  for (const char* a : kActivations) known = known || hidden_act == a;
  if (!known) {
    fail<ConfigError>("{}: 'vision_config.hidden_act' '{}' is not supported (supported: quick_gelu, gelu, gelu_new, "
                      "gelu_pytorch_tanh, relu, silu)", origin, hidden_act);
  }
  if (parameter_count() < 0 || parameter_count() > kMaxParameters) {
    fail<ConfigError>("{}: the vision_config sizes describe more than {} parameters", origin, kMaxParameters);
  }
}

int64_t ClipVisionConfig::parameter_count() const {
  CheckedCount n;
  const auto mul = [&](int64_t a, int64_t b) { return n.mul(a, b); };
  const auto add = [&](int64_t a, int64_t b) { return n.add(a, b); };
  const int64_t D = hidden_size;
  int64_t layer = mul(4, add(mul(D, D), D));                                  // q, k, v, out with biases
  layer = add(layer, add(mul(2, mul(D, intermediate_size)), add(intermediate_size, D)));  // fc1, fc2
  layer = add(layer, mul(4, D));                                              // two LayerNorms
  int64_t total = mul(layer, num_hidden_layers);
  const int64_t grid = image_size / std::max<int64_t>(patch_size, 1);
  total = add(total, mul(mul(D, num_channels), mul(patch_size, patch_size)));  // patch embedding
  total = add(total, add(D, mul(add(mul(grid, grid), 1), D)));                 // class + positions
  total = add(total, mul(4, D));                                              // pre and post norms
  return n.overflow ? -1 : total;
}

ClipAttentionImpl::ClipAttentionImpl(const ClipVisionConfig& c)
    : heads_(c.num_attention_heads), head_dim_(c.hidden_size / c.num_attention_heads) {
  q_proj = register_module("q_proj", nn::Linear(c.hidden_size, c.hidden_size, true));
  k_proj = register_module("k_proj", nn::Linear(c.hidden_size, c.hidden_size, true));
  v_proj = register_module("v_proj", nn::Linear(c.hidden_size, c.hidden_size, true));
  out_proj = register_module("out_proj", nn::Linear(c.hidden_size, c.hidden_size, true));
}

at::Tensor ClipAttentionImpl::forward(const at::Tensor& x) {
  const int64_t N = x.size(0), P = x.size(1);
  // [N, P, D] -> [N, H, P, Dh]; the query scaled before the product, as CLIPAttention does.
  const auto heads = [&](const at::Tensor& t) { return t.view({N, P, heads_, head_dim_}).transpose(1, 2); };
  const at::Tensor q = heads(q_proj(x) * std::pow(static_cast<double>(head_dim_), -0.5));
  const at::Tensor k = heads(k_proj(x));
  const at::Tensor v = heads(v_proj(x));
  const at::Tensor probs = at::softmax(at::matmul(q, k.transpose(-1, -2)), -1);  // [N, H, P, P]
  const at::Tensor out = at::matmul(probs, v);                                   // [N, H, P, Dh]
  return out_proj(out.transpose(1, 2).reshape({N, P, heads_ * head_dim_}));
}

ClipMLPImpl::ClipMLPImpl(const ClipVisionConfig& c) : act_(c.hidden_act) {
  fc1 = register_module("fc1", nn::Linear(c.hidden_size, c.intermediate_size, true));
  fc2 = register_module("fc2", nn::Linear(c.intermediate_size, c.hidden_size, true));
}

at::Tensor ClipMLPImpl::forward(const at::Tensor& x) { return fc2(apply_activation(act_, fc1(x))); }

ClipEncoderLayerImpl::ClipEncoderLayerImpl(const ClipVisionConfig& c) {
  self_attn = register_module("self_attn", ClipAttention(c));
  layer_norm1 = register_module("layer_norm1", nn::LayerNorm(c.hidden_size, c.layer_norm_eps));
  mlp = register_module("mlp", ClipMLP(c));
  layer_norm2 = register_module("layer_norm2", nn::LayerNorm(c.hidden_size, c.layer_norm_eps));
}

at::Tensor ClipEncoderLayerImpl::forward(const at::Tensor& x) {
  const at::Tensor h = x + self_attn(layer_norm1(x));
  return h + mlp(layer_norm2(h));
}

ClipEmbeddingsImpl::ClipEmbeddingsImpl(const ClipVisionConfig& c) : patch_size_(c.patch_size) {
  class_embedding = register_parameter("class_embedding", placeholder({c.hidden_size}));
  auto patch = register_module("patch_embedding", std::make_shared<torch::nn::Module>());
  patch_embedding_weight = patch->register_parameter(
      "weight", placeholder({c.hidden_size, c.num_channels, c.patch_size, c.patch_size}));
  position_embedding = register_module("position_embedding", nn::Embedding(c.num_patches() + 1, c.hidden_size));
}

at::Tensor ClipEmbeddingsImpl::forward(const at::Tensor& pixel_values) {
  const at::Tensor& w = patch_embedding_weight;  // [D, C, p, p] (load_weights fills it in place)
  const at::Tensor& cls = class_embedding;        // [D]
  const int64_t N = pixel_values.size(0), D = w.size(0);
  TORCH_CHECK(pixel_values.dim() == 4 && pixel_values.size(1) == w.size(1), "pixel_values must be [N, ",
              w.size(1), ", H, W], got ", pixel_values.sizes());
  const at::Tensor patches = at::conv2d(pixel_values.to(w.scalar_type()), w, {}, patch_size_);  // [N, D, gh, gw]
  TORCH_CHECK(patches.size(2) * patches.size(3) + 1 == position_embedding->weight.size(0),
              "pixel_values of ", pixel_values.size(2), "x", pixel_values.size(3),
              " do not match the vision tower's input size");
  const at::Tensor tokens = patches.flatten(2).transpose(1, 2);  // [N, P, D]
  const at::Tensor h = at::cat({cls.view({1, 1, D}).expand({N, 1, D}).to(tokens.scalar_type()), tokens}, 1);
  return h + position_embedding->weight.unsqueeze(0);  // [N, 1 + P, D]
}

ClipVisionTransformerImpl::ClipVisionTransformerImpl(const ClipVisionConfig& c) : config_(c) {
  embeddings = register_module("embeddings", ClipEmbeddings(c));
  pre_layrnorm = register_module("pre_layrnorm", nn::LayerNorm(c.hidden_size, c.layer_norm_eps));
  auto enc = register_module("encoder", std::make_shared<torch::nn::Module>());
  encoder = enc.get();
  layers = enc->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(ClipEncoderLayer(c));
  post_layernorm = register_module("post_layernorm", nn::LayerNorm(c.hidden_size, c.layer_norm_eps));
}

at::Tensor ClipVisionTransformerImpl::hidden_state(const at::Tensor& pixel_values, int64_t index) {
  const int64_t count = config_.num_hidden_layers + 1;  // hidden_states: the embeddings, then every layer
  const int64_t i = index < 0 ? count + index : index;
  if (i < 0 || i >= count) {
    fail<ModelError>("vision feature layer {} is out of range for a vision tower of {} layers", index,
                     config_.num_hidden_layers);
  }
  at::Tensor h = pre_layrnorm(embeddings(pixel_values));  // [N, 1 + P, D]
  for (int64_t l = 0; l < i; ++l) h = layers[l]->as<ClipEncoderLayer>()->forward(h);
  return h;
}

ClipVisionModelImpl::ClipVisionModelImpl(const ClipVisionConfig& c) {
  vision_model = register_module("vision_model", ClipVisionTransformer(c));
}

}  // namespace swiftcpp
