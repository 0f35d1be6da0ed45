#include "peft/lora.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/json.h"
#include "core/runtime.h"
#include "core/text.h"
#include "io/safetensors.h"
#include "quant/packed.h"

namespace swiftcpp {

namespace {

const std::string kPrefix = "base_model.model.";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool path_matches(const std::string& path, const std::string& target) {
  return path == target || ends_with(path, "." + target);
}

// Every linear layer of the model by path, in registration order.
std::vector<std::pair<std::string, nn::LinearImpl*>> linear_layers(CausalLM& model) {
  std::vector<std::pair<std::string, nn::LinearImpl*>> out;
  for (const auto& item : model->named_modules("", /*include_self=*/false)) {
    if (auto* linear = dynamic_cast<nn::LinearImpl*>(item.value().get())) out.emplace_back(item.key(), linear);
  }
  return out;
}

// Linear layers by path, for lookups by the paths lora_target_paths returned.
std::map<std::string, nn::LinearImpl*> linear_by_path(CausalLM& model) {
  std::map<std::string, nn::LinearImpl*> out;
  for (auto& [path, linear] : linear_layers(model)) out[path] = linear;
  return out;
}

// Modules (any kind) whose path matches a modules_to_save entry.
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> saved_modules(
    CausalLM& model, const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  for (const auto& name : names) {
    bool found = false;
    for (const auto& item : model->named_modules("", false)) {
      if (path_matches(item.key(), name)) {
        out.emplace_back(item.key(), item.value());
        found = true;
      }
    }
    if (!found) {
      if (name == "lm_head" && model->config().tie_word_embeddings) {
        fail<ConfigError>("modules_to_save: this model ties lm_head to model.embed_tokens; save 'embed_tokens'");
      }
      fail<ConfigError>("modules_to_save: no module named '{}' in the {} model", name, model->config().model_type);
    }
  }
  return out;
}

void freeze_base(CausalLM& model) {
  for (auto& p : model->parameters(true)) p.requires_grad_(false);
}

// Trainable copies of modules_to_save, so the base weights stay as loaded.
void unfreeze_saved(CausalLM& model, const std::vector<std::string>& names) {
  at::NoGradGuard no_grad;
  auto& originals = model->saved_module_originals;
  for (auto& [path, module] : saved_modules(model, names)) {
    for (auto& p : module->parameters(/*recurse=*/true)) {
      const bool known = std::any_of(originals.begin(), originals.end(), [&](const auto& o) {
        return o.first.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
      });
      if (!known) originals.emplace_back(p, p.detach());  // the loaded value, for a forward without adapters
      p.set_data(p.detach().clone());
      p.requires_grad_(true);
    }
  }
}

}  // namespace

double LoraConfig::scale() const { return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r)) : lora_alpha / r; }

std::vector<std::string> lora_target_paths(CausalLM& model, const LoraConfig& config) {
  const auto layers = linear_layers(model);
  std::vector<std::string> paths;
  if (config.target_modules_regex) {
    const std::string& pattern = config.target_modules.at(0);
    std::regex re;
    try {
      re = std::regex(pattern);
    } catch (const std::regex_error& e) {
      fail<ConfigError>("target_modules regex '{}' is invalid: {}", pattern, e.what());
    }
    for (const auto& [path, linear] : layers) {
      if (std::regex_match(path, re)) paths.push_back(path);
    }
    if (paths.empty()) fail<ConfigError>("target_modules regex '{}' matches no linear layer of the {} model", pattern,
                                         model->config().model_type);
    return paths;
  }
  // Vision-language models: names select within the language model.
  const std::string prefix = model->language_model_prefix();
  const auto in_scope = [&](const std::string& path) { return model->in_language_model(path); };
  std::set<std::string> chosen;
  for (const auto& target : config.target_modules) {
    bool found = false;
    for (const auto& [path, linear] : layers) {
      if (!in_scope(path)) continue;
      // all-linear: every linear layer but the head and the mixture-of-experts routers.
      const bool hit = target == "all-linear" ? path != prefix + "lm_head" && !model->is_router(path)
                                              : path_matches(path, target);
      if (hit) {
        found = true;
        chosen.insert(path);
      }
    }
    if (!found) {
      std::set<std::string> names;
      for (const auto& [path, linear] : layers) {
        if (in_scope(path)) names.insert(path.substr(path.rfind('.') + 1));
      }
      fail<ConfigError>("target_modules: '{}' matches no linear layer of the {} model (it has: {}, or all-linear)",
                        target, model->config().model_type, fmt::join(names, ", "));
    }
  }
  for (const auto& [path, linear] : layers) {
    if (chosen.count(path)) paths.push_back(path);
  }
  return paths;
}

