// Comparing trained adapters with the ones a reference implementation (peft, TRL) saved.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <vector>

#include "core/fs.h"
#include "io/safetensors.h"
#include "peft/lora.h"

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
  for (const auto& t : tensors) {
    const at::Tensor want = expected.tensor(t.name).to(at::kDouble);
    const at::Tensor diff = t.tensor.detach().to(at::kDouble) - want;
    worst = std::max(worst, diff.norm().item<double>() / std::max(1e-12, want.norm().item<double>()));
    worst_element = std::max(worst_element, diff.abs().max().item<double>());
  }
  std::cout << "[parity] worst element-wise |diff| " << worst_element << std::endl;
  return worst;
}

}  // namespace swiftcpp::test
