#include "models/decoder/decoder.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "core/runtime.h"
#include "core/text.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "quant/packed.h"

namespace swiftcpp {

AttentionImpl::AttentionImpl(const DecoderConfig& c)
    : heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      score_{c.attention_scale, c.attn_logit_softcapping} {
  if (c.fused_qkv) {
    qkv_proj = register_module(c.names.qkv_proj,
                               nn::Linear(c.hidden_size, (heads_ + 2 * kv_heads_) * head_dim_, c.qkv_bias));
  } else {
    q_proj = register_module("q_proj", nn::Linear(c.hidden_size, heads_ * head_dim_, c.qkv_bias));
    k_proj = register_module("k_proj", nn::Linear(c.hidden_size, kv_heads_ * head_dim_, c.qkv_bias));
    v_proj = register_module("v_proj", nn::Linear(c.hidden_size, kv_heads_ * head_dim_, c.qkv_bias));
  }
  o_proj = register_module(c.names.o_proj, nn::Linear(heads_ * head_dim_, c.hidden_size, c.o_bias));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", nn::RMSNorm(head_dim_, c.rms_norm_eps));
    k_norm = register_module("k_norm", nn::RMSNorm(head_dim_, c.rms_norm_eps));
  }
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const at::Tensor& mask, nn::KVCache* cache, nn::ChunkKV* chunk, int64_t layer) {
  const int64_t B = x.size(0), T = x.size(1);
  // x: [B, T, D] -> q: [B, T, H, Dh], k/v: [B, T, Hkv, Dh]
  at::Tensor q, k, v;
  if (qkv_proj) {
    const at::Tensor qkv = qkv_proj(x);  // [B, T, (H + 2 Hkv) Dh]: q rows, then k, then v
    q = qkv.narrow(-1, 0, heads_ * head_dim_).view({B, T, heads_, head_dim_});
    k = qkv.narrow(-1, heads_ * head_dim_, kv_heads_ * head_dim_).view({B, T, kv_heads_, head_dim_});
    v = qkv.narrow(-1, (heads_ + kv_heads_) * head_dim_, kv_heads_ * head_dim_).view({B, T, kv_heads_, head_dim_});
  } else {
    const std::vector<at::Tensor> qkv = nn::linear_group({q_proj.get(), k_proj.get(), v_proj.get()}, x);
    q = qkv[0].view({B, T, heads_, head_dim_});
    k = qkv[1].view({B, T, kv_heads_, head_dim_});
    v = qkv[2].view({B, T, kv_heads_, head_dim_});
  }
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  // -> [B, H, T, Dh]
  q = nn::apply_rotary(q.transpose(1, 2), cos, sin);
  k = nn::apply_rotary(k.transpose(1, 2), cos, sin);
  v = v.transpose(1, 2);
  if (cache != nullptr) {
    const int64_t past = cache->length;
    TORCH_CHECK(cache->per_row() || past + T <= cache->capacity(), "KV cache overflow: ", past + T, " > ", cache->capacity());
    if (cache->per_row()) {
      std::tie(k, v) = cache->write_rows(layer, k, v);  // [B, Hkv, S, Dh]
      return o_proj(nn::attention(q, k, v, mask, score_).transpose(1, 2).reshape({B, T, heads_ * head_dim_}));
    }
    at::Tensor& ck = cache->keys[layer];
    at::Tensor& cv = cache->values[layer];
    ck.narrow(2, past, T).copy_(k);
    cv.narrow(2, past, T).copy_(v);
    k = ck.narrow(2, 0, past + T);  // [B, Hkv, S, Dh]
    v = cv.narrow(2, 0, past + T);
  }
  at::Tensor out;  // [B, H, T, Dh]
  if (chunk != nullptr && chunk->exchange != nullptr) {
    // Context parallelism: the K/V of positions [0, offset + T) gathered from the group's shards.
    chunk->keys[layer] = k;
    chunk->values[layer] = v;
    const auto [keys, values] = chunk->exchange->exchange(k, v, layer);  // [B, Hkv, offset + T, Dh]
    out = nn::attention(q, keys, values, mask, score_);
  } else if (chunk != nullptr) {
    // ChunkFlow: the stored K/V of earlier chunks come first, this chunk's own last; they are never concatenated.
    chunk->keys[layer] = k;
    chunk->values[layer] = v;
    std::vector<at::Tensor> keys = chunk->past_keys.empty() ? std::vector<at::Tensor>{} : chunk->past_keys[layer];
    std::vector<at::Tensor> values = chunk->past_values.empty() ? std::vector<at::Tensor>{} : chunk->past_values[layer];
    keys.push_back(k);
    values.push_back(v);
    out = nn::attention_blocks(q, keys, values, mask, int64_t{1} << 23, score_);
  } else {
    out = nn::attention(q, k, v, mask, score_);
  }
  return o_proj(out.transpose(1, 2).reshape({B, T, heads_ * head_dim_}));
}

