// The architecture registry, config.json decoding and checkpoint/model mismatches.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <cmath>

#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "models/registry.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::stories_dir;
using test::temp_dir;

Json stories_config() { return load_json_file(stories_dir() / "config.json"); }

// A copy of stories260K whose config and tensors a test may change.
fs::path make_model(const std::string& name, const Json& config,
                    const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& edit = {}) {
  const fs::path dir = temp_dir(name);
  write_file_atomic(dir / "config.json", config.dump(2));
  const Checkpoint ck = Checkpoint::open(stories_dir());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& n : ck.names()) tensors.emplace_back(n, ck.tensor(n).clone());
  if (edit) edit(tensors);
  save_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, ListsTheFamilies) {
  std::vector<std::string> types;
  for (const auto& spec : architectures()) types.push_back(spec.model_type);
  EXPECT_EQ(types, (std::vector<std::string>{"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "starcoder2", "phi",
                                             "phi3", "mixtral", "qwen2_moe", "llava", "qwen2_vl",
                                             "qwen2_5_vl", "llava_next"}));
}

TEST(Registry, Qwen2VLConfigErrorsNameTheKey) {
  const fs::path dir = test::temp_dir("registry_qwen2_vl");
  const auto config_with = [&](const std::string& rope, const std::string& vision, const std::string& tokens =
                                   ", \"image_token_id\": 60, \"vision_start_token_id\": 61") {
    write_file_atomic(dir / "config.json", "{\"model_type\": \"qwen2_vl\", \"vocab_size\": 64, \"hidden_size\": 64, "
                      "\"intermediate_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
                      "\"num_key_value_heads\": 2" + rope + tokens + ", \"vision_config\": {" + vision + "}}");
  };
  // Qwen's own spelling ("type": "mrope") and transformers' ("default") both mean M-RoPE.
  config_with(", \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3, 3]}", "\"hidden_size\": 64");
  const DecoderConfig ok = load_decoder_config(dir);
  EXPECT_EQ(ok.rope_scaling.mrope_section, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_EQ(ok.rope_scaling.type, "default");
  EXPECT_EQ(ok.multimodal->image_token_index, 60);
  // Without them, the class defaults (151655, 151652) lie outside a vocabulary of 64: refused by key.
  config_with(", \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3, 3]}", "\"hidden_size\": 64", "");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"'image_token_id'", "vocab_size 64", "151655"});
  config_with("", "\"hidden_size\": 64");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"mrope_section"});
  config_with(", \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3, 4]}", "\"hidden_size\": 64");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"mrope_section", "head_dim"});
  config_with(", \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3, 3]}", "\"hidden_size\": 48");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"vision_config.hidden_size", "48"});
  config_with(", \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3, 3]}",
              "\"hidden_size\": 64, \"embed_dim\": 30, \"num_heads\": 4");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"vision width 30"});
  config_with(", \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3, 3]}",
              "\"hidden_size\": 64, \"depth\": -1");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"vision_config.depth"});
}

TEST(Registry, LlavaConfigErrorsNameTheKey) {
  const fs::path dir = test::temp_dir("registry_llava");
  const auto config_with = [&](const std::string& extra) {
    write_file_atomic(dir / "config.json", "{\"model_type\": \"llava\", \"text_config\": {\"vocab_size\": 64, "
                      "\"hidden_size\": 16, \"intermediate_size\": 32, \"num_hidden_layers\": 1, "
                      "\"num_attention_heads\": 2}" + extra + "}");
  };
  config_with("");
  const DecoderConfig ok = load_decoder_config(dir);  // CLIPVisionConfig's defaults: 224 px, patch 32
  EXPECT_EQ(ok.multimodal->image_seq_length, 49);
  EXPECT_EQ(ok.multimodal->image_token_index, 32000);
  config_with(", \"vision_config\": {\"image_size\": 30, \"patch_size\": 14}");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"image_size", "patch_size"});
  config_with(", \"vision_feature_layer\": [-2, -5]");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"vision_feature_layer", "list"});
  config_with(", \"vision_feature_select_strategy\": \"cls\"");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"vision_feature_select_strategy"});
  config_with(", \"vision_config\": {\"model_type\": \"siglip_vision_model\"}");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"siglip_vision_model"});
  config_with(", \"projector_hidden_act\": \"swoosh\"");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"swoosh"});
  config_with(", \"text_config\": 3");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"text_config"});
  config_with(", \"image_seq_length\": 50");
  test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"image_seq_length", "49"});
}

TEST(Registry, Stories260KConfig) {
  const DecoderConfig c = load_decoder_config(stories_dir());
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
}