void inject_lora(CausalLM& model, const LoraConfig& config, uint64_t seed) {
  if (config.r < 1) fail<ConfigError>("lora_rank must be at least 1, got {}", config.r);
  const auto paths = lora_target_paths(model, config);
  freeze_base(model);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto linears = linear_by_path(model);
  at::NoGradGuard no_grad;
  for (const auto& path : paths) {
    nn::LinearImpl* linear = linears.at(path);
    const int64_t out = linear->out_features(), in = linear->in_features();
    auto lora = std::make_shared<nn::LoraWeights>();
    // PEFT: kaiming_uniform_(A, a=sqrt(5)): bound = sqrt(6 / ((1 + 5) * fan_in)) = 1 / sqrt(fan_in).
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    const auto options = linear->weight.options();
    lora->lora_A = at::empty({config.r, in}, at::kFloat).uniform_(-bound, bound, generator).to(options);
    lora->lora_B = at::zeros({out, config.r}, options);
    if (config.use_dora) {
      const at::Tensor w = linear->packed ? linear->packed->dequantize(at::kFloat) : linear->weight;  // [out, in]
      lora->magnitude = w.to(at::kFloat).norm(2, {1}).to(options);
    }
    lora->scale = config.scale();
    lora->dropout = config.lora_dropout;
    for (at::Tensor* t : {&lora->lora_A, &lora->lora_B, &lora->magnitude}) {
      if (t->defined()) t->requires_grad_(true);
    }
    linear->lora = lora;
  }
  unfreeze_saved(model, config.modules_to_save);
}

std::vector<TrainableTensor> adapter_tensors(CausalLM& model, const LoraConfig& config) {
  std::vector<TrainableTensor> out;
  for (auto& [path, linear] : linear_layers(model)) {
    if (!linear->lora) continue;
    out.push_back({kPrefix + path + ".lora_A.weight", linear->lora->lora_A, true});
    out.push_back({kPrefix + path + ".lora_B.weight", linear->lora->lora_B, true});
    if (linear->lora->magnitude.defined()) {
      out.push_back({kPrefix + path + ".lora_magnitude_vector", linear->lora->magnitude, false});
    }
  }
  for (auto& [path, module] : saved_modules(model, config.modules_to_save)) {
    for (const auto& p : module->named_parameters(/*recurse=*/true)) {
      out.push_back({kPrefix + path + "." + p.key(), p.value(), p.value().dim() >= 2});
    }
  }
  return out;
}

Json adapter_config_json(const LoraConfig& c) {
  Json j = Json::object();
  j["alpha_pattern"] = Json::object();
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] = c.base_model_name_or_path;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layer_replication"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["loftq_config"] = Json::object();
  j["lora_alpha"] = c.lora_alpha;
  j["lora_dropout"] = c.lora_dropout;
  j["megatron_config"] = nullptr;
  j["megatron_core"] = "megatron.core";
  j["modules_to_save"] = c.modules_to_save.empty() ? Json(nullptr) : Json(c.modules_to_save);
  j["peft_type"] = "LORA";
  j["r"] = c.r;
  j["rank_pattern"] = Json::object();
  j["revision"] = nullptr;
  std::vector<std::string> targets = c.target_modules;
  std::sort(targets.begin(), targets.end());
  if (c.target_modules_regex || (targets.size() == 1 && targets[0] == "all-linear")) j["target_modules"] = targets.at(0);
  else j["target_modules"] = targets;
  j["task_type"] = c.task_type;
  j["use_dora"] = c.use_dora;
  j["use_rslora"] = c.use_rslora;
  return j;
}

