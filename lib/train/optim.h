// AdamW with decoupled weight decay (torch.optim.AdamW's arithmetic, step for step), global-norm clipping and
// the Hugging Face learning-rate schedules.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "peft/lora.h"

namespace swiftcpp {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied to tensors with decay = true only
};

/// AdamW over named tensors. State per tensor: exp_avg and exp_avg_sq (float32 or the tensor's wider dtype).
class AdamW {
 public:
  AdamW(std::vector<TrainableTensor> params, AdamWOptions options);

  /// One update with learning rate `lr` from the tensors' .grad (tensors without a gradient are skipped, as
  /// torch does). The arithmetic is torch.optim.AdamW's single-tensor path (PyTorch 1.13).
  void step(double lr);
  /// Sets every gradient to undefined (set_to_none).
  void zero_grad();

  /// The step count (how many updates have been made).
  int64_t steps() const { return steps_; }
  const std::vector<TrainableTensor>& params() const { return params_; }

  /// exp_avg.<name> / exp_avg_sq.<name> tensors plus the step count, for a checkpoint.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  /// Restores what state() returned. Throws FormatError naming `origin` when a tensor is missing or misshaped.
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t steps,
                  const std::string& origin);

 private:
  std::vector<TrainableTensor> params_;
  AdamWOptions options_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

/// L2 norm of all gradients together (float64 accumulation); scales them by max_norm / (norm + 1e-6) when that
/// is below 1 and max_norm > 0, as torch.nn.utils.clip_grad_norm_ does. Returns the norm before clipping.
double clip_grad_norm(const std::vector<TrainableTensor>& params, double max_norm);

/// Learning rate at optimizer step `step` (0-based: the first update uses step 0), Hugging Face style: linear
/// warm-up from 0 over `warmup` steps, then cosine (half cycle to 0), linear (to 0) or constant.
double scheduled_lr(const std::string& type, double peak, int64_t step, int64_t warmup, int64_t total);

}  // namespace swiftcpp
