#include "train/optim.h"

#include <ATen/ATen.h>
#include <cmath>
#include <map>

#include "core/error.h"

namespace swiftcpp {

AdamW::AdamW(std::vector<TrainableTensor> params, AdamWOptions options)
    : params_(std::move(params)), options_(options) {
  for (const auto& p : params_) {
    const auto dtype = p.tensor.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    exp_avg_.push_back(at::zeros_like(p.tensor, p.tensor.options().dtype(dtype).requires_grad(false)));
    exp_avg_sq_.push_back(at::zeros_like(p.tensor, p.tensor.options().dtype(dtype).requires_grad(false)));
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++steps_;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double bias_correction1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
  const double bias_correction2 = 1.0 - std::pow(b2, static_cast<double>(steps_));
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor param = params_[i].tensor;
    if (!param.grad().defined()) continue;
    at::Tensor grad = param.grad();
    const bool low_precision = param.scalar_type() != exp_avg_[i].scalar_type();
    at::Tensor master = low_precision ? param.to(exp_avg_[i].scalar_type()) : param;
    if (low_precision) grad = grad.to(exp_avg_[i].scalar_type());
    if (params_[i].decay && options_.weight_decay != 0) master.mul_(1.0 - lr * options_.weight_decay);
    exp_avg_[i].mul_(b1).add_(grad, 1.0 - b1);
    exp_avg_sq_[i].mul_(b2).addcmul_(grad, grad, 1.0 - b2);
    const at::Tensor denom = (exp_avg_sq_[i].sqrt() / bias_correction2_sqrt).add_(options_.eps);
    master.addcdiv_(exp_avg_[i], denom, -step_size);
    if (low_precision) param.copy_(master);
  }
}

void AdamW::zero_grad() {
  for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + params_[i].name, exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].name, exp_avg_sq_[i]);
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t steps,
                       const std::string& origin) {
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto [prefix, target] : {std::pair{"exp_avg.", &exp_avg_[i]}, std::pair{"exp_avg_sq.", &exp_avg_sq_[i]}}) {
      const std::string key = prefix + params_[i].name;
      auto it = by_name.find(key);
      if (it == by_name.end()) fail<FormatError>("{}: optimizer state '{}' is missing", origin, key);
      if (it->second.sizes() != target->sizes()) {
        fail<FormatError>("{}: optimizer state '{}' has shape {}, expected {}", origin, key,
                          fmt::join(it->second.sizes(), "x"), fmt::join(target->sizes(), "x"));
      }
      target->copy_(it->second);
    }
  }
  if (by_name.size() != 2 * params_.size()) {
    fail<FormatError>("{}: optimizer state holds {} tensors, expected {} (another tuning setup?)", origin,
                      by_name.size(), 2 * params_.size());
  }
  steps_ = steps;
}

double clip_grad_norm(const std::vector<TrainableTensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const auto& p : params) {
    if (p.tensor.grad().defined()) norms.push_back(p.tensor.grad().norm(2).to(at::kDouble));
  }
  if (norms.empty()) return 0.0;
  const double total = at::stack(norms).norm(2).item<double>();
  if (max_norm > 0) {
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
      for (const auto& p : params) {
        if (p.tensor.grad().defined()) p.tensor.mutable_grad().mul_(coef);
      }
    }
  }
  return total;
}

double scheduled_lr(const std::string& type, double peak, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return peak * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  const double progress =
      static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  if (type == "constant") return peak;
  if (type == "linear") {
    return peak * std::max(0.0, static_cast<double>(total - step) / static_cast<double>(std::max<int64_t>(1, total - warmup)));
  }
  if (type == "cosine") return peak * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
  fail<ConfigError>("unknown lr_scheduler_type '{}' (expected cosine, linear or constant)", type);
}

}  // namespace swiftcpp