MLPImpl::MLPImpl(const DecoderConfig& c) : act_(c.activation), intermediate_(c.intermediate_size) {
  const ModuleNames& n = c.names;
  if (c.mlp == MlpKind::kGated && c.fused_gate_up) {
    gate_up_proj = register_module(n.gate_up_proj, nn::Linear(c.hidden_size, 2 * c.intermediate_size, c.mlp_bias));
  } else if (c.mlp == MlpKind::kGated) {
    gate_proj = register_module(n.gate_proj, nn::Linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  }
  if (!gate_up_proj) up_proj = register_module(n.up_proj, nn::Linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module(n.down_proj, nn::Linear(c.intermediate_size, c.hidden_size, c.mlp_bias));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  if (!gate_proj && !gate_up_proj) return down_proj(nn::activate(act_, up_proj(x)));  // plain: down(act(up(x)))
  at::Tensor gate, up;  // [B, T, I] each
  if (gate_up_proj) {
    const at::Tensor both = gate_up_proj(x);  // [B, T, 2 I]: gate rows, then up rows
    gate = both.narrow(-1, 0, intermediate_);
    up = both.narrow(-1, intermediate_, intermediate_);
    if (!at::GradMode::is_enabled()) gate = gate.contiguous();  // activated in place below
  } else {
    std::vector<at::Tensor> both = nn::linear_group({gate_proj.get(), up_proj.get()}, x);
    gate = std::move(both[0]);
    up = std::move(both[1]);
  }
  if (at::GradMode::is_enabled()) return down_proj(nn::activate(act_, gate) * up);  // autograd keeps inputs
  return down_proj(nn::activate(act_, gate).mul_(up));
}

SparseMoeImpl::SparseMoeImpl(const DecoderConfig& c) : top_k_(c.moe.top_k), norm_topk_(c.moe.norm_topk_prob) {
  const MoeConfig& m = c.moe;
  gate = register_module(m.router, nn::Linear(c.hidden_size, m.num_experts, false));
  // Each expert is a gated MLP of the expert width under the expert names (Mixtral: w1 gate, w3 up, w2 down).
  DecoderConfig expert = c;
  expert.mlp = MlpKind::kGated;
  expert.fused_gate_up = false;
  expert.mlp_bias = false;
  expert.intermediate_size = m.intermediate_size;
  expert.names.gate_proj = m.gate_proj;
  expert.names.up_proj = m.up_proj;
  expert.names.down_proj = m.down_proj;
  experts = register_module(m.experts, torch::nn::ModuleList());
  for (int64_t e = 0; e < m.num_experts; ++e) experts->push_back(MLP(expert));
  if (m.shared_intermediate_size > 0) {
    expert.intermediate_size = m.shared_intermediate_size;
    shared_expert = register_module(m.shared_expert, MLP(expert));
    shared_expert_gate = register_module(m.shared_expert_gate, nn::Linear(c.hidden_size, 1, false));
  }
}

at::Tensor SparseMoeImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2), E = static_cast<int64_t>(experts->size());
  const at::Tensor flat = x.reshape({B * T, D});              // [N, D]
  router_logits = gate(flat).to(at::kFloat);                    // [N, E]
  const at::Tensor probs = at::softmax(router_logits, -1);      // float32, as transformers
  auto [weights, chosen] = probs.topk(top_k_, -1);              // [N, k] each
  if (norm_topk_) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(x.scalar_type());
  // Dispatch by index: the (token, choice) pairs sorted by expert; each expert runs once on its tokens.
  const at::Tensor flat_choice = chosen.reshape({-1});                               // [N k]
  const at::Tensor order = std::get<1>(flat_choice.sort(/*stable=*/true, 0, false));  // pairs grouped by expert
  const at::Tensor counts = at::bincount(flat_choice, {}, E).cpu();                  // one host sync per layer
  const int64_t* count = counts.data_ptr<int64_t>();
  const at::Tensor pair_weight = weights.reshape({-1});  // [N k]
  at::Tensor out = at::zeros_like(flat);                 // [N, D]
  int64_t start = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (count[e] == 0) continue;
    const at::Tensor pairs = order.narrow(0, start, count[e]);  // [n_e] indices into [N k]
    start += count[e];
    const at::Tensor tokens = at::div(pairs, top_k_, "floor");  // [n_e]
    at::Tensor y = experts[e]->as<MLP>()->forward(flat.index_select(0, tokens));  // [n_e, D]
    y = y * pair_weight.index_select(0, pairs).unsqueeze(1);
    out = out.index_add(0, tokens, y);
  }
  if (shared_expert) out = out + at::sigmoid(shared_expert_gate(flat)) * shared_expert(flat);
  return out.view({B, T, D});
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t top_k, const at::Tensor& valid) {
  TORCH_CHECK(!router_logits.empty(), "load_balancing_loss: no router logits");
  const at::Tensor logits = at::cat(router_logits, 0).to(at::kFloat);  // [L N, E]
  const int64_t E = logits.size(1), layers = static_cast<int64_t>(router_logits.size());
  const at::Tensor probs = at::softmax(logits, -1);
  const at::Tensor chosen = std::get<1>(probs.topk(top_k, -1));        // [L N, k]
  const at::Tensor mask = at::one_hot(chosen, E).to(at::kFloat);       // [L N, k, E]
  at::Tensor tokens_per_expert, prob_per_expert;                       // [k, E], [E]
  if (!valid.defined()) {
    tokens_per_expert = mask.mean(0);
    prob_per_expert = probs.mean(0);
  } else {
    const at::Tensor w = valid.reshape({-1}).to(at::kFloat).repeat({layers});  // [L N]
    tokens_per_expert = (mask * w.view({-1, 1, 1})).sum(0) / w.sum();
    prob_per_expert = (probs * w.view({-1, 1})).sum(0) / w.sum();
  }
  return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * static_cast<double>(E);
}

DecoderLayerImpl::DecoderLayerImpl(const DecoderConfig& c, int64_t index) : block_(c.block), mlp_name_(c.names.mlp) {
  self_attn = register_module("self_attn", Attention(c));
  if (c.moe.sparse(index)) {
    moe = register_module(c.moe.block, SparseMoe(c));
    mlp_name_ = c.moe.block;
  } else {
    mlp = register_module(c.names.mlp, MLP(c));
  }
  const auto norm = [&] { return nn::Norm(c.norm, c.hidden_size, c.rms_norm_eps); };
  input_layernorm = register_module("input_layernorm", norm());
  if (block_ != BlockLayout::kParallel) post_attention_layernorm = register_module("post_attention_layernorm", norm());
  if (block_ == BlockLayout::kSandwich) {
    pre_feedforward_layernorm = register_module("pre_feedforward_layernorm", norm());
    post_feedforward_layernorm = register_module("post_feedforward_layernorm", norm());
  }
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     const at::Tensor& mask, nn::KVCache* cache, nn::ChunkKV* chunk, int64_t layer) {
  switch (block_) {
    case BlockLayout::kParallel: {  // Phi: both branches read the same normed input
      const at::Tensor n = input_layernorm(x);
      return (self_attn(n, cos, sin, mask, cache, chunk, layer) + feed_forward(n)) + x;
    }
    case BlockLayout::kSandwich: {  // Gemma 2: each branch's output is normed before the residual add
      const at::Tensor h = x + post_attention_layernorm(self_attn(input_layernorm(x), cos, sin, mask, cache, chunk, layer));
      return h + post_feedforward_layernorm(feed_forward(pre_feedforward_layernorm(h)));
    }
    case BlockLayout::kSequential:
      break;
  }
  const at::Tensor h = x + self_attn(input_layernorm(x), cos, sin, mask, cache, chunk, layer);
  return h + feed_forward(post_attention_layernorm(h));
}

