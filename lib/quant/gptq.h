// GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers",
// ICLR 2023): each linear layer's weight is quantised column by column, the rounding error of every column spread
// over the columns not yet quantised through the inverse Hessian of the layer's inputs, H = 2 X X^T / N, taken
// from calibration text. Layers are done in model order, each calibrated on the outputs of the already-quantised
// layers before it, so only one decoder layer's activations are ever held.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "models/decoder/decoder.h"
#include "quant/packed.h"

namespace swiftcpp {

struct GptqOptions {
  QuantSpec spec;
  double damp_percent = 0.01;  // lambda = damp_percent * mean(diag(H)) added to the diagonal
  bool act_order = false;      // quantise columns by decreasing diag(H) ("desc_act"); g_idx then records groups
  int64_t block_size = 128;    // columns per lazy-update block (rounded to whole groups)
};

/// One layer. weight W [out, in] (any float dtype), hessian H [in, in] (float32 or float64, sum of x x^T over
/// the calibration tokens, any positive scale). Columns whose diagonal is 0 (inputs that were always 0) are
/// quantised to 0. Throws ConfigError as quantize_rtn does, and ModelError naming `name` when H cannot be
/// factored even with a thousandfold damping.
PackedWeight gptq_quantize(const at::Tensor& weight, const at::Tensor& hessian, const GptqOptions& options,
                           const std::string& name);

/// Round to nearest for every linear layer of the decoder blocks: packed weights by module path. Every layer's
/// shape is checked (checked_group_size) before any work.
std::map<std::string, PackedWeight> quantize_model_rtn(CausalLM& model, const QuantSpec& spec);

/// Replaces each named linear layer's float weight by its packed one; the float weight is freed (an empty
/// tensor). Throws ModelError for a name that is not a linear layer of `model`.
void attach_packed_weights(CausalLM& model, std::map<std::string, PackedWeight> packed);

/// Per-layer outcome of quantize_model_gptq, for the report.
struct GptqLayerReport {
  std::string name;
  double output_error = 0;  // || W X - Q X ||_F^2 / || W X ||_F^2 over the calibration inputs (from H)
};

/// Quantises every linear layer of the decoder blocks of `model` (float) with GPTQ on `calibration` (token id
/// sequences), block by block and within a block group by group as DecoderLayerImpl::linear_groups() orders them
/// (q/k/v, o, gate/up, down: "true sequential"; a sparse block's experts join the gate/up and down groups); each
/// layer's float weight is replaced by its dequantised value as it goes, so later layers calibrate on the quantised
/// model's activations. An expert no calibration token reached is rounded to nearest (quantize_rtn). Routers stay
/// float. Returns the packed weights by module path ("model.layers.0.self_attn.q_proj"). `progress` is
/// called after each decoder layer with (done, total). Throws ConfigError for an empty calibration set.
std::map<std::string, PackedWeight> quantize_model_gptq(CausalLM& model,
                                                        const std::vector<std::vector<int64_t>>& calibration,
                                                        const GptqOptions& options,
                                                        std::vector<GptqLayerReport>* report = nullptr,
                                                        const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace swiftcpp
