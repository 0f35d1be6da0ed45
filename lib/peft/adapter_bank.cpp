#include "peft/adapter_bank.h"

#include <ATen/ATen.h>
#include <map>

#include "core/error.h"
#include "peft/lora.h"

namespace swiftcpp {

namespace {

std::vector<nn::LinearImpl*> linear_layers(CausalLM& model) {
  std::vector<nn::LinearImpl*> out;
  for (const auto& m : model->modules(/*include_self=*/false)) {
    if (auto* linear = dynamic_cast<nn::LinearImpl*>(m.get())) out.push_back(linear);
  }
  return out;
}

}  // namespace

class AdapterBank::Selection : public nn::RowAdapters {
 public:
  Selection(const AdapterBank& bank, const std::vector<int64_t>& rows) : bank_(bank) {
    for (size_t b = 0; b < rows.size(); ++b) {
      if (rows[b] != 0) groups_[rows[b]].push_back(static_cast<int64_t>(b));
    }
  }

  at::Tensor apply(const nn::LinearImpl& layer, const at::Tensor& x, const at::Tensor& out) const override {
    if (groups_.empty()) return out;
    const auto it = bank_.layers_.find(&layer);
    if (it == bank_.layers_.end()) return out;
    at::Tensor result = out;
    for (const auto& [index, rows] : groups_) {
      const auto& adapter = it->second[index];
      if (!adapter) continue;
      // x: [B, ..., in] -> delta [R, ..., out] for this adapter's rows
      if (static_cast<int64_t>(rows.size()) == x.size(0)) {
        result = at::add(result, at::linear(at::linear(x, adapter->lora_A), adapter->lora_B), adapter->scale);
        continue;
      }
      const at::Tensor index_tensor = at::tensor(rows, at::kLong).to(x.device());
      const at::Tensor delta =
          at::linear(at::linear(x.index_select(0, index_tensor), adapter->lora_A), adapter->lora_B) * adapter->scale;
      result = result.index_add(0, index_tensor, delta.to(result.scalar_type()));
    }
    return result;
  }

 private:
  const AdapterBank& bank_;
  std::map<int64_t, std::vector<int64_t>> groups_;  // adapter -> its batch rows
};

int64_t AdapterBank::add(CausalLM& model, const fs::path& dir) {
  if (!model_.is_empty() && model_.ptr() != model.ptr()) fail<ConfigError>("an adapter bank serves one base model");
  const LoraConfig config = read_adapter_config(dir);
  if (config.use_dora) {
    fail<ConfigError>("{}: DoRA adapters are not served per request yet; merge it into the model with "
                      "`swiftcpp export --adapters {} --merge-lora` and serve the merged folder", dir.string(), dir.string());
  }
  if (!config.modules_to_save.empty()) {
    fail<ConfigError>("{}: adapters with modules_to_save are not served per request; merge it into the model with "
                      "`swiftcpp export --adapters {} --merge-lora`", dir.string(), dir.string());
  }
  std::vector<nn::LinearImpl*> linears = linear_layers(model);
  for (auto* linear : linears) {
    if (linear->lora) fail<ConfigError>("{}: the model already carries an attached adapter", dir.string());
  }
  load_adapter(model, dir);
  const int64_t index = ++count_;
  for (auto* linear : linears) {
    auto& slots = layers_[linear];
    slots.resize(index + 1);
    if (linear->lora) {
      slots[index] = linear->lora;
      linear->lora = nullptr;
    }
  }
  model_ = model;
  return index;
}

std::unique_ptr<nn::RowAdapters> AdapterBank::select(std::vector<int64_t> adapter_of_row) const {
  for (int64_t a : adapter_of_row) {
    if (a < 0 || a > count_) fail<ConfigError>("adapter index {} is outside [0, {}]", a, count_);
  }
  return std::make_unique<Selection>(*this, adapter_of_row);
}

}  // namespace swiftcpp