std::vector<LinearGroup> DecoderLayerImpl::linear_groups() {
  Attention& a = self_attn;
  std::vector<LinearGroup> groups;
  // The o_proj's registered name (o_proj, dense) is the attention module's last linear child.
  const auto name_of = [](const torch::nn::Module& parent, const torch::nn::Module* child) {
    for (const auto& item : parent.named_children()) {
      if (item.value().get() == child) return item.key();
    }
    return std::string();
  };
  if (a->qkv_proj) {
    groups.push_back({{"self_attn." + name_of(*a, a->qkv_proj.get()), a->qkv_proj.get()}});
  } else {
    groups.push_back({{"self_attn.q_proj", a->q_proj.get()},
                      {"self_attn.k_proj", a->k_proj.get()},
                      {"self_attn.v_proj", a->v_proj.get()}});
  }
  groups.push_back({{"self_attn." + name_of(*a, a->o_proj.get()), a->o_proj.get()}});
  // An MLP's input projections, then its output projection; a sparse block's experts (and shared expert) each
  // contribute theirs to the same two groups.
  LinearGroup inputs, outputs;
  const auto add_mlp = [&](MLPImpl& m, const std::string& prefix) {
    if (m.gate_up_proj) inputs.push_back({prefix + name_of(m, m.gate_up_proj.get()), m.gate_up_proj.get()});
    if (m.gate_proj) inputs.push_back({prefix + name_of(m, m.gate_proj.get()), m.gate_proj.get()});
    if (m.up_proj) inputs.push_back({prefix + name_of(m, m.up_proj.get()), m.up_proj.get()});
    outputs.push_back({prefix + name_of(m, m.down_proj.get()), m.down_proj.get()});
  };
  const std::string prefix = mlp_name_ + ".";
  if (moe) {
    SparseMoe& sm = moe;
    const std::string experts = name_of(*sm, sm->experts.get());
    for (size_t e = 0; e < sm->experts->size(); ++e) {
      add_mlp(*sm->experts->ptr(e)->as<MLP>(), prefix + experts + "." + std::to_string(e) + ".");
    }
    if (sm->shared_expert) add_mlp(*sm->shared_expert, prefix + name_of(*sm, sm->shared_expert.get()) + ".");
  } else {
    add_mlp(*mlp, prefix);
  }
  groups.push_back(inputs);
  groups.push_back(outputs);
  return groups;
}

DecoderBodyImpl::DecoderBodyImpl(const DecoderConfig& c) {
  embed_tokens = register_module("embed_tokens", nn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(c, i));
  norm = register_module(c.names.final_norm, nn::Norm(c.norm, c.hidden_size, c.rms_norm_eps));
}

namespace {

// One decoder layer call whose activations are not kept: forward runs without autograd, backward runs the layer
// again with autograd (same autocast and CPU random state as the first time) and back-propagates through that.
struct LayerCall {
  DecoderLayerImpl* layer;
  at::Tensor cos, sin, mask;
  int64_t index;
  at::Tensor cpu_rng_state;
  bool autocast_cpu, autocast_gpu;
  at::ScalarType autocast_cpu_dtype, autocast_gpu_dtype;
};

class CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                int64_t call_address) {
    auto* call = reinterpret_cast<LayerCall*>(call_address);
    ctx->saved_data["call"] = call_address;
    ctx->save_for_backward({x});
    at::Tensor out = call->layer->forward(x, call->cos, call->sin, call->mask, nullptr, nullptr, call->index);
    // A sparse layer's router logits are a second output, so the load-balancing loss reaches the router.
    if (call->layer->moe) return {out, call->layer->moe->router_logits};
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* call = reinterpret_cast<LayerCall*>(ctx->saved_data["call"].toInt());
    const at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    auto generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor rng_now = generator.get_state();
    const bool cpu_now = at::autocast::is_cpu_enabled(), gpu_now = at::autocast::is_enabled();
    const auto cpu_dtype_now = at::autocast::get_autocast_cpu_dtype();
    const auto gpu_dtype_now = at::autocast::get_autocast_gpu_dtype();
    generator.set_state(call->cpu_rng_state);
    at::autocast::set_cpu_enabled(call->autocast_cpu);
    at::autocast::set_enabled(call->autocast_gpu);
    at::autocast::set_autocast_cpu_dtype(call->autocast_cpu_dtype);
    at::autocast::set_autocast_gpu_dtype(call->autocast_gpu_dtype);
    at::Tensor out;
    {
      at::AutoGradMode grad(true);
      out = call->layer->forward(x, call->cos, call->sin, call->mask, nullptr, nullptr, call->index);
    }
    at::autocast::set_cpu_enabled(cpu_now);
    at::autocast::set_enabled(gpu_now);
    at::autocast::set_autocast_cpu_dtype(cpu_dtype_now);
    at::autocast::set_autocast_gpu_dtype(gpu_dtype_now);
    generator.set_state(rng_now);
    if (call->layer->moe && grads.size() > 1 && grads[1].defined()) {
      torch::autograd::backward({out, call->layer->moe->router_logits}, {grads[0], grads[1]});
    } else {
      torch::autograd::backward({out}, {grads[0]});
    }
    return {x.grad(), at::Tensor()};
  }
};

}  // namespace

