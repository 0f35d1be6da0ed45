// The seam for adapters chosen per batch row (multi-LoRA serving): lib/nn defines it, lib/peft's AdapterBank
// implements it. While a RowAdaptersScope is alive on a thread, every Linear forward on that thread adds each
// batch row's own adapter delta to its output.
#pragma once

#include <ATen/core/Tensor.h>

namespace swiftcpp::nn {

class LinearImpl;

class RowAdapters {
 public:
  virtual ~RowAdapters() = default;
  /// x: [B, ..., in], the input of `layer`; out: its output without row adapters [B, ..., out] -> out plus, for
  /// each batch row, its adapter's delta on that layer (none for rows of the base model or layers the row's
  /// adapter does not target).
  virtual at::Tensor apply(const LinearImpl& layer, const at::Tensor& x, const at::Tensor& out) const = 0;
};

/// The row adapters of this thread's forwards (null: none).
const RowAdapters* current_row_adapters();

/// Sets this thread's row adapters for its lifetime, restoring the previous ones after.
class RowAdaptersScope {
 public:
  explicit RowAdaptersScope(const RowAdapters* adapters);
  ~RowAdaptersScope();
  RowAdaptersScope(const RowAdaptersScope&) = delete;
  RowAdaptersScope& operator=(const RowAdaptersScope&) = delete;

 private:
  const RowAdapters* previous_;
};

}  // namespace swiftcpp::nn