TEST(Registry, UnknownModelTypeListsSupported) {
  Json config = stories_config();
  config["model_type"] = "gpt_neox";
  const fs::path dir = temp_dir("unknown_type");
  write_file_atomic(dir / "config.json", config.dump());
  const std::string msg = error_of([&] { load_decoder_config(dir); });
  EXPECT_NE(msg.find("gpt_neox"), std::string::npos) << msg;
  EXPECT_NE(msg.find("qwen2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  EXPECT_THROW(load_decoder_config(dir), ModelError);
}

TEST(Registry, MissingKeyNamesFileAndKey) {
  Json config = stories_config();
  config.erase("hidden_size");
  const fs::path dir = temp_dir("missing_key");
  write_file_atomic(dir / "config.json", config.dump());
  const std::string msg = error_of([&] { load_decoder_config(dir); });
  EXPECT_NE(msg.find("hidden_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  EXPECT_THROW(load_decoder_config(dir), ConfigError);
}

TEST(Registry, WrongTypeAndBadGqaAreConfigErrors) {
  Json config = stories_config();
  config["num_hidden_layers"] = "five";
  fs::path dir = temp_dir("wrong_type");
  write_file_atomic(dir / "config.json", config.dump());
  EXPECT_NE(error_of([&] { load_decoder_config(dir); }).find("num_hidden_layers"), std::string::npos);
  config = stories_config();
  config["num_key_value_heads"] = 3;
  write_file_atomic(dir / "config.json", config.dump());
  EXPECT_NE(error_of([&] { load_decoder_config(dir); }).find("num_key_value_heads"), std::string::npos);
  config = stories_config();
  config["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  write_file_atomic(dir / "config.json", config.dump());
  EXPECT_NE(error_of([&] { load_decoder_config(dir); }).find("yarn"), std::string::npos);
}

TEST(Registry, MissingExtraAndMisshapedWeightsAreNamed) {
  const Json config = stories_config();
  const fs::path missing = make_model("missing_w", config, [](auto& t) {
    t.erase(std::remove_if(t.begin(), t.end(), [](auto& p) { return p.first == "model.layers.2.mlp.up_proj.weight"; }),
            t.end());
  });
  std::string msg = error_of([&] { load_causal_lm(missing); });
  EXPECT_NE(msg.find("missing: model.layers.2.mlp.up_proj.weight"), std::string::npos) << msg;

  const fs::path extra = make_model("extra_w", config, [](auto& t) { t.emplace_back("model.layers.9.foo", at::zeros({3})); });
  msg = error_of([&] { load_causal_lm(extra); });
  EXPECT_NE(msg.find("unexpected: model.layers.9.foo"), std::string::npos) << msg;

  const fs::path shaped = make_model("shape_w", config, [](auto& t) {
    for (auto& p : t) if (p.first == "model.norm.weight") p.second = at::ones({65});
  });
  msg = error_of([&] { load_causal_lm(shaped); });
  EXPECT_NE(msg.find("model.norm.weight (file 65, expected 64)"), std::string::npos) << msg;
  EXPECT_THROW(load_causal_lm(shaped), ModelError);
}

// A checkpoint of another model (here: stories260K's weights under a config with more layers) is refused.
TEST(Registry, CheckpointFromAnotherModelIsRefused) {
  Json config = stories_config();
  config["num_hidden_layers"] = 6;
  const fs::path dir = make_model("other_model", config);
  const std::string msg = error_of([&] { load_causal_lm(dir); });
  EXPECT_NE(msg.find("model.layers.5.self_attn.q_proj.weight"), std::string::npos) << msg;
}

// Mistral is the Llama layout: the same weights give the same logits (no window within the sequence).
TEST(Registry, MistralMatchesLlamaOnTheSameWeights) {
  Json config = stories_config();
  config["model_type"] = "mistral";
  config["architectures"] = {"MistralForCausalLM"};
  config["sliding_window"] = 4096;
  const fs::path dir = make_model("mistral", config);
  CausalLM llama = load_causal_lm(stories_dir());
  CausalLM mistral = load_causal_lm(dir);
  c10::InferenceMode guard;
  const at::Tensor ids = at::tensor(std::vector<int64_t>{1, 403, 407, 261, 378, 432}, at::kLong).view({1, -1});
  // Exact: one decoder, the same weights and the same mask (the window is longer than the sequence), so the
  // same operations run in the same order.
  EXPECT_TRUE(at::equal(llama->forward(ids), mistral->forward(ids)));
}

// Qwen3 against an independent textbook forward (double precision, heads repeated explicitly).
TEST(Registry, Qwen3MatchesTextbookForward) {
  Json config = {{"model_type", "qwen3"}, {"architectures", {"Qwen3ForCausalLM"}}, {"vocab_size", 50},
                 {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 2},
                 {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                 {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"tie_word_embeddings", true},
                 {"max_position_embeddings", 64}};
  const fs::path dir = temp_dir("qwen3");
  write_file_atomic(dir / "config.json", config.dump());
  at::manual_seed(7);
  CausalLM shell(load_decoder_config(dir));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& p : shell->named_parameters()) {
    const bool norm = p.key().find("norm") != std::string::npos;
    tensors.emplace_back(p.key(), norm ? 1 + 0.3 * at::randn(p.value().sizes()) : 0.2 * at::randn(p.value().sizes()));
  }
  save_safetensors(dir / "model.safetensors", tensors);
  CausalLM model = load_causal_lm(dir, {at::Device(at::kCPU), at::kDouble});
  std::map<std::string, at::Tensor> w(tensors.begin(), tensors.end());
  for (auto& [k, v] : w) v = v.to(at::kDouble);

  const int64_t T = 5, H = 4, Hkv = 2, Dh = 16;
  const at::Tensor ids = at::tensor(std::vector<int64_t>{3, 17, 42, 8, 0}, at::kLong);
  auto rms = [](const at::Tensor& x, const at::Tensor& g) { return x / (x.pow(2).mean(-1, true) + 1e-6).sqrt() * g; };
  // Rotary angles in float32, as Hugging Face computes them for every model dtype.
  at::Tensor inv = 1.0 / at::pow(1000000.0, at::arange(0, Dh, 2, at::kFloat) / Dh);
  at::Tensor ang = at::arange(T, at::kFloat).unsqueeze(1) * inv.unsqueeze(0);  // [T, Dh/2]
  auto rope = [&](const at::Tensor& x) {  // x [T, heads, Dh]
    at::Tensor x1 = x.narrow(-1, 0, Dh / 2), x2 = x.narrow(-1, Dh / 2, Dh / 2);
    at::Tensor c = ang.cos().to(at::kDouble).unsqueeze(1), s = ang.sin().to(at::kDouble).unsqueeze(1);
    return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
  };
  at::Tensor h = w["model.embed_tokens.weight"].index_select(0, ids);  // [T, D]
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    at::Tensor x = rms(h, w[p + "input_layernorm.weight"]);
    at::Tensor q = at::matmul(x, w[p + "self_attn.q_proj.weight"].t()).view({T, H, Dh});
    at::Tensor k = at::matmul(x, w[p + "self_attn.k_proj.weight"].t()).view({T, Hkv, Dh});
    at::Tensor v = at::matmul(x, w[p + "self_attn.v_proj.weight"].t()).view({T, Hkv, Dh});
    q = rope(rms(q, w[p + "self_attn.q_norm.weight"]));
    k = rope(rms(k, w[p + "self_attn.k_norm.weight"])).repeat_interleave(2, 1);
    v = v.repeat_interleave(2, 1);
    at::Tensor s = at::einsum("thd,shd->hts", {q, k}) / std::sqrt(16.0);
    s = s.masked_fill(at::ones({T, T}, at::kBool).triu(1), -INFINITY);
    at::Tensor o = at::einsum("hts,shd->thd", {s.softmax(-1), v}).reshape({T, H * Dh});
    h = h + at::matmul(o, w[p + "self_attn.o_proj.weight"].t());
    x = rms(h, w[p + "post_attention_layernorm.weight"]);
    at::Tensor g = at::matmul(x, w[p + "mlp.gate_proj.weight"].t());
    at::Tensor u = at::matmul(x, w[p + "mlp.up_proj.weight"].t());
    h = h + at::matmul(g * g.sigmoid() * u, w[p + "mlp.down_proj.weight"].t());
  }
  const at::Tensor expected = at::matmul(rms(h, w["model.norm.weight"]), w["model.embed_tokens.weight"].t());
  c10::InferenceMode guard;
  const at::Tensor got = model->forward(ids.view({1, T})).squeeze(0);
  EXPECT_LE((got - expected).abs().max().item<double>(), 1e-10);
}

// Llama 3 rotary scaling: short wavelengths kept, long ones divided by the factor, a smooth blend between.
TEST(Registry, Llama3RopeScaling) {
  nn::RopeScaling s;
  s.type = "llama3";
  s.factor = 8;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_position_embeddings = 8192;
  nn::RotaryEmbedding plain(128, 500000.0, nn::RopeScaling{}, 16);
  nn::RotaryEmbedding scaled(128, 500000.0, s, 16);
  const at::Tensor a = plain.inv_freq(), b = scaled.inv_freq();
  for (int64_t i = 0; i < 64; ++i) {
    const double f = a[i].item<double>(), g = b[i].item<double>();
    const double wavelen = 2 * M_PI / f;
    if (wavelen < 8192 / 4.0) EXPECT_FLOAT_EQ(g, f) << i;
    else if (wavelen > 8192 / 1.0) EXPECT_FLOAT_EQ(g, f / 8) << i;
    else EXPECT_TRUE(g < f && g > f / 8) << i;
  }
  nn::RopeScaling lin;
  lin.type = "linear";
  lin.factor = 2;
  nn::RotaryEmbedding linear(8, 10000.0, lin, 4);
  nn::RotaryEmbedding base(8, 10000.0, nn::RopeScaling{}, 4);
  EXPECT_TRUE(at::allclose(linear.inv_freq() * 2, base.inv_freq()));
}

}  // namespace
}  // namespace swiftcpp