namespace {

std::string regex_escape(const std::string& text) {
  static const std::string special = R"(\^$.|?*+()[]{})";
  std::string out;
  for (const char ch : text) {
    if (special.find(ch) != std::string::npos) out += '\\';
    out += ch;
  }
  return out;
}

// "model.layers.3.mlp.up_proj" -> "model\.layers\.\d+\.mlp\.up_proj": every index of a module list becomes \d+.
std::string path_template(const std::string& path) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool index = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    out += index ? std::string(R"(\d+)") : regex_escape(part);
    if (dot == std::string::npos) return out;
    out += R"(\.)";
    start = dot + 1;
  }
}

}  // namespace

LoraConfig peft_saved_config(CausalLM& model, const LoraConfig& config) {
  std::set<std::string> adapted;
  for (auto& [path, linear] : linear_layers(model)) {
    if (linear->lora) adapted.insert(path);
  }
  LoraConfig out = config;
  if (adapted.empty()) return out;
  std::vector<std::string> modules;
  for (const auto& item : model->named_modules("", /*include_self=*/false)) modules.push_back(item.key());
  const auto selected = [&](const auto& selects) {
    std::set<std::string> chosen;
    for (const auto& m : modules) {
      if (selects(m)) chosen.insert(m);
    }
    return chosen;
  };

  // The layers' names, when no other module's path ends with one of them.
  std::set<std::string> names;
  for (const auto& path : adapted) names.insert(path.substr(path.rfind('.') + 1));
  const auto by_name = selected([&](const std::string& m) {
    return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return path_matches(m, n); });
  });
  if (by_name == adapted) {
    out.target_modules.assign(names.begin(), names.end());
    out.target_modules_regex = false;
    return out;
  }

  // A regex: each path with its list indices as \d+ where that selects exactly the adapted paths of its shape (every
  // layer's), else the paths themselves; then the leaves of a common parent as one group.
  std::map<std::string, std::set<std::string>> shapes;  // template -> adapted paths of that shape
  for (const auto& path : adapted) shapes[path_template(path)].insert(path);
  std::map<std::string, std::set<std::string>> leaves;  // parent pattern -> leaf patterns
  const std::string dot = R"(\.)";
  const auto add = [&](const std::string& pattern) {
    const size_t at = pattern.rfind(dot);
    if (at == std::string::npos) {
      leaves[""].insert(pattern);  // a module at the top (lm_head)
    } else {
      leaves[pattern.substr(0, at)].insert(pattern.substr(at + dot.size()));
    }
  };
  for (const auto& [shape, paths] : shapes) {
    const std::regex re(shape);
    if (selected([&](const std::string& m) { return std::regex_match(m, re); }) == paths) {
      add(shape);
    } else {
      for (const auto& path : paths) add(regex_escape(path));
    }
  }
  std::vector<std::string> parts;
  for (const auto& [parent, leaf] : leaves) {
    if (parent.empty()) {
      parts.insert(parts.end(), leaf.begin(), leaf.end());
      continue;
    }
    parts.push_back(parent + dot + (leaf.size() == 1 ? *leaf.begin() : "(" + fmt::format("{}", fmt::join(leaf, "|")) + ")"));
  }
  const std::string pattern = parts.size() == 1 ? parts[0] : "(" + fmt::format("{}", fmt::join(parts, "|")) + ")";
  const std::regex re(pattern);
  if (selected([&](const std::string& m) { return std::regex_match(m, re); }) != adapted) {
    fail<Error>("internal: the target_modules regex '{}' does not select exactly the {} adapted layers", pattern,
                adapted.size());
  }
  out.target_modules = {pattern};
  out.target_modules_regex = true;
  return out;
}

void save_adapter(const fs::path& dir, CausalLM& model, const LoraConfig& config) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail<IoError>("cannot create adapter folder {}: {}", dir.string(), ec.message());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& t : adapter_tensors(model, config)) {
    const at::Tensor v = t.tensor.detach();
    tensors.emplace_back(t.name, v.scalar_type() == at::kDouble ? v : v.to(at::kFloat));
  }
  save_safetensors(dir / "adapter_model.safetensors", tensors, {{"format", "pt"}});
  write_file_atomic(dir / "adapter_config.json", adapter_config_json(peft_saved_config(model, config)).dump(2) + "\n");
}

