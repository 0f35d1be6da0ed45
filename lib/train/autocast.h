// bf16 autocast for a training forward and its loss (backward runs outside the scope, as torch.autocast
// recommends), on the CPU or a CUDA device.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>

namespace swiftcpp {

class AutocastScope {
 public:
  AutocastScope(bool on, const c10::Device& device) : on_(on), cuda_(device.is_cuda()) {
    if (!on_) return;
    if (cuda_) {
      prev_enabled_ = at::autocast::is_enabled();
      prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_enabled(true);
      at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    } else {
      prev_enabled_ = at::autocast::is_cpu_enabled();
      prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    }
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    if (cuda_) {
      at::autocast::set_enabled(prev_enabled_);
      at::autocast::set_autocast_gpu_dtype(prev_dtype_);
    } else {
      at::autocast::set_cpu_enabled(prev_enabled_);
      at::autocast::set_autocast_cpu_dtype(prev_dtype_);
    }
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool on_, cuda_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

}  // namespace swiftcpp
