// Comparing trained adapters with the ones a reference implementation (peft, TRL) saved.
#pragma once

#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <iostream>
#include <vector>

#include "core/fs.h"
#include "io/safetensors.h"
#include "peft/lora.h"
#include "tests/tensor_util.h"
#include "train/trainer.h"

namespace swiftcpp::test {

/// Relative error of the adapter tensors against the same-named tensors in `dir`/adapter_model.safetensors,
/// norm-wise per tensor: ||ours - reference|| / ||reference||, the worst tensor. Element-wise relative error is no
/// measure after AdamW steps: where a gradient is near zero, m / (sqrt(v) + eps) turns float32 summation-order noise
/// in the gradient into update differences of up to ~lr * 1e-2 (seen: 4.5e-6 on one element of 0.0075, while the
/// mean element differs by 1e-8, about one float32 ulp). The worst element-wise difference is printed too.
inline double adapter_rel_error(const std::vector<TrainableTensor>& tensors, const fs::path& dir) {
  const Checkpoint expected = Checkpoint::open(dir / "adapter_model.safetensors");
  EXPECT_EQ(expected.names().size(), tensors.size());
  double worst = 0, worst_element = 0;
  std::string worst_name;
  for (const auto& t : tensors) {
    const at::Tensor want = expected.tensor(t.name).to(at::kDouble);
    const at::Tensor diff = t.tensor.detach().to(at::kDouble) - want;
    const double rel = diff.norm().item<double>() / std::max(1e-12, want.norm().item<double>());
    if (rel > worst) worst_name = t.name;
    worst = std::max(worst, rel);
    worst_element = std::max(worst_element, diff.abs().max().item<double>());
  }
  std::cout << "[parity] worst element-wise |diff| " << worst_element << "; worst tensor " << worst_name << std::endl;
  return worst;
}

/// The Hugging Face batch of a reference lora_step.json (input_ids, optional attention_mask, labels as HF got them
/// or a note that they are the ids) as our shifted-label Batch.
inline Batch batch_from_reference(const Json& b) {
  const at::Tensor ids = json_to_tensor(b["input_ids"]).to(at::kLong);  // [B, T]
  const at::Tensor hf_labels = b["labels"].is_array() ? json_to_tensor(b["labels"]).to(at::kLong) : ids;
  Batch batch;
  batch.input_ids = ids;
  batch.labels = at::full_like(hf_labels, kIgnoreIndex);
  const int64_t T = ids.size(1);
  batch.labels.narrow(1, 0, T - 1).copy_(hf_labels.narrow(1, 1, T - 1));
  if (b.contains("attention_mask")) batch.key_valid = json_to_tensor(b["attention_mask"]).to(at::kBool);
  batch.position_ids = at::arange(T, at::kLong).unsqueeze(0).expand({ids.size(0), T}).contiguous();
  batch.label_tokens = (batch.labels != kIgnoreIndex).sum().item<int64_t>();
  batch.real_tokens = batch.key_valid.defined() ? batch.key_valid.sum().item<int64_t>() : ids.numel();
  return batch;
}

/// The reference runs' training settings: AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, no decay, no clipping,
/// constant schedule, starting from the adapter in `adapter`.
inline TrainConfig reference_config(const std::string& model, const fs::path& adapter) {
  TrainConfig c;
  c.model = model;
  c.dataset = {"unused"};
  c.adapters = adapter.string();
  c.learning_rate = 1e-3;
  c.adam_beta1 = 0.9;
  c.adam_beta2 = 0.999;
  c.adam_epsilon = 1e-8;
  c.weight_decay = 0.0;
  c.max_grad_norm = 0.0;
  c.lr_scheduler_type = "constant";
  return c;
}

}  // namespace swiftcpp::test
