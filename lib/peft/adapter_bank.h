// Several LoRA adapters over one base model, each batch row choosing its own (multi-LoRA serving, as vLLM and
// S-LoRA serve them): the adapters live in the bank, not on the layers, and a forward under a selection adds each
// row's delta (nn::RowAdapters).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/fs.h"
#include "models/decoder/decoder.h"
#include "nn/layers.h"
#include "nn/row_adapters.h"

namespace swiftcpp {

class AdapterBank {
 public:
  /// Loads the PEFT adapter in `dir` for `model` (as load_adapter reads it) into the bank, leaving the model's
  /// layers without it; returns its index (1, 2, ...; 0 is the base model). Throws what load_adapter throws, and
  /// ConfigError naming the folder for DoRA adapters or adapters with modules_to_save (not served per row: merge
  /// them with `export --merge-lora`), or when an adapter is already attached to the model.
  int64_t add(CausalLM& model, const fs::path& dir);
  int64_t size() const { return count_; }

  /// The selection for one forward: adapter_of_row[b] is batch row b's adapter (0: none). Throws ConfigError for
  /// an index outside [0, size()]. The bank must outlive the selection.
  std::unique_ptr<nn::RowAdapters> select(std::vector<int64_t> adapter_of_row) const;

 private:
  class Selection;
  // Per layer, the adapter of each index (null where that adapter does not target the layer); index 0 unused.
  std::unordered_map<const nn::LinearImpl*, std::vector<std::shared_ptr<const nn::LoraWeights>>> layers_;
  int64_t count_ = 0;
  CausalLM model_{nullptr};  // keeps the layers the keys point at alive
};

}  // namespace swiftcpp