namespace {
// adapter_config.json -> LoraConfig; a target_modules regex (PEFT allows one string matched against full module
// paths) comes back in `target_regex`.
LoraConfig parse_adapter_config(const fs::path& config_path, std::string& target_regex) {
  const JsonObject j = JsonObject::load(config_path);
  const std::string origin = config_path.string();
  const std::string peft_type = j.get_or<std::string>("peft_type", "LORA");
  if (peft_type != "LORA") fail<ConfigError>("{}: peft_type '{}' is not supported (expected LORA)", origin, peft_type);
  LoraConfig c;
  c.r = j.get<int64_t>("r");
  c.lora_alpha = j.get<double>("lora_alpha");
  c.lora_dropout = j.get_or<double>("lora_dropout", 0.0);
  c.use_rslora = j.get_or<bool>("use_rslora", false);
  c.use_dora = j.get_or<bool>("use_dora", false);
  c.base_model_name_or_path = j.get_or<std::string>("base_model_name_or_path", "");
  c.task_type = j.get_or<std::string>("task_type", "CAUSAL_LM");
  const std::string bias = j.get_or<std::string>("bias", "none");
  if (bias != "none") fail<ConfigError>("{}: bias '{}' is not supported (expected none)", origin, bias);
  if (j.get_or<bool>("fan_in_fan_out", false)) fail<ConfigError>("{}: fan_in_fan_out adapters are not supported", origin);
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (j.has(key) && !j.raw()[key].empty()) fail<ConfigError>("{}: '{}' is not supported (one rank and alpha for every layer)", origin, key);
  }
  if (j.has("layers_to_transform")) fail<ConfigError>("{}: 'layers_to_transform' is not supported", origin);
  const Json& tm = j.raw().value("target_modules", Json());
  c.target_modules.clear();
  if (tm.is_string()) {
    if (tm.get<std::string>() == "all-linear") c.target_modules = {"all-linear"};
    else target_regex = tm.get<std::string>();
  } else if (tm.is_array()) {
    for (const auto& t : tm) {
      if (!t.is_string()) fail<ConfigError>("{}: target_modules must hold strings", origin);
      c.target_modules.push_back(t.get<std::string>());
    }
  } else {
    fail<ConfigError>("{}: target_modules must be a list of module names or a string", origin);
  }
  if (j.has("modules_to_save")) {
    const Json& ms = j.raw()["modules_to_save"];
    if (!ms.is_array()) fail<ConfigError>("{}: modules_to_save must be a list or null", origin);
    for (const auto& m : ms) c.modules_to_save.push_back(m.get<std::string>());
  }
  if (c.r < 1) fail<ConfigError>("{}: r must be at least 1, got {}", origin, c.r);
  if (!std::isfinite(c.lora_alpha)) fail<ConfigError>("{}: lora_alpha must be a finite number, got {}", origin, c.lora_alpha);
  if (!(c.lora_dropout >= 0 && c.lora_dropout < 1)) {
    fail<ConfigError>("{}: lora_dropout must be in [0, 1), got {}", origin, c.lora_dropout);
  }

  return c;
}
}  // namespace

LoraConfig read_adapter_config(const fs::path& dir) {
  std::string regex;
  LoraConfig c = parse_adapter_config(dir / "adapter_config.json", regex);
  if (!regex.empty()) {
    c.target_modules = {regex};
    c.target_modules_regex = true;
  }
  return c;
}