CausalLMImpl::CausalLMImpl(DecoderConfig config)
    : config_(std::move(config)),
      // The rotary tables start at most kInitialRotaryPositions long and grow with the positions used, so a long
      // max_position_embeddings costs nothing until a sequence that long runs.
      rotary_(config_.head_dim, config_.rope_theta, config_.rope_scaling,
              std::min<int64_t>(config_.max_position_embeddings, kInitialRotaryPositions), config_.rotary_dim) {
  // A vision-language model keeps Hugging Face's tree: language_model.{model, lm_head} beside the vision
  // encoder's modules; a text model registers model and lm_head at the top.
  torch::nn::Module* lm_parent = this;
  if (config_.multimodal) {
    TORCH_CHECK(config_.multimodal->make_encoder, "multimodal config without a vision encoder factory");
    if (!config_.multimodal->language_model.empty()) {
      auto part = register_module(config_.multimodal->language_model, LanguageModelPart());
      lm_parent = part.get();
    }
    vision_ = config_.multimodal->make_encoder();
    for (const auto& child : vision_->named_children()) register_module(child.key(), child.value());
    // Tensors the family keeps at the top level (LLaVA-NeXT's image_newline).
    for (const auto& p : vision_->named_parameters(/*recurse=*/false)) register_parameter(p.key(), p.value(), true);
  }
  model = lm_parent->register_module("model", DecoderBody(config_));
  if (!config_.tie_word_embeddings) {
    lm_head = lm_parent->register_module("lm_head",
                                         nn::Linear(config_.hidden_size, config_.vocab_size, config_.lm_head_bias));
  }
}

