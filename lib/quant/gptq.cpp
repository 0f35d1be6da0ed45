#include "quant/gptq.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace swiftcpp {

namespace {

// Upper Cholesky factor U of H^-1 (H^-1 = U^T U), H damped by damp_percent * mean(diag H); the damping grows
// tenfold (up to three times) when H is still too ill-conditioned to factor.
at::Tensor inverse_hessian_factor(at::Tensor H, double damp_percent, const std::string& name) {
  const double mean_diag = H.diagonal().mean().item<double>();
  double damp = damp_percent * mean_diag;
  for (int attempt = 0; attempt < 4; ++attempt, damp *= 10) {
    const at::Tensor damped = H + damp * at::eye(H.size(0), H.options());
    auto [L, info] = at::linalg_cholesky_ex(damped);
    if (info.item<int64_t>() != 0) continue;
    const at::Tensor inverse = at::cholesky_inverse(L);
    auto [U, info2] = at::linalg_cholesky_ex(inverse, /*upper=*/true);
    if (info2.item<int64_t>() == 0) return U;
  }
  fail<ModelError>("{}: the calibration Hessian is not positive definite even with damping {:.3g}; use more or "
                   "longer calibration samples",
                   name, damp / 10);
}

}  // namespace

PackedWeight gptq_quantize(const at::Tensor& weight, const at::Tensor& hessian, const GptqOptions& options,
                           const std::string& name) {
  const QuantSpec& spec = options.spec;
  const int64_t out = weight.size(0), in = weight.size(1);
  const int64_t group = checked_group_size(out, in, spec, name);
  const int64_t groups = in / group;
  const double maxq = static_cast<double>((int64_t{1} << spec.bits) - 1);
  // Blocks hold whole groups when groups are narrower than a block, so a group's parameters come from its
  // up-to-date columns; a wider group starts at a block boundary and takes its later columns as they stand.
  const int64_t bs = std::max<int64_t>(1, options.block_size);
  const int64_t block = group < bs ? group * (bs / group) : bs;

  at::Tensor W = weight.to(at::kFloat).clone();  // [out, in]
  at::Tensor H = hessian.to(at::kDouble).clone();  // [in, in]
  const at::Tensor dead = H.diagonal() == 0;      // inputs that were always 0: their columns do not matter
  H.diagonal().masked_fill_(dead, 1.0);
  W.index_put_({at::indexing::Slice(), dead}, 0.0);

  at::Tensor perm, inverse_perm;
  if (options.act_order) {
    perm = at::argsort(H.diagonal(), /*dim=*/0, /*descending=*/true);
    inverse_perm = at::argsort(perm);
    W = W.index_select(1, perm);
    H = H.index_select(0, perm).index_select(1, perm);
  }
  const at::Tensor U = inverse_hessian_factor(H, options.damp_percent, name).to(at::kFloat);  // [in, in] upper

  at::Tensor Q = at::zeros({out, in}, W.options().dtype(at::kInt));
  at::Tensor scales = at::empty({groups, out}, W.options()), zeros = at::empty({groups, out}, W.options());
  at::Tensor scale, zero;  // of the current group, [out]
  for (int64_t b0 = 0; b0 < in; b0 += block) {
    const int64_t n = std::min(block, in - b0);
    at::Tensor Wb = W.narrow(1, b0, n).clone();  // [out, n]
    at::Tensor Eb = at::empty({out, n}, at::kFloat);
    const at::Tensor ub = U.narrow(0, b0, n).narrow(1, b0, n).contiguous();  // [n, n]
    const at::Tensor diagonal = ub.diagonal().to(at::kCPU, at::kDouble).contiguous();
    const double* d = diagonal.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t column = b0 + i;
      if (column % group == 0) {
        const int64_t inside = std::min(group, n - i);
        at::Tensor columns = Wb.narrow(1, i, inside);  // [out, group]
        if (inside < group) columns = at::cat({columns, W.narrow(1, b0 + n, group - inside)}, 1);
        std::tie(scale, zero) = group_scale_zero(columns, spec.bits, spec.sym);
        scales.select(0, column / group).copy_(scale);
        zeros.select(0, column / group).copy_(zero);
      }
      const at::Tensor w = Wb.select(1, i);                                     // [out]
      const at::Tensor q = (w / scale).round().add(zero).clamp(0, maxq);      // [out]
      Q.select(1, column).copy_(q);
      const at::Tensor err = (w - (q - zero) * scale) / d[i];           // [out]
      // The not yet quantised columns of the block absorb the error: W[:, i:] -= err U[i, i:].
      if (i + 1 < n) Wb.narrow(1, i + 1, n - i - 1).sub_(at::outer(err, ub[i].narrow(0, i + 1, n - i - 1)));
      Eb.select(1, i).copy_(err);
    }
    // The later blocks absorb this block's error at once (the "lazy batch" update).
    if (b0 + n < in) W.narrow(1, b0 + n, in - b0 - n).sub_(at::mm(Eb, U.narrow(0, b0, n).narrow(1, b0 + n, in - b0 - n)));
  }

  at::Tensor g_idx = at::arange(in, W.options().dtype(at::kLong)) / group;  // group of each (permuted) column
  if (options.act_order) {
    Q = Q.index_select(1, inverse_perm);
    g_idx = g_idx.index_select(0, inverse_perm);  // column perm[j] sits at position j: its group is j / group
  }
  return pack_gptq(Q, scales, zeros.to(at::kInt), spec.bits, group, g_idx);
}