LoraConfig load_adapter(CausalLM& model, const fs::path& dir) {
  const fs::path config_path = dir / "adapter_config.json";
  const fs::path weights_path = dir / "adapter_model.safetensors";
  if (!fs::is_directory(dir)) fail<IoError>("adapter folder {} does not exist", dir.string());
  if (!fs::exists(weights_path)) {
    fail<IoError>("{}: no adapter_model.safetensors (PEFT adapters are read from safetensors; convert a .bin "
                  "adapter with peft first)", dir.string());
  }
  LoraConfig c = read_adapter_config(dir);
  const std::string origin = config_path.string();

  // Which linear layers the config selects.
  std::vector<std::string> paths;
  try {
    paths = lora_target_paths(model, c);
  } catch (const ConfigError& e) {
    fail<ModelError>("{}: adapter does not fit this model: {}", origin, e.what());
  }

  const Checkpoint file = Checkpoint::open(weights_path);
  // Canonical names: PEFT writes no adapter name, but some tools keep ".default"; modules_to_save may be stored
  // with ".modules_to_save".
  std::map<std::string, std::string> canonical;  // canonical -> name in file
  for (const auto& name : file.names()) {
    std::string n = name;
    for (const std::string infix : {".default", ".modules_to_save"}) {
      for (size_t at = n.find(infix + "."); at != std::string::npos; at = n.find(infix + ".")) n.erase(at, infix.size());
    }
    if (ends_with(n, ".lora_magnitude_vector.weight")) n.resize(n.size() - std::string(".weight").size());
    canonical[n] = name;
  }
  freeze_base(model);
  unfreeze_saved(model, c.modules_to_save);
  std::vector<std::string> missing, misshaped;
  std::set<std::string> used;
  const at::TensorOptions options = model->model->embed_tokens->weight.options().requires_grad(false);
  auto take = [&](const std::string& key, const std::vector<int64_t>& shape) -> at::Tensor {
    auto it = canonical.find(key);
    if (it == canonical.end()) {
      missing.push_back(key);
      return {};
    }
    used.insert(key);
    const at::Tensor t = file.tensor(it->second);
    if (!at::isFloatingType(t.scalar_type())) {
      fail<FormatError>("{}: tensor {} is {}; adapter tensors are floating point (float32, bfloat16 or float16)",
                        weights_path.string(), it->second, c10::toString(t.scalar_type()));
    }
    if (t.sizes().vec() != shape) {
      misshaped.push_back(fmt::format("{} (file {}, expected {})", it->second, fmt::join(t.sizes(), "x"), fmt::join(shape, "x")));
      return {};
    }
    return t.to(options.device(), options.dtype().toScalarType()).clone();
  };
  std::vector<std::pair<nn::LinearImpl*, std::shared_ptr<nn::LoraWeights>>> attached;
  const auto linears = linear_by_path(model);
  for (const auto& path : paths) {
    nn::LinearImpl* linear = linears.at(path);
    const int64_t out = linear->out_features(), in = linear->in_features();
    auto lora = std::make_shared<nn::LoraWeights>();
    lora->lora_A = take(kPrefix + path + ".lora_A.weight", {c.r, in});
    lora->lora_B = take(kPrefix + path + ".lora_B.weight", {out, c.r});
    if (c.use_dora) lora->magnitude = take(kPrefix + path + ".lora_magnitude_vector", {out});
    lora->scale = c.scale();
    lora->dropout = c.lora_dropout;
    attached.emplace_back(linear, lora);
  }
  struct SavedValue {
    std::string name;
    at::Tensor param, value;
  };
  std::vector<SavedValue> saved_values;
  for (auto& [path, module] : saved_modules(model, c.modules_to_save)) {
    for (const auto& p : module->named_parameters(/*recurse=*/true)) {
      const at::Tensor v = take(kPrefix + path + "." + p.key(), p.value().sizes().vec());
      if (v.defined()) saved_values.push_back({path + "." + p.key(), p.value(), v});
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [key, name] : canonical) {
    if (!used.count(key)) unexpected.push_back(name);
  }
  if (!missing.empty() || !misshaped.empty() || !unexpected.empty()) {
    std::string msg = fmt::format("{}: adapter does not fit the {} model ({} layers, hidden {}; adapter r {}, targets {})",
                                  weights_path.string(), model->config().model_type, model->config().num_hidden_layers,
                                  model->config().hidden_size, c.r, fmt::join(c.target_modules, ","));
    if (!missing.empty()) msg += "\n  missing: " + list_names(missing, 8);
    if (!misshaped.empty()) msg += "\n  wrong shape: " + list_names(misshaped, 8);
    if (!unexpected.empty()) msg += "\n  unexpected: " + list_names(unexpected, 8);
    throw ModelError(msg);
  }
  // Values NaN or Inf, or a scale that makes every output overflow, are reported as base weights are
  // (warn_nonfinite_weights): the adapter loads, and the user learns why its outputs are NaN.
  std::vector<std::string> nonfinite;
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto& lora = attached[i].second;
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"lora_A", &lora->lora_A},
                                  {"lora_B", &lora->lora_B}, {"lora_magnitude_vector", &lora->magnitude}}) {
      if (t->defined() && !all_finite(*t)) nonfinite.push_back(paths[i] + "." + name);
    }
  }
  for (const auto& saved : saved_values) {
    if (!all_finite(saved.value)) nonfinite.push_back(saved.name);
  }
  if (!nonfinite.empty()) {
    warn(fmt::format("{}: {} adapter tensor{} hold NaN or Inf values, so outputs computed with the adapter will be "
                     "NaN or garbage: {}", weights_path.string(), nonfinite.size(), nonfinite.size() == 1 ? "" : "s",
                     list_names(nonfinite)));
  }
  if (std::abs(c.scale()) > 1e4) {
    warn(fmt::format("{}: lora_alpha {} over r {} scales the adapter's output by {:g}: outputs are likely to overflow",
                     config_path.string(), c.lora_alpha, c.r, c.scale()));
  }
  at::NoGradGuard no_grad;
  for (auto& [linear, lora] : attached) {
    for (at::Tensor* t : {&lora->lora_A, &lora->lora_B, &lora->magnitude}) {
      if (t->defined()) t->requires_grad_(true);
    }
    linear->lora = lora;
  }
  for (auto& saved : saved_values) saved.param.set_data(saved.value);
  return c;
}