bool CausalLMImpl::is_router(const std::string& module_path) const {
  const MoeConfig& m = config_.moe;
  if (m.num_experts == 0) return false;
  const auto ends_with = [&](const std::string& suffix) {
    return module_path.size() >= suffix.size() &&
           module_path.compare(module_path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("." + m.block + "." + m.router) || ends_with("." + m.block + "." + m.shared_expert_gate);
}

at::Tensor CausalLMImpl::scale_inputs(const at::Tensor& embeddings) const {
  if (config_.embedding_multiplier == 0) return embeddings;
  // Hugging Face's normalizer is a tensor of the activations' dtype (sqrt(3072) is 55.5 in bfloat16).
  return embeddings * at::scalar_tensor(config_.embedding_multiplier, embeddings.options().requires_grad(false));
}

std::string CausalLMImpl::language_model_prefix() const {
  return config_.multimodal && !config_.multimodal->language_model.empty() ? config_.multimodal->language_model + "."
                                                                           : std::string();
}

bool CausalLMImpl::in_language_model(const std::string& path) const {
  if (!vision_) return true;
  const std::string prefix = language_model_prefix();
  if (!prefix.empty()) return path.compare(0, prefix.size(), prefix) == 0;
  for (const auto& child : vision_->named_children()) {
    const std::string& name = child.key();
    if (path == name || path.compare(0, name.size() + 1, name + ".") == 0) return false;
  }
  return true;
}

at::Tensor CausalLMImpl::embed(const at::Tensor& input_ids, const at::Tensor& pixel_values,
                               const at::Tensor& image_features, const at::Tensor& image_grid_thw) {
  if (!config_.multimodal) {
    if (pixel_values.defined() || image_features.defined()) {
      fail<ModelError>("images were given, but the {} model is a text model (no vision encoder)", config_.model_type);
    }
    return model->embed_tokens(input_ids);  // [B, T, D]
  }
  const int64_t image_id = config_.multimodal->image_token_index;
  const at::Tensor is_image = input_ids == image_id;  // [B, T]
  // The image id may lie outside the text vocabulary: its positions look up row 0 and are overwritten below.
  at::Tensor h = model->embed_tokens(input_ids.masked_fill(is_image, 0));  // [B, T, D]
  const int64_t images = image_features.defined() ? image_features.size(0)
                         : pixel_values.defined() ? pixel_values.size(0)
                                                  : 0;
  // No images (every decode step): nothing to place, and no host sync to count positions.
  if (images == 0) return h;
  const int64_t slots = is_image.sum().item<int64_t>();
  const int64_t expected = image_features.defined()
                               ? (image_features.dim() == 3 ? image_features.size(0) * image_features.size(1)
                                                            : image_features.size(0))
                               : vision_->feature_rows(pixel_values, image_grid_thw);
  if (slots != expected) {
    const int64_t count = image_grid_thw.defined() ? image_grid_thw.size(0) : images;
    fail<ModelError>("the input holds {} image-token positions (id {}), but the {} image{} given take {} positions: "
                     "each image is one run of as many ids as it has features", slots, image_id, count,
                     count == 1 ? "" : "s", expected);
  }
  const at::Tensor features = image_features.defined()
                                  ? image_features
                                  : vision_->encode(pixel_values.to(h.device()), image_grid_thw);  // [N, F, D] | [M, D]
  TORCH_CHECK((features.dim() == 3 || features.dim() == 2) && features.size(-1) == h.size(2) &&
                  features.numel() == expected * h.size(2),
              "vision encoder returned ", features.sizes(), " for ", expected, " positions");
  // Row-major order of the image positions is the order of the images.
  return h.masked_scatter(is_image.unsqueeze(-1).expand_as(h), features.to(h.scalar_type()).reshape({-1, h.size(2)}));
}

std::pair<at::Tensor, std::vector<int64_t>> mrope_positions(const at::Tensor& input_ids, const at::Tensor& image_grid_thw,
                                                            const at::Tensor& key_valid, const at::Tensor& segment_ids,
                                                            int64_t image_token, int64_t merge) {
  TORCH_CHECK(input_ids.dim() == 2 && merge >= 1, "mrope_positions: input_ids must be [B, T]");
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  const at::Tensor ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor valid = key_valid.defined() ? key_valid.to(at::kCPU, at::kBool).contiguous() : at::Tensor();
  const at::Tensor segments = segment_ids.defined() ? segment_ids.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
  const at::Tensor grids = image_grid_thw.defined() ? image_grid_thw.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
  const int64_t n_images = grids.defined() ? grids.size(0) : 0;
  TORCH_CHECK(!grids.defined() || (grids.dim() == 2 && grids.size(1) == 3), "image_grid_thw must be [N, 3], got ",
              grids.sizes());
  for (int64_t i = 0; i < n_images; ++i) {
    const int64_t* g = grids.data_ptr<int64_t>() + i * 3;
    if (g[0] < 1 || g[1] < merge || g[2] < merge || g[1] % merge != 0 || g[2] % merge != 0 || g[0] > (1 << 12) ||
        g[1] > (1 << 16) || g[2] > (1 << 16)) {
      fail<ModelError>("image grid {} is {}x{}x{}: t must be in [1, 4096] and h, w multiples of the merge size {} "
                       "up to 65536", i, g[0], g[1], g[2], merge);
    }
  }
  TORCH_CHECK(!valid.defined() || valid.size(-1) >= T, "key_valid is shorter than input_ids");
  TORCH_CHECK(!segments.defined() || segments.size(-1) >= T, "segment_ids is shorter than input_ids");
  at::Tensor out = at::ones({3, B, T}, at::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* grid = grids.defined() ? grids.data_ptr<int64_t>() : nullptr;
  // key_valid and segment_ids may be longer than T (keys of a cache): the last T columns are this forward's.
  const int64_t valid_offset = valid.defined() ? valid.size(-1) - T : 0;
  const int64_t segment_offset = segments.defined() ? segments.size(-1) - T : 0;
  std::vector<int64_t> deltas(static_cast<size_t>(B), 0);
  int64_t image = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = 0, max_pos = -1, segment = std::numeric_limits<int64_t>::min();
    int64_t t = 0;
    while (t < T) {
      if (valid.defined() && !valid.data_ptr<bool>()[b * valid.size(-1) + valid_offset + t]) {
        ++t;
        continue;
      }
      if (segments.defined()) {
        const int64_t s = segments.data_ptr<int64_t>()[b * segments.size(-1) + segment_offset + t];
        if (s != segment) n = 0;
        segment = s;
      }
      if (id[b * T + t] != image_token) {
        for (int64_t a = 0; a < 3; ++a) p[(a * B + b) * T + t] = n;
        max_pos = std::max(max_pos, n);
        ++n;
        ++t;
        continue;
      }
      if (image >= n_images) {
        fail<ModelError>("row {} holds an image-token run at position {}, but only {} image grid{} were given", b, t,
                         n_images, n_images == 1 ? "" : "s");
      }
      const int64_t gt = grid[image * 3], gh = grid[image * 3 + 1] / merge, gw = grid[image * 3 + 2] / merge;
      const int64_t tokens = gt * gh * gw;
      for (int64_t k = 0; k < tokens; ++k) {
        if (t + k >= T || id[b * T + t + k] != image_token) {
          fail<ModelError>("image {} (grid {}x{}x{}) takes {} tokens, but row {} has a run of {} image tokens at "
                           "position {}", image, gt, gh * merge, gw * merge, tokens, b, k, t);
        }
        const int64_t frame = k / (gh * gw), i = (k / gw) % gh, j = k % gw;
        p[(0 * B + b) * T + t + k] = n + frame;
        p[(1 * B + b) * T + t + k] = n + i;
        p[(2 * B + b) * T + t + k] = n + j;
        max_pos = std::max(max_pos, n + std::max({frame, i, j}));
      }
      n += std::max({gt, gh, gw});
      t += tokens;
      ++image;
    }
    deltas[static_cast<size_t>(b)] = max_pos + 1 - T;
  }
  if (image != n_images) {
    fail<ModelError>("{} image grid{} given, but the input holds {} image-token run{}", n_images,
                     n_images == 1 ? "" : "s", image, image == 1 ? "" : "s");
  }
  return {out.to(input_ids.device()), deltas};
}

bool CausalLMImpl::has_packed_weights() const {
  for (const auto& m : modules(/*include_self=*/false)) {
    const auto* linear = m->as<nn::Linear>();
    if (linear != nullptr && (linear->packed || linear->blocks)) return true;
  }
  return false;
}

at::Device CausalLMImpl::device() const { return model->embed_tokens->weight.device(); }
at::ScalarType CausalLMImpl::dtype() const { return model->embed_tokens->weight.scalar_type(); }

nn::KVCache CausalLMImpl::make_cache(int64_t batch, int64_t capacity) const {
  return nn::KVCache(config_.num_hidden_layers, batch, config_.num_key_value_heads, capacity, config_.head_dim,
                     at::TensorOptions().dtype(dtype()).device(device()));
}

at::Tensor CausalLMImpl::mrope_forward_positions(const at::Tensor& input_ids, const at::Tensor& positions,
                                                 const ForwardOptions& options) {
  nn::KVCache* cache = options.cache;
  const int64_t B = input_ids.size(0);
  const auto storage_row = [&](int64_t b) { return cache->per_row() ? cache->rows[static_cast<size_t>(b)] : b; };
  const auto starts = [&](int64_t b) {
    return cache->per_row() ? cache->lengths[static_cast<size_t>(b)] == 0 : cache->length == 0;
  };
  const bool has_images = options.image_grid_thw.defined() && options.image_grid_thw.size(0) > 0;
  const bool from_ids = (cache == nullptr || [&] {
    for (int64_t b = 0; b < B; ++b) if (!starts(b)) return false;
    return true;
  }()) && options.chunk == nullptr && (has_images || options.position_ids.defined() == false);
  if (!from_ids) {
    // Text after a filled cache (decode, chunked prefill): the cache index plus the row's offset on every axis.
    if (cache == nullptr || cache->position_offsets.empty()) return positions;
    std::vector<int64_t> offsets(static_cast<size_t>(B), 0);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t row = storage_row(b);
      if (row < static_cast<int64_t>(cache->position_offsets.size())) {
        offsets[static_cast<size_t>(b)] = cache->position_offsets[static_cast<size_t>(row)];
      }
    }
    return positions + at::tensor(offsets, at::kLong).to(positions.device()).view({B, 1});
  }
  TORCH_CHECK(config_.multimodal || !has_images, "M-RoPE images on a model without a vision encoder");
  const int64_t image_id = config_.multimodal ? config_.multimodal->image_token_index : -1;
  const int64_t merge = config_.multimodal ? config_.multimodal->spatial_merge_size : 1;
  auto [out, deltas] = mrope_positions(input_ids, options.image_grid_thw, options.key_valid, options.segment_ids,
                                       image_id, merge);
  if (cache != nullptr) {
    // The offset later tokens add to a position counted in real tokens (the cache index without padding, as
    // callers that pad pass them): max position + 1 - real tokens. Without padding it is rope_deltas.
    const int64_t T = input_ids.size(1);
    std::vector<int64_t> real(static_cast<size_t>(B), T);
    if (options.key_valid.defined()) {
      const at::Tensor counts = options.key_valid.narrow(-1, options.key_valid.size(-1) - T, T).sum(-1).to(at::kCPU, at::kLong);
      for (int64_t b = 0; b < B; ++b) real[static_cast<size_t>(b)] = counts[b].item<int64_t>();
    }
    for (int64_t b = 0; b < B; ++b) {
      const auto row = static_cast<size_t>(storage_row(b));
      if (cache->position_offsets.size() <= row) cache->position_offsets.resize(row + 1, 0);
      cache->position_offsets[row] = deltas[static_cast<size_t>(b)] + T - real[static_cast<size_t>(b)];
    }
  }
  return out;
}

at::Tensor CausalLMImpl::hidden_states(const at::Tensor& input_ids, const ForwardOptions& options) {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [B, T], got ", input_ids.sizes());
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  TORCH_CHECK(options.cache == nullptr || options.chunk == nullptr, "a forward takes a KV cache or chunk state, not both");
  const bool per_row = options.cache != nullptr && options.cache->per_row();
  const int64_t past = options.cache != nullptr ? options.cache->length
                       : options.chunk != nullptr ? options.chunk->past_length
                                                  : 0;
  const at::Device dev = input_ids.device();
  at::Tensor positions = options.position_ids;
  const bool mrope = !config_.rope_scaling.mrope_section.empty();
  if (per_row) {
    // Row b's new tokens sit at positions [lengths[b], lengths[b] + T) of its own sequence.
    TORCH_CHECK(static_cast<int64_t>(options.cache->rows.size()) == B, "KV cache rows do not match the batch of ", B);
    TORCH_CHECK(!options.key_valid.defined() && !options.segment_ids.defined() && !positions.defined(),
                "a per-row KV cache forward takes no key_valid, segment_ids or position_ids");
    positions = at::tensor(options.cache->lengths, at::kLong).to(dev).view({B, 1}) +
                at::arange(T, at::TensorOptions().dtype(at::kLong).device(dev)).view({1, T});  // [B, T]
  } else if (!positions.defined()) {
    positions = at::arange(past, past + T, at::TensorOptions().dtype(at::kLong).device(dev)).unsqueeze(0).expand({B, T});
  }
  if (mrope && positions.dim() == 2) positions = mrope_forward_positions(input_ids, positions, options);
  at::Tensor h;  // [B, T, D]
  if (options.inputs_embeds.defined()) {
    TORCH_CHECK(options.inputs_embeds.dim() == 3 && options.inputs_embeds.size(0) == B &&
                    options.inputs_embeds.size(1) == T, "inputs_embeds must be [B, T, D] as input_ids, got ",
                options.inputs_embeds.sizes());
    h = options.inputs_embeds;
  } else {
    h = embed(input_ids, options.pixel_values, options.image_features, options.image_grid_thw);
  }
  h = scale_inputs(h);
  const int64_t span = per_row ? options.cache->span(T) : past + T;
  auto [cos, sin] = rotary_.cos_sin(positions, span, h.scalar_type());
  // One mask per distinct sliding window among the layers (Gemma 2 alternates windowed and global layers).
  std::map<int64_t, at::Tensor> masks;
  const auto mask_for = [&](int64_t layer) -> const at::Tensor& {
    const int64_t window = config_.window(layer);
    auto it = masks.find(window);
    if (it == masks.end()) {
      it = masks.emplace(window, per_row ? nn::build_row_mask(options.cache->lengths, T, span, window, dev)
                                         : nn::build_attention_mask(B, past, T, options.key_valid, window, dev,
                                                                    options.segment_ids)).first;
    }
    return it->second;
  };
  const bool checkpointing = gradient_checkpointing_ && is_training() && at::GradMode::is_enabled() &&
                             options.cache == nullptr && options.chunk == nullptr;
  if (options.chunk != nullptr) {
    options.chunk->keys.assign(config_.num_hidden_layers, at::Tensor());
    options.chunk->values.assign(config_.num_hidden_layers, at::Tensor());
  }
  if (checkpointing) {
    checkpoint_calls_.clear();  // the previous step's backward has run
    // The recomputed layers need an input that requires grad, or nothing upstream of them would get gradients.
    if (!h.requires_grad()) h = h.detach().requires_grad_(true);
  }
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    auto* layer = model->layers[i]->as<DecoderLayer>();
    const at::Tensor& mask = mask_for(i);
    if (!checkpointing) {
      h = layer->forward(h, cos, sin, mask, options.cache, options.chunk, i);
      if (options.router_logits != nullptr && layer->moe) options.router_logits->push_back(layer->moe->router_logits);
      continue;
    }
    auto call = std::make_shared<LayerCall>(LayerCall{layer, cos, sin, mask, i,
                                                      at::detail::getDefaultCPUGenerator().get_state(),
                                                      at::autocast::is_cpu_enabled(), at::autocast::is_enabled(),
                                                      at::autocast::get_autocast_cpu_dtype(),
                                                      at::autocast::get_autocast_gpu_dtype()});
    const auto outputs = CheckpointedLayer::apply(h, reinterpret_cast<int64_t>(call.get()));
    h = outputs[0];
    if (options.router_logits != nullptr && layer->moe) options.router_logits->push_back(outputs[1]);
    checkpoint_calls_.push_back(call);
  }
  if (per_row) {
    for (auto& n : options.cache->lengths) n += T;
  } else if (options.cache != nullptr) {
    options.cache->length = past + T;
  }
  if (options.last_token_only) h = h.narrow(1, T - 1, 1);
  return model->norm(h);
}

