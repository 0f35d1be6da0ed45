// Golden tests of the families beyond Llama (Gemma, Gemma 2, StarCoder2, Phi-2, Phi-3, Mixtral, Qwen2-MoE) against
// Hugging Face transformers: logits of two sequences and of a right-padded batch, the loss (and the MoE
// load-balancing loss), KV-cache decoding against the full forward, and one peft LoRA step. Reference data:
// ../shared/assets/reference/families (README there: tiny random checkpoints, transformers 4.40.2 or a 4.46 tree,
// float32, eager attention).
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <unistd.h>

#include <algorithm>

#include "core/fs.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "models/registry.h"
#include "nn/attention.h"
#include "quant/gguf_model.h"
#include "quant/gptq.h"
#include "tests/adapter_util.h"
#include "tests/tensor_util.h"
#include "train/trainer.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::json_to_tensor;

// float32 forwards that differ from the reference in summation order only (|logits| below 6): the 1e-4.
constexpr double kLogitTol = 1e-4;
// Losses (mean cross-entropy over 43 targets) and gradient norms: absolute, float32.
constexpr double kLossTol = 1e-5;
// Adapter tensors after one AdamW step: norm-wise relative error per tensor (test::adapter_rel_error).
constexpr double kAdapterRelTol = 1e-5;
// KV-cache decoding against one full forward: the same float32 operations over differently shaped batches.
constexpr double kCacheTol = 2e-5;

fs::path families() { return assets() / "reference" / "families"; }

struct Case {
  std::string family, checkpoint;
};

// Every family checkpoint of the reference set.
const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = {{"gemma", "tiny-gemma"},           {"gemma2", "tiny-gemma2"},
                                          {"starcoder2", "tiny-starcoder2"}, {"phi", "tiny-phi"},
                                          {"phi3", "tiny-phi3"},             {"phi3", "tiny-phi3-longrope"},
                                          {"mixtral", "tiny-mixtral"},       {"qwen2_moe", "tiny-qwen2_moe"}};
  return cases;
}