AdaptersDisabled::AdaptersDisabled(CausalLM& model) : model_(model) {
  for (auto& [path, linear] : linear_layers(model)) {
    if (linear->lora) detached_.emplace_back(linear, linear->lora);
  }
  if (detached_.empty()) {
    fail<ConfigError>("the {} model has no LoRA adapter to switch off; a reference model without adapters must be a "
                      "separate model", model->config().model_type);
  }
  // With adapters attached the base is frozen, so a trainable parameter is a modules_to_save copy: it runs with its
  // original value, as peft's disable_adapter runs the original module. One without a kept original is refused.
  const auto& originals = model->saved_module_originals;
  std::vector<std::string> trainable;
  for (const auto& p : model->named_parameters(/*recurse=*/true)) {
    if (!p.value().requires_grad()) continue;
    const bool kept = std::any_of(originals.begin(), originals.end(), [&](const auto& o) {
      return o.first.unsafeGetTensorImpl() == p.value().unsafeGetTensorImpl();
    });
    if (!kept) trainable.push_back(p.key());
  }
  if (!trainable.empty()) {
    fail<ConfigError>("the adapters cannot be switched off for a reference forward: base parameters are trained "
                      "({}) and their original values are not kept; use a separate reference model",
                      list_names(trainable, 4));
  }
  for (auto& [linear, lora] : detached_) linear->lora.reset();
  for (const auto& [param, original] : originals) {
    at::Tensor trained = param;  // the same parameter: set_data swaps what it holds
    swapped_.emplace_back(trained, param.detach());
    trained.set_data(original);
  }
}

AdaptersDisabled::~AdaptersDisabled() {
  for (auto& [linear, lora] : detached_) linear->lora = std::move(lora);
  for (auto& [param, trained] : swapped_) param.set_data(trained);
}

void merge_lora(CausalLM& model) {
  at::NoGradGuard no_grad;
  for (auto& [path, linear] : linear_layers(model)) {
    if (!linear->lora) continue;
    if (linear->packed || linear->blocks) {
      fail<ConfigError>("{}: an adapter cannot be merged into packed integer weights; merge it onto the float base "
                        "model (swiftcpp export --model FLOAT_DIR --adapters ...)", path);
    }
    const nn::LoraWeights& a = *linear->lora;
    const at::Tensor w = linear->weight.to(at::kDouble);
    at::Tensor merged = w + a.scale * at::mm(a.lora_B.to(at::kDouble), a.lora_A.to(at::kDouble));  // [out, in]
    if (a.magnitude.defined()) {
      const at::Tensor norm = merged.norm(2, {1}, /*keepdim=*/true);  // [out, 1]
      merged = merged * (a.magnitude.to(at::kDouble).unsqueeze(1) / norm);
    }
    linear->weight.set_data(merged.to(linear->weight.options()).contiguous());
    linear->lora.reset();
  }
}

}  // namespace swiftcpp