at::Tensor CausalLMImpl::forward_layer(int64_t layer, const at::Tensor& h) {
  TORCH_CHECK(h.dim() == 3 && layer >= 0 && layer < config_.num_hidden_layers, "forward_layer: bad layer or shape");
  const int64_t B = h.size(0), T = h.size(1);
  const at::Tensor positions =
      at::arange(T, at::TensorOptions().dtype(at::kLong).device(h.device())).unsqueeze(0).expand({B, T});
  auto [cos, sin] = rotary_.cos_sin(positions, T, h.scalar_type());
  const at::Tensor mask = nn::build_attention_mask(B, 0, T, at::Tensor(), config_.window(layer), h.device(), at::Tensor());
  return model->layers[layer]->as<DecoderLayer>()->forward(h, cos, sin, mask, nullptr, nullptr, layer);
}

at::Tensor CausalLMImpl::logits(const at::Tensor& hidden) {
  at::Tensor out;  // [..., V]
  const at::Tensor& w = model->embed_tokens->weight;  // tied: [V, D]
  if (lm_head) {
    out = lm_head(hidden);
  } else {
    out = nn::dense_linear(hidden, w, at::Tensor());  // decode rows take nn::Linear's kernels too
  }
  const double cap = config_.final_logit_softcapping;
  if (cap == 0) return out;
  // Gemma 2: cap * tanh(logits / cap), as Hugging Face computes it; the loss sees the capped logits.
  return at::GradMode::is_enabled() ? at::tanh(out / cap) * cap : out.div_(cap).tanh_().mul_(cap);
}