at::Tensor ids_of(const Json& ids) {
  std::vector<int64_t> flat;
  for (const auto& v : ids) flat.push_back(v.get<int64_t>());
  return at::tensor(flat, at::kLong).view({1, -1});
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

double mean_ce(const at::Tensor& logits, const at::Tensor& ids) {  // logits [1, T, V], ids [1, T]
  const int64_t T = ids.size(1);
  return at::cross_entropy_loss(logits[0].narrow(0, 0, T - 1).to(at::kDouble), ids[0].narrow(0, 1, T - 1))
      .item<double>();
}

TEST(FamilyLogits, EveryFamilyMatchesTransformers) {
  SWIFTCPP_REQUIRE_SHARED(families());
  c10::InferenceMode guard;
  for (const Case& c : all_cases()) {
    const Json ref = load_json_file(families() / c.family / "hf_logits.json");
    const Json& m = ref["models"][c.checkpoint];
    CausalLM model = load_causal_lm(families() / c.family / c.checkpoint, {test::test_device(), at::kFloat});
    EXPECT_EQ(model->config().model_type, c.family);
    // The size bound's parameter count (biases aside) lies between the built model's matrices and all its tensors.
    int64_t matrices = 0, all = 0;
    for (const auto& p : model->parameters()) {
      all += p.numel();
      matrices += p.dim() >= 2 ? p.numel() : 0;
    }
    EXPECT_GE(model->config().parameter_count(), matrices) << c.checkpoint;
    EXPECT_LE(model->config().parameter_count(), all) << c.checkpoint;
    const bool moe = model->config().moe.num_experts > 0;
    for (const char* name : {"once_upon_a_time", "arbitrary40"}) {
      const Json& seq = m["sequences"][name];
      const at::Tensor ids = ids_of(seq["ids"]);
      std::vector<at::Tensor> router;
      ForwardOptions seq_options;
      seq_options.router_logits = &router;
      const at::Tensor logits = model->forward(ids.to(test::test_device()), seq_options).cpu();  // [1, T, V]
      if (moe) {  // the load-balancing loss over both layers' router logits
        const double aux = load_balancing_loss(router, model->config().moe.top_k, {}).item<double>();
        std::cout << "[parity] " << c.checkpoint << " " << name << ": aux loss |diff| "
                  << std::abs(aux - seq["aux_loss"].get<double>()) << std::endl;
        EXPECT_NEAR(aux, seq["aux_loss"].get<double>(), kLossTol) << c.checkpoint << " " << name;
        EXPECT_EQ(router.size(), 2u);
      }
      const at::Tensor expected = json_to_tensor(seq["logits"]);
      ASSERT_EQ(logits.sizes(), expected.sizes()) << c.checkpoint << " " << name;
      const double diff = max_abs_diff(logits, expected);
      const double loss = mean_ce(logits, ids), want = seq["loss_labels_eq_ids"].get<double>();
      std::cout << "[parity] " << c.checkpoint << " " << name << ": max |logit - HF| " << diff << ", loss |diff| "
                << std::abs(loss - want) << std::endl;
      EXPECT_LE(diff, kLogitTol) << c.checkpoint << " " << name;
      EXPECT_NEAR(loss, want, kLossTol) << c.checkpoint << " " << name;
    }
    // Right-padded batch with its attention mask: row 0's valid positions as HF computed them (Phi-3 longrope: the
    // long factors, chosen by the padded length 40), row 1 as the unpadded arbitrary40.
    const Json& pb = m["padded_batch"];
    ForwardOptions options;
    options.key_valid = json_to_tensor(pb["attention_mask"]).to(at::kBool).to(test::test_device());
    std::vector<at::Tensor> router;
    options.router_logits = &router;
    const at::Tensor logits =
        model->forward(json_to_tensor(pb["input_ids"]).to(at::kLong).to(test::test_device()), options).cpu();
    if (moe) {  // padding left out of the load-balancing loss
      const double aux = load_balancing_loss(router, model->config().moe.top_k, options.key_valid.reshape({-1}))
                             .item<double>();
      EXPECT_NEAR(aux, pb["aux_loss"].get<double>(), kLossTol) << c.checkpoint;
    }
    const double row0 = max_abs_diff(logits[0].narrow(0, 0, 5), json_to_tensor(pb["row0_valid_logits"])[0]);
    const double row1 = max_abs_diff(logits[1], json_to_tensor(m["sequences"]["arbitrary40"]["logits"])[0]);
    std::cout << "[parity] " << c.checkpoint << " padded batch: row 0 " << row0 << ", row 1 " << row1 << std::endl;
    EXPECT_LE(row0, kLogitTol) << c.checkpoint;
    EXPECT_LE(row1, kLogitTol) << c.checkpoint;
  }
}

// Prefill then one token at a time through the KV cache gives the full forward's logits: the sliding windows
// (StarCoder2's, Gemma 2's alternating ones), partial rotary and soft-capping hold on the cache path too. Phi-3
// longrope is left out: its factors follow the key length, so a cache crossing 32 positions differs from one
// forward by design (as in transformers).
TEST(FamilyLogits, CachedDecodingEqualsTheFullForward) {
  SWIFTCPP_REQUIRE_SHARED(families());
  c10::InferenceMode guard;
  for (const Case& c : all_cases()) {
    if (c.checkpoint == "tiny-phi3-longrope") continue;
    const Json ref = load_json_file(families() / c.family / "hf_logits.json");
    CausalLM model = load_causal_lm(families() / c.family / c.checkpoint, {test::test_device(), at::kFloat});
    const at::Tensor ids = ids_of(ref["models"][c.checkpoint]["sequences"]["arbitrary40"]["ids"]).to(test::test_device());
    const int64_t T = ids.size(1), prefill = 12;
    const at::Tensor full = model->forward(ids).cpu();  // [1, T, V]
    nn::KVCache cache = model->make_cache(1, T);
    ForwardOptions options;
    options.cache = &cache;
    std::vector<at::Tensor> steps = {model->forward(ids.narrow(1, 0, prefill), options).cpu()};
    for (int64_t t = prefill; t < T; ++t) steps.push_back(model->forward(ids.narrow(1, t, 1), options).cpu());
    const double diff = max_abs_diff(at::cat(steps, 1), full);
    std::cout << "[cache] " << c.checkpoint << ": max |cached - full| " << diff << std::endl;
    EXPECT_LE(diff, kCacheTol) << c.checkpoint;
  }
}

// One peft LoRA step (r 4, alpha 8, every decoder linear, AdamW lr 1e-3) on the padded batch: the loss before, the
// gradient norm, the loss after and the adapters after, from the adapter peft initialised. MoE: the loss is
// CE + 0.02 aux over the non-padding tokens, and the adapters cover every expert, the routers and the shared
// expert's gate, as peft wrapped them.
TEST(FamilyTrainParity, OneLoraStepMatchesPeft) {
  SWIFTCPP_REQUIRE_SHARED(families());
  for (const Case& c : all_cases()) {
    const std::string tag = c.checkpoint.substr(5);  // without "tiny-"
    const fs::path dir = families() / c.family;
    const Json ref = load_json_file(dir / (tag + "_lora_step.json"));
    const Batch batch = test::batch_from_reference(ref["batch"]);
    ASSERT_EQ(batch.label_tokens, ref["batch"]["n_loss_tokens"].get<int64_t>()) << tag;
    const fs::path model_dir = dir / c.checkpoint;
    Trainer trainer(test::reference_config(model_dir.string(), dir / (tag + "_lora_init")), load_causal_lm(model_dir));
    EXPECT_EQ(trainer.trainables().size(), ref["adapter_keys"].size()) << tag;
    const StepResult r = trainer.step({batch}, 0, 1);
    // Every adapter tensor's gradient norm as peft's (the gradients stay on the tensors after the step): with these,
    // adapters that differ after the step differ by AdamW's first update, g / (|g| + eps) per element, which turns
    // float32 noise in a near-zero gradient element into a visible change.
    double worst_grad = 0;
    for (const auto& t : trainer.trainables()) {
      // An expert no token was routed to has no gradient (peft's is None, recorded as 0).
      const double ours = t.tensor.grad().defined() ? t.tensor.grad().norm().item<double>() : 0.0;
      const double theirs = ref["grad_l2_norm_per_tensor_step1"][t.name].get<double>();
      worst_grad = std::max(worst_grad, std::abs(ours - theirs) / std::max(theirs, 1e-3));
    }
    std::cout << "[parity] " << tag << " per-tensor gradient norms: worst relative error " << worst_grad << std::endl;
    EXPECT_LT(worst_grad, 1e-4) << tag;
    const double want = ref["loss_before"].get<double>(), want_norm = ref["grad_l2_norm_total_step1"].get<double>();
    const auto [sum, tokens] = trainer.evaluate({batch});
    const double after = sum / tokens, want_after = ref["loss_after_step1"].get<double>();
    std::cout << "[parity] " << tag << " LoRA step: loss |diff| " << std::abs(r.loss - want) << ", grad norm |diff| "
              << std::abs(r.grad_norm - want_norm) << ", loss after |diff| " << std::abs(after - want_after) << std::endl;
    EXPECT_NEAR(r.loss, want, kLossTol) << tag;
    EXPECT_NEAR(r.grad_norm, want_norm, kLossTol) << tag;
    EXPECT_NEAR(after, want_after, kLossTol) << tag;
    if (ref.contains("loss_before_parts")) {  // MoE: the load-balancing loss is logged beside the total
      ASSERT_EQ(r.metrics.count("aux_loss"), 1u) << tag;
      EXPECT_NEAR(r.metrics.at("aux_loss"), ref["loss_before_parts"]["aux_loss"].get<double>(), kLossTol) << tag;
    }
    const double rel = test::adapter_rel_error(trainer.trainables(), dir / (tag + "_lora_after1"));
    std::cout << "[parity] " << tag << " adapters after 1 step: max relative error " << rel << std::endl;
    // Qwen2-MoE: its gradients match peft's per tensor to 7e-7, but layer 0's o_proj lora_A holds elements whose
    // gradient is near AdamW's eps, and the first update g / (|g| + eps) of those differs by up to 5e-5 (of 1e-3).
    EXPECT_LT(rel, c.family == "qwen2_moe" ? 1e-3 : kAdapterRelTol) << tag;
  }
}

// Gradient checkpointing recomputes each block in backward; a sparse block hands its router logits out of the
// checkpoint as a second output, so the load-balancing loss still reaches the routers: the loss and every adapter
// gradient equal the plain step's.
TEST(FamilyTrainParity, MoeStepWithGradientCheckpointingEqualsThePlainStep) {
  SWIFTCPP_REQUIRE_SHARED(families());
  const fs::path dir = families() / "qwen2_moe";
  const Json ref = load_json_file(dir / "qwen2_moe_lora_step.json");
  const Batch batch = test::batch_from_reference(ref["batch"]);
  StepResult results[2];
  std::vector<at::Tensor> adapters[2];
  for (int checkpointing = 0; checkpointing < 2; ++checkpointing) {
    TrainConfig config = test::reference_config((dir / "tiny-qwen2_moe").string(), dir / "qwen2_moe_lora_init");
    config.gradient_checkpointing = checkpointing == 1;
    Trainer trainer(config, load_causal_lm(dir / "tiny-qwen2_moe"));
    results[checkpointing] = trainer.step({batch}, 0, 1);
    for (const auto& t : trainer.trainables()) {  // the gradients (experts no token reached have none)
      adapters[checkpointing].push_back(t.tensor.grad().defined() ? t.tensor.grad().clone() : at::zeros_like(t.tensor));
    }
  }
  EXPECT_NEAR(results[1].loss, results[0].loss, 1e-6);
  EXPECT_NEAR(results[1].grad_norm, results[0].grad_norm, 1e-6);
  EXPECT_NEAR(results[1].metrics.at("aux_loss"), results[0].metrics.at("aux_loss"), 1e-6);
  ASSERT_EQ(adapters[0].size(), adapters[1].size());
  for (size_t i = 0; i < adapters[0].size(); ++i) {
    EXPECT_LE((adapters[0][i] - adapters[1][i]).abs().max().item<double>(), 1e-7) << "gradient " << i;
  }
}

// Soft-capped attention (Gemma 2) trains through the recomputing block kernel: its gradients equal autograd's
// through the explicit path, with a mask and grouped K/V heads.
TEST(FamilyKernels, SoftCappedBlockAttentionBackwardMatchesAutograd) {
  at::manual_seed(3);
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor q0 = at::randn({2, 4, 7, 8}, opts) * 2, k0 = at::randn({2, 2, 7, 8}, opts) * 2;
  const at::Tensor v0 = at::randn({2, 2, 7, 8}, opts), g = at::randn({2, 4, 7, 8}, opts);
  const at::Tensor valid = at::ones({2, 7}, at::kBool);
  valid[0].narrow(0, 5, 2).fill_(false);
  const at::Tensor mask = nn::build_attention_mask(2, 0, 7, valid, 4, at::Device(at::kCPU));
  const nn::ScoreOptions score{0.3, 2.0};
  std::vector<at::Tensor> grads[2];
  for (int path = 0; path < 2; ++path) {
    nn::set_recompute_attention(path == 1);
    const at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
    const at::Tensor v = v0.clone().requires_grad_(true);
    const at::Tensor out = nn::attention(q, k, v, mask, score);
    (out * g).sum().backward();
    grads[path] = {out.detach(), q.grad(), k.grad(), v.grad()};
  }
  nn::set_recompute_attention(true);
  for (size_t i = 0; i < 4; ++i) EXPECT_LE(max_abs_diff(grads[0][i], grads[1][i]), 1e-10) << "tensor " << i;
}

// Settings that change the computation and are not implemented are refused with the file and key.
TEST(FamilyConfig, UnimplementedSettingsAreRefusedWithTheKey) {
  SWIFTCPP_REQUIRE_SHARED(families());
  const fs::path tmp = test::temp_dir("family_config");
  const auto refused = [&](const std::string& family, const std::string& checkpoint, const std::string& key,
                           const Json& value) {
    Json config = load_json_file(families() / family / checkpoint / "config.json");
    config[key] = value;
    const fs::path path = tmp / "config.json";
    write_file_atomic(path, config.dump());
    try {
      load_decoder_config(path);
      ADD_FAILURE() << key << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
  };
  refused("phi", "tiny-phi", "qk_layernorm", true);
  refused("phi3", "tiny-phi3", "partial_rotary_factor", 0.75);
  refused("gemma", "tiny-gemma", "hidden_activation", "relu2");
  refused("gemma", "tiny-gemma", "rope_scaling", Json{{"type", "yarn"}, {"factor", 4.0}});
}

// End to end on the fused (Phi-3), sandwich and soft-capped (Gemma 2) and mixture-of-experts (Qwen2-MoE) families:
// `train` with LoRA on all-linear for 3 steps, `infer` with the adapter, `export --merge-lora` whose folder infers
// the same logits (fused and expert weights written under their Hugging Face names), and `eval` of the merged model.
TEST(FamilyCli, TrainInferMergeAndEvalEachBlockKind) {
  SWIFTCPP_REQUIRE_SHARED(families());
  const fs::path data = test::source_dir() / "tests/data/sft/alpaca_en_demo.json";
  for (const Case& c : {Case{"phi3", "tiny-phi3"}, Case{"gemma2", "tiny-gemma2"}, Case{"qwen2_moe", "tiny-qwen2_moe"}}) {
    const fs::path model = families() / c.family / c.checkpoint;
    const fs::path out = test::temp_dir("family_cli_" + c.family);
    const auto trained = test::run_cli(fmt::format(
        "--threads 1 train model={} dataset={}#16 output_dir={} template=default max_length=128 truncation_strategy=right "
        "per_device_train_batch_size=2 max_steps=3 save_steps=3 logging_steps=1 lora_rank=4 lora_alpha=8 "
        "target_modules=all-linear learning_rate=1e-2 seed=3",
        model.string(), data.string(), (out / "run").string()));
    ASSERT_EQ(trained.code, 0) << c.checkpoint << "\n" << trained.out;
    fs::path checkpoint;
    for (const auto& e : fs::directory_iterator(out / "run")) checkpoint = e.path() / "checkpoint-3";
    ASSERT_TRUE(fs::exists(checkpoint / "adapter_model.safetensors")) << c.checkpoint;
    if (c.family == "qwen2_moe") {  // the load-balancing loss is logged, the routers carry no adapter
      EXPECT_NE(read_text_file(checkpoint.parent_path() / "logging.jsonl").find("aux_loss"), std::string::npos);
      EXPECT_EQ(read_text_file(checkpoint / "adapter_config.json").find("mlp.gate\""), std::string::npos);
    }
    const std::string prompt = "--prompt 'Once upon a time' --max-new-tokens 4 --temperature 0 --template raw";
    const auto adapted = test::run_cli(fmt::format("--threads 1 infer --model {} --adapters {} {} --output-logits {}",
                                                   model.string(), checkpoint.string(), prompt,
                                                   (out / "adapted.safetensors").string()));
    ASSERT_EQ(adapted.code, 0) << c.checkpoint << "\n" << adapted.out;
    const auto exported = test::run_cli(fmt::format("--threads 1 export --model {} --adapters {} --merge-lora --output {}",
                                                    model.string(), checkpoint.string(), (out / "merged").string()));
    ASSERT_EQ(exported.code, 0) << c.checkpoint << "\n" << exported.out;
    const auto merged = test::run_cli(fmt::format("--threads 1 infer --model {} {} --output-logits {}",
                                                  (out / "merged").string(), prompt,
                                                  (out / "merged.safetensors").string()));
    ASSERT_EQ(merged.code, 0) << c.checkpoint << "\n" << merged.out;
    const auto logits = [&](const char* name) {
      return SafetensorsFile::open(out / (std::string(name) + ".safetensors"))->tensor("logits").to(at::kDouble);
    };
    const at::Tensor a = logits("adapted"), m = logits("merged");
    const double diff = (a - m).abs().max().item<double>();
    std::cout << "[export] " << c.checkpoint << " merged vs adapter logits: max |diff| " << diff << std::endl;
    EXPECT_LT(diff, 1e-4) << c.checkpoint;
    // The merged folder holds the checkpoint's own tensor names (fused qkv_proj, every expert).
    const auto names = Checkpoint::open(out / "merged").names();
    const std::string probe = c.family == "phi3"    ? "model.layers.0.self_attn.qkv_proj.weight"
                              : c.family == "gemma2" ? "model.layers.1.post_feedforward_layernorm.weight"
                                                     : "model.layers.1.mlp.experts.3.down_proj.weight";
    EXPECT_NE(std::find(names.begin(), names.end(), probe), names.end()) << c.checkpoint << " lacks " << probe;
    const auto evaluated = test::run_cli(fmt::format("--threads 1 eval --model {} --tasks perplexity={} --limit 2 "
                                                     "--max-length 64 --output-dir {}",
                                                     (out / "merged").string(), data.string(), (out / "eval").string()));
    ASSERT_EQ(evaluated.code, 0) << c.checkpoint << "\n" << evaluated.out;
    EXPECT_TRUE(fs::exists(out / "eval" / "results.json")) << c.checkpoint;
  }
}

// GPTQ on a mixture of experts packs every expert and leaves the routers float; with one calibration token, top-2
// of 4 experts per layer see no input at all, and those are rounded to nearest instead of zeroed (GPTQ would
// treat all their inputs as dead).
TEST(FamilyQuant, GptqPacksEveryExpertAndKeepsUnroutedOnes) {
  SWIFTCPP_REQUIRE_SHARED(families());
  CausalLM model = load_causal_lm(families() / "mixtral" / "tiny-mixtral");
  std::map<std::string, at::Tensor> before;
  for (const auto& item : model->named_parameters(true)) before[item.key()] = item.value().detach().clone();
  GptqOptions options;
  options.spec.bits = 8;
  options.spec.group_size = 32;
  const auto packed = quantize_model_gptq(model, {{1}}, options);
  int64_t experts = 0;
  for (const auto& [name, p] : packed) {
    EXPECT_EQ(name.find(".gate"), std::string::npos) << "router packed: " << name;
    if (name.find(".experts.") == std::string::npos) continue;
    ++experts;
    const at::Tensor w = before.at(name + ".weight");
    const double err = (p.dequantize(at::kFloat) - w).abs().max().item<double>();
    // Zeroed weights would be off by their largest magnitude; 8-bit steps are 1/127 of a group's range, and GPTQ's
    // error feedback on a one-token Hessian moves a few columns by more than half a step.
    EXPECT_LE(err, w.abs().max().item<double>() / 4) << name;
  }
  EXPECT_EQ(experts, 2 * 4 * 3);  // layers x experts x (w1, w2, w3)
}

// The families llama.cpp runs export to GGUF files it loads, with our logits: the gaps of every next-token log-
// probability to the top token's agree to 1e-4 (3e-3 for Gemma and StarCoder2, whose GELU llama.cpp computes from an
// fp16 table, about 1e-4 off per activation: measured 2.9e-4 and 8.1e-4 on these checkpoints against transformers).
// Phi-2 and Gemma 2 are refused with the reason: llama.cpp's versions of them compute other checkpoints differently.
TEST(FamilyGguf, LlamaCppRunsTheExportedFamilies) {
  SWIFTCPP_REQUIRE_SHARED(families());
  for (const Case& c : {Case{"phi", "tiny-phi"}, Case{"gemma2", "tiny-gemma2"}}) {
    const fs::path model_dir = families() / c.family / c.checkpoint;
    CausalLM model = load_causal_lm(model_dir);
    test::expect_error<ConfigError>(
        [&] { export_gguf(model, model_dir, test::temp_dir("family_gguf_refused") / "x.gguf", {}); },
        {"GGUF export of " + c.family, "llama.cpp"});
  }
  const fs::path interop = test::source_dir() / "third_party/llama-interop";
  if (!fs::exists(interop / "node_modules/node-llama-cpp/package.json")) {
    GTEST_SKIP() << "skipped: no llama.cpp in " << interop.string() << " (scripts/setup_llama_interop.sh found no "
                 << "node/npm or could not reach the npm registry)";
  }
  const fs::path dir = test::temp_dir("family_gguf");
  const fs::path script = interop / fmt::format(".swiftcpp-family-eval-{}.mjs", getpid());  // ESM resolves from here
  fs::copy_file(test::source_dir() / "tests/interop/llama_cpp_eval.mjs", script, fs::copy_options::overwrite_existing);
  const std::vector<int64_t> ids = {1, 403, 407, 261, 378};  // once_upon_a_time
  for (const Case& c : all_cases()) {
    if (c.family == "phi" || c.family == "gemma2" || c.checkpoint == "tiny-phi3-longrope") continue;
    SCOPED_TRACE(c.checkpoint);
    const fs::path model_dir = families() / c.family / c.checkpoint;
    CausalLM model = load_causal_lm(model_dir);
    const fs::path gguf = dir / (c.checkpoint + ".gguf");
    // llama.cpp applies Phi-3's token attributes to any file whose general.name holds "phi3", and then wants a
    // <|endoftext|> piece the stories260K vocabulary these checkpoints carry does not have.
    GgufExportOptions options;
    options.name = "tinyref";
    export_gguf(model, model_dir, gguf, options);
    at::NoGradGuard no_grad;
    const at::Tensor ours = at::log_softmax(model->forward(at::tensor(ids, at::kLong).unsqueeze(0))[0], -1);  // [T, V]
    const fs::path out = dir / (c.checkpoint + ".json");
    const int status = std::system(fmt::format("cd {} && node {} {} {} 0 >{} 2>{}.err", interop.string(),
                                               script.filename().string(), gguf.string(), fmt::join(ids, ","),
                                               out.string(), out.string()).c_str());
    ASSERT_EQ(status, 0) << "llama.cpp failed on " << gguf << "; see " << out << ".err";
    const Json r = load_json_file(out);
    ASSERT_EQ(r["probabilities"].size(), ids.size());
    double worst = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const Json& row = r["probabilities"][t];
      const int64_t top = ours[static_cast<int64_t>(t)].argmax().item<int64_t>();
      const double top_p = row[top].get<double>();
      ASSERT_GT(top_p, 0) << "llama.cpp's top token differs at position " << t;
      for (int64_t v = 0; v < 512; ++v) {
        const double p = row[v].get<double>();
        if (p < 1e-6) continue;  // filtered out by node-llama-cpp's sampling defaults, or too small to compare
        const double mine = (ours[static_cast<int64_t>(t)][v] - ours[static_cast<int64_t>(t)][top]).item<double>();
        worst = std::max(worst, std::abs(std::log(p) - std::log(top_p) - mine));
      }
    }
    const double tol = c.family == "gemma" || c.family == "starcoder2" ? 3e-3 : 1e-4;
    std::cout << "[gguf] llama.cpp vs swiftcpp, " << c.checkpoint << ": largest logit-gap difference " << worst
              << std::endl;
    EXPECT_LE(worst, tol);
  }
  fs::remove(script);
}

}  // namespace
}  // namespace swiftcpp