namespace {
// The linear layers of the decoder blocks, by module path (language_model.model.layers.* in a vision-language
// model: its vision tower and projector stay in float).
std::map<std::string, nn::LinearImpl*> block_linears(CausalLM& model) {
  std::map<std::string, nn::LinearImpl*> out;
  const std::string blocks = model->language_model_prefix() + "model.layers.";
  for (const auto& item : model->named_modules("", false)) {
    auto* linear = item.value()->as<nn::Linear>();
    // Mixture-of-experts routers stay float (their experts are packed).
    if (linear != nullptr && item.key().rfind(blocks, 0) == 0 && !model->is_router(item.key())) out[item.key()] = linear;
  }
  return out;
}
}  // namespace

std::map<std::string, PackedWeight> quantize_model_rtn(CausalLM& model, const QuantSpec& spec) {
  const auto linears = block_linears(model);
  for (const auto& [name, linear] : linears) checked_group_size(linear->out_features(), linear->in_features(), spec, name);
  at::NoGradGuard no_grad;
  std::map<std::string, PackedWeight> packed;
  for (const auto& [name, linear] : linears) {
    if (linear->packed) fail<ConfigError>("{}: the layer is already packed", name);
    packed.emplace(name, quantize_rtn(linear->weight, spec, name));
  }
  return packed;
}

void attach_packed_weights(CausalLM& model, std::map<std::string, PackedWeight> packed) {
  const auto linears = block_linears(model);
  at::NoGradGuard no_grad;
  for (auto& [name, p] : packed) {
    const auto it = linears.find(name);
    if (it == linears.end()) fail<ModelError>("{} is not a linear layer of the decoder blocks", name);
    nn::LinearImpl* linear = it->second;
    const at::TensorOptions options = linear->weight.options();
    linear->packed = std::make_shared<const PackedWeight>(std::move(p));
    linear->weight.set_data(at::empty({0}, options));
  }
}

std::map<std::string, PackedWeight> quantize_model_gptq(CausalLM& model,
                                                        const std::vector<std::vector<int64_t>>& calibration,
                                                        const GptqOptions& options,
                                                        std::vector<GptqLayerReport>* report,
                                                        const std::function<void(int64_t, int64_t)>& progress) {
  if (calibration.empty()) fail<ConfigError>("GPTQ needs at least one calibration sample");
  at::NoGradGuard no_grad;
  model->eval();
  const at::Device device = model->device();
  // Hidden states entering the current layer, one [1, T, D] tensor per sample: one layer's activations.
  std::vector<at::Tensor> hidden;
  for (const auto& ids : calibration) {
    const at::Tensor t = at::tensor(ids, at::kLong).to(device).unsqueeze(0);  // [1, T]
    hidden.push_back(model->scale_inputs(model->embed(t)));  // [1, T, D], what the first layer receives
  }
  const int64_t layers = model->config().num_hidden_layers;
  std::map<std::string, PackedWeight> packed;
  for (int64_t l = 0; l < layers; ++l) {
    auto* layer = model->model->layers[l]->as<DecoderLayer>();
    const std::string prefix = model->language_model_prefix() + "model.layers." + std::to_string(l) + ".";
    for (const LinearGroup& stage : layer->linear_groups()) {
      // One Hessian per distinct input (q, k and v see the same x): sum of x x^T over every calibration token.
      std::map<nn::LinearImpl*, at::Tensor> hessians;
      for (const auto& [suffix, linear] : stage) {
        hessians[linear] = at::zeros({linear->in_features(), linear->in_features()},
                                     at::TensorOptions().dtype(at::kDouble).device(device));
        at::Tensor* H = &hessians[linear];
        linear->input_observer = [H](const at::Tensor& x) {
          const at::Tensor rows = x.reshape({-1, x.size(-1)}).to(at::kDouble);  // [tokens, in]
          H->addmm_(rows.t(), rows);
        };
      }
      for (const at::Tensor& h : hidden) model->forward_layer(l, h);
      for (const auto& [suffix, linear] : stage) {
        linear->input_observer = nullptr;
        const std::string name = prefix + suffix;
        const at::Tensor& H = hessians.at(linear);
        // A mixture-of-experts expert no calibration token was routed to has no Hessian: GPTQ would treat every
        // input as dead and zero the weights, so it is rounded to nearest instead.
        const bool unseen = H.diagonal().abs().max().item<double>() == 0;
        PackedWeight p = unseen ? quantize_rtn(linear->weight, options.spec, name)
                                : gptq_quantize(linear->weight, H, options, name);
        const at::Tensor Wq = p.dequantize(linear->weight.scalar_type());  // [out, in]
        if (report != nullptr) {
          const at::Tensor W = linear->weight.to(at::kDouble), D = W - Wq.to(at::kDouble);
          const double num = (at::mm(D, H) * D).sum().item<double>();
          const double den = (at::mm(W, H) * W).sum().item<double>();
          report->push_back({name, den > 0 ? num / den : 0.0});
        }
        linear->weight.set_data(Wq);
        packed.emplace(name, std::move(p));
      }
    }
    for (at::Tensor& h : hidden) h = model->forward_layer(l, h);  // through the quantised layer
    if (progress) progress(l + 1, layers);
  }
  return packed;
}

}  // namespace swiftcpp