at::Tensor CausalLMImpl::forward(const at::Tensor& input_ids, const ForwardOptions& options) {
  return logits(hidden_states(input_ids, options));
}

bool all_finite(const at::Tensor& tensor) {
  if (!tensor.defined() || !at::isFloatingType(tensor.scalar_type()) || tensor.numel() == 0) return true;
  // Chunks of a flat view, min and max in one pass each (both become NaN when a NaN is among the values): no
  // temporary as large as the tensor.
  constexpr int64_t kChunk = int64_t{1} << 22;
  const at::Tensor flat = tensor.contiguous().view({-1});
  at::NoGradGuard no_grad;
  for (int64_t start = 0; start < flat.numel(); start += kChunk) {
    at::Tensor part = flat.narrow(0, start, std::min(kChunk, flat.numel() - start));
    if (part.scalar_type() == at::kHalf) part = part.to(at::kFloat);  // LibTorch 1.13 has no CPU aminmax for it
    const auto [lo, hi] = at::aminmax(part);
    const at::Tensor both = at::stack({lo, hi}).to(at::kCPU, at::kDouble);
    const double* v = both.data_ptr<double>();
    if (!std::isfinite(v[0]) || !std::isfinite(v[1])) return false;
  }
  return true;
}

std::vector<std::string> nonfinite_weights(CausalLM& model) {
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    if (!all_finite(item.value())) names.push_back(item.key());
  }
  for (const auto& item : model->named_modules("", /*include_self=*/false)) {
    const auto* linear = item.value()->as<nn::Linear>();
    if (linear != nullptr && linear->packed && !all_finite(linear->packed->scales)) {
      names.push_back(item.key() + ".scales");
    }
  }
  return names;
}

void warn_nonfinite_weights(CausalLM& model, const std::string& origin) {
  const std::vector<std::string> names = nonfinite_weights(model);
  if (names.empty()) return;
  warn(fmt::format("{}: {} weight tensor{} hold NaN or Inf values, so outputs computed from them will be NaN or "
                   "garbage: {}", origin, names.size(), names.size() == 1 ? "" : "s", list_names(names)));
}

