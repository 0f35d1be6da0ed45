// A tiny random Llama for exactness tests (float64 makes 1e-10 comparisons meaningful).
#pragma once

#include <ATen/ATen.h>

#include "models/decoder/decoder.h"

namespace swiftcpp::test {

/// vocab_size `vocab`, hidden 16, 4 query heads over 2 K/V heads of 4, intermediate 24, `layers` layers; weights
/// N(0, 0.3^2) from seed 3, in `dtype`; training mode.
inline CausalLM tiny_llama(int64_t vocab, int64_t layers, at::ScalarType dtype = at::kDouble) {
  DecoderConfig c;
  c.model_type = "llama";
  c.vocab_size = vocab;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  CausalLM model(c);
  at::manual_seed(3);
  at::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.set_data(at::randn(p.sizes(), at::kDouble).mul(0.3).to(dtype));
  model->train();
  return model;
}

}  // namespace swiftcpp::test