namespace {
// Buffers Hugging Face sometimes saves that the decoder recomputes.
bool ignorable(const std::string& name) {
  static const std::string suffix = "rotary_emb.inv_freq";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void load_weights(CausalLM& model, const Checkpoint& checkpoint, const std::string& origin,
                  const LoadOptions& options) {
  const auto params = model->named_parameters(/*recurse=*/true);
  std::vector<std::string> missing, misshaped, unexpected;
  std::set<std::string> wanted;
  // Linear layers stored in the GPTQ layout (qweight, qzeros, scales, g_idx) instead of a float weight.
  std::map<std::string, nn::LinearImpl*> packed_layers;
  for (const auto& item : model->named_modules("", /*include_self=*/false)) {
    auto* linear = item.value()->as<nn::Linear>();
    if (linear == nullptr || !checkpoint.contains(item.key() + ".qweight")) continue;
    packed_layers[item.key()] = linear;
    const int64_t out = linear->weight.size(0), in = linear->weight.size(1);
    const auto shape = [&](const char* part) { return checkpoint.info(item.key() + "." + part).shape; };
    for (const char* part : {"qweight", "qzeros", "scales", "g_idx"}) {
      wanted.insert(item.key() + "." + part);
      if (!checkpoint.contains(item.key() + "." + part)) missing.push_back(item.key() + "." + part);
    }
    if (!checkpoint.contains(item.key() + ".qzeros") || !checkpoint.contains(item.key() + ".scales") ||
        !checkpoint.contains(item.key() + ".g_idx")) {
      continue;
    }
    const auto qw = shape("qweight"), qz = shape("qzeros"), sc = shape("scales"), gi = shape("g_idx");
    const int64_t bits = qw.size() == 2 && in > 0 ? qw[0] * 32 / in : 0;
    const int64_t groups = sc.size() == 2 ? sc[0] : 0;
    const bool ok = (bits == 4 || bits == 8) && qw[1] == out && qz.size() == 2 && qz[0] == groups &&
                    qz[1] * 32 / bits == out && sc[1] == out && gi.size() == 1 && gi[0] == in && groups > 0;
    if (!ok) {
      misshaped.push_back(fmt::format("{} (packed {}: qweight {}, qzeros {}, scales {}, g_idx {}; expected 4 or 8 bits "
                                      "for a {}x{} layer)", item.key(), bits, fmt::join(qw, "x"), fmt::join(qz, "x"),
                                      fmt::join(sc, "x"), fmt::join(gi, "x"), out, in));
    }
  }
  for (const auto& item : params) {
    const auto dot = item.key().rfind('.');
    if (packed_layers.count(item.key().substr(0, dot)) > 0 && item.key().substr(dot + 1) == "weight") continue;
    wanted.insert(item.key());
    if (!checkpoint.contains(item.key())) {
      missing.push_back(item.key());
      continue;
    }
    const TensorInfo& info = checkpoint.info(item.key());
    if (info.shape != item.value().sizes().vec()) {
      misshaped.push_back(fmt::format("{} (file {}, expected {})", item.key(), fmt::join(info.shape, "x"),
                                      fmt::join(item.value().sizes(), "x")));
    }
  }
  const bool tied = model->config().tie_word_embeddings;
  const std::string tied_head = model->language_model_prefix() + "lm_head.weight";
  for (const auto& name : checkpoint.names()) {
    if (wanted.count(name) == 0 && !ignorable(name) && !(tied && name == tied_head)) unexpected.push_back(name);
  }
  if (!missing.empty() || !misshaped.empty() || !unexpected.empty()) {
    std::string msg = fmt::format("{}: checkpoint does not fit the {} decoder ({} layers, hidden {})", origin,
                                  model->config().model_type, model->config().num_hidden_layers,
                                  model->config().hidden_size);
    if (!missing.empty()) msg += "\n  missing: " + list_names(missing);
    if (!misshaped.empty()) msg += "\n  wrong shape: " + list_names(misshaped);
    if (!unexpected.empty()) msg += "\n  unexpected: " + list_names(unexpected);
    throw ModelError(msg);
  }
  // A tensor already in the wanted dtype on the CPU becomes the parameter as it is: a copy-on-write view of the
  // mapped file, so loading costs no copy and no second resident copy. Others are converted once.
  at::NoGradGuard no_grad;
  for (auto& [name, linear] : packed_layers) {
    auto packed = std::make_shared<PackedWeight>();
    packed->qweight = checkpoint.tensor(name + ".qweight").to(options.device);
    packed->qzeros = checkpoint.tensor(name + ".qzeros").to(options.device);
    packed->scales = checkpoint.tensor(name + ".scales").to(options.device);
    packed->g_idx = checkpoint.tensor(name + ".g_idx").to(options.device);
    packed->out_features = linear->weight.size(0);
    packed->in_features = linear->weight.size(1);
    packed->bits = packed->qweight.size(0) * 32 / packed->in_features;
    linear->weight.set_data(at::empty({0}, at::TensorOptions().dtype(options.dtype).device(options.device)));
    linear->packed = packed;
  }
  for (auto& item : params) {
    if (!wanted.count(item.key())) continue;  // the float weight of a packed layer
    const at::Tensor source = checkpoint.tensor(item.key());
    const bool as_is = options.device.is_cpu() && source.scalar_type() == options.dtype && source.is_contiguous();
    item.value().set_data(as_is ? source : source.to(options.device, options.dtype).contiguous());
  }
  warn_nonfinite_weights(model, origin);
}

CausalLM load_causal_lm(const fs::path& model_dir, const LoadOptions& options) {
  DecoderConfig config = load_decoder_config(model_dir);
  const Checkpoint checkpoint = Checkpoint::open(model_dir);
  CausalLM model(config);
  load_weights(model, checkpoint, model_dir.string(), options);
  model->eval();
  if (options.quantized_kernels) prepare_for_inference(model);
  return model;
}

int64_t prepare_for_inference(CausalLM& model) {
  if (!model->device().is_cpu()) return 0;
  int64_t moved = 0;
  for (const auto& m : model->modules(/*include_self=*/false)) {
    auto* linear = m->as<nn::Linear>();
    if (linear == nullptr || !linear->packed) continue;
    std::shared_ptr<const nn::QuantBlocks> blocks = to_quant_blocks(*linear->packed);
    if (!blocks) continue;
    linear->blocks = std::move(blocks);
    linear->packed.reset();
    ++moved;
  }
  return moved;
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32" || name == "float") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float16" || name == "fp16" || name == "half") return at::kHalf;
  fail<ConfigError>("unknown dtype '{}' (expected float32, bfloat16 or float16)", name);
}

at::Device parse_device(const std::string& name) {
  if (name == "cpu") return at::Device(at::kCPU);
  if (name.rfind("cuda", 0) == 0) {
    if (!torch::cuda::is_available()) {
      fail<ConfigError>("device '{}' asked for, but this LibTorch build has no usable CUDA device", name);
    }
    try {
      return at::Device(name);
    } catch (const c10::Error&) {
      fail<ConfigError>("invalid device '{}' (expected cpu, cuda or cuda:N)", name);
    }
  }
  fail<ConfigError>("unknown device '{}' (expected cpu, cuda or cuda:N)", name);
}

}  // namespace swiftcpp
