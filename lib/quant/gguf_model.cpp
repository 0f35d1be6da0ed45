#include "quant/gguf_model.h"


#include <ATen/ATen.h>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "core/error.h"
#include "core/parallel.h"
#include "core/text.h"
#include "nn/layers.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {

std::string gguf_architecture(const std::string& model_type) {
  if (model_type == "llama" || model_type == "mistral" || model_type == "mixtral") return "llama";
  if (model_type == "qwen2" || model_type == "qwen3" || model_type == "gemma" || model_type == "starcoder2" ||
      model_type == "phi3") {
    return model_type;
  }
  if (model_type == "qwen2_moe") return "qwen2moe";
  if (model_type == "phi") {
    fail<ConfigError>("GGUF export of phi (Phi-2) is not supported: llama.cpp's phi2 architecture takes no grouped K/V "
                      "heads and a feed-forward width of 4 x hidden only, so it would not run every Phi checkpoint");
  }
  if (model_type == "gemma2") {
    fail<ConfigError>("GGUF export of gemma2 is not supported: llama.cpp chooses Gemma 2's attention scale by layer "
                      "count (26/42/46 layers) and never reads query_pre_attn_scalar, so other checkpoints would compute "
                      "different attention");
  }
  fail<ConfigError>("GGUF export supports llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, gemma, starcoder2 and phi3 "
                    "models (got model_type {})", model_type);
}

at::Tensor permute_qk(const at::Tensor& w, int64_t heads) {
  // [heads * 2 * half, in] -> [heads, 2, half, in] -> [heads, half, 2, in]
  const int64_t half = w.size(0) / heads / 2;
  return w.reshape({heads, 2, half, -1}).transpose(1, 2).reshape(w.sizes());
}

at::Tensor permute_qk_inverse(const at::Tensor& w, int64_t heads) {
  const int64_t half = w.size(0) / heads / 2;
  return w.reshape({heads, half, 2, -1}).transpose(1, 2).reshape(w.sizes());
}

namespace {

// Protobuf wire format, just enough for sentencepiece's ModelProto.
class Proto {
 public:
  Proto(const uint8_t* p, size_t n, const fs::path& file) : p_(p), end_(p + n), file_(file) {}
  bool done() const { return p_ >= end_; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) bad("a truncated varint");
      const uint8_t b = *p_++;
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    bad("an over-long varint");
  }
  std::pair<const uint8_t*, size_t> bytes() {
    const uint64_t n = varint();
    if (n > static_cast<uint64_t>(end_ - p_)) bad("a field longer than its message");
    const uint8_t* start = p_;
    p_ += n;
    return {start, static_cast<size_t>(n)};
  }
  float fixed32() {
    if (end_ - p_ < 4) bad("a truncated 32-bit field");
    float f;
    std::memcpy(&f, p_, 4);
    p_ += 4;
    return f;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0: varint(); return;
      case 1:
        if (end_ - p_ < 8) bad("a truncated 64-bit field");
        p_ += 8;
        return;
      case 2: bytes(); return;
      case 5: fixed32(); return;
      default: bad("an unknown wire type");
    }
  }
  [[noreturn]] void bad(const char* what) const {
    fail<FormatError>("{}: not a sentencepiece model: {}", file_.string(), what);
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  const fs::path& file_;
};

}  // namespace

SentencePieceVocab read_sentencepiece_vocab(const fs::path& file) {
  require_regular_file(file, "sentencepiece model");
  std::ifstream in(file, std::ios::binary);
  if (!in) fail<IoError>("cannot read {}", file.string());
  const std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  SentencePieceVocab vocab;
  Proto model(data.data(), data.size(), file);
  while (!model.done()) {
    const uint64_t tag = model.varint();
    if (tag >> 3 != 1 || (tag & 7) != 2) {
      model.skip(static_cast<uint32_t>(tag & 7));
      continue;
    }
    const auto [p, n] = model.bytes();
    Proto piece(p, n, file);
    std::string text;
    float score = 0;
    int32_t type = 1;  // NORMAL
    while (!piece.done()) {
      const uint64_t t = piece.varint();
      if (t == (1 << 3 | 2)) {
        const auto [s, len] = piece.bytes();
        text.assign(reinterpret_cast<const char*>(s), len);
      } else if (t == (2 << 3 | 5)) {
        score = piece.fixed32();
      } else if (t == (3 << 3 | 0)) {
        type = static_cast<int32_t>(piece.varint());
      } else {
        piece.skip(static_cast<uint32_t>(t & 7));
      }
    }
    vocab.pieces.push_back(std::move(text));
    vocab.scores.push_back(score);
    vocab.types.push_back(type);
  }
  if (vocab.pieces.empty()) fail<FormatError>("{}: not a sentencepiece model: no pieces", file.string());
  return vocab;
}

namespace {

// llama.cpp's name of a decoder parameter ("" for none). Experts' weights map to the stacked tensor of all of a
// layer's experts (ffn_*_exps), which export_gguf writes once.
std::string gguf_tensor_name(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "model.norm.bias") return "output_norm.bias";
  if (hf == "lm_head.weight") return "output.weight";
  static const std::vector<std::pair<std::string, std::string>> parts = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"input_layernorm.bias", "attn_norm.bias"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"post_attention_layernorm.bias", "ffn_norm.bias"},
      {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
      {"mlp.gate_up_proj.weight", "ffn_up.weight"},  // Phi-3: llama.cpp splits the fused rows itself
      {"mlp.c_fc.weight", "ffn_up.weight"},
      {"mlp.c_fc.bias", "ffn_up.bias"},
      {"mlp.c_proj.weight", "ffn_down.weight"},
      {"mlp.c_proj.bias", "ffn_down.bias"},
      {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"mlp.gate_proj.bias", "ffn_gate.bias"},
      {"mlp.up_proj.bias", "ffn_up.bias"},
      {"mlp.down_proj.bias", "ffn_down.bias"},
  };
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) != 0) return "";
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos) return "";
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
  const std::string rest = hf.substr(dot + 1);
  for (const auto& [from, to] : parts) {
    if (rest == from) return "blk." + layer + "." + to;
  }
  // Experts: <block>.experts.<e>.<linear>.weight -> ffn_{gate,up,down}_exps.weight.
  static const std::vector<std::pair<std::string, std::string>> experts = {
      {"w1", "ffn_gate_exps"}, {"w3", "ffn_up_exps"}, {"w2", "ffn_down_exps"},
      {"gate_proj", "ffn_gate_exps"}, {"up_proj", "ffn_up_exps"}, {"down_proj", "ffn_down_exps"}};
  for (const char* block : {"block_sparse_moe.experts.", "mlp.experts."}) {
    if (rest.rfind(block, 0) != 0) continue;
    const std::string tail = rest.substr(std::string(block).size());  // <e>.<linear>.weight
    const size_t d = tail.find('.');
    if (d == std::string::npos) return "";
    for (const auto& [from, to] : experts) {
      if (tail.substr(d + 1) == from + ".weight") return "blk." + layer + "." + to + ".weight";
    }
  }
  return "";
}

// A byte-level BPE vocabulary as llama.cpp's "gpt2" tokenizer model takes it, from a Hugging Face tokenizer.json:
// tokens by id (vocabulary strings, added tokens' contents, "[PADn]" for ids neither names), their types (1 normal,
// 3 control for special added tokens, 4 user-defined for the other added tokens, 5 unused for the padding), the
// merges as "left right" strings in rank order, and the pre-tokenizer's llama.cpp name.
struct BpeVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string pre;         // tokenizer.ggml.pre
  bool pre_known = false;  // false: "default" written for a split llama.cpp does not name
};

// The split regexes llama.cpp knows by name (facts of the public tokenizers that use them).
std::string pre_tokenizer_name(const Json& pre) {
  const std::string gpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
  const std::string llama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string qwen2 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  if (!pre.is_object()) return "";
  const std::string type = pre.value("type", "");
  // ByteLevel splitting with its own (GPT-2) regex.
  if (type == "ByteLevel") return pre.value("use_regex", true) ? "gpt-2" : "";
  if (type == "Split" && pre.contains("pattern") && pre["pattern"].contains("Regex")) {
    const std::string regex = pre["pattern"]["Regex"].get<std::string>();
    if (regex == llama3) return "llama-bpe";
    if (regex == qwen2) return "qwen2";
    if (regex == gpt2) return "gpt-2";
    return "";
  }
  if (type == "Sequence" && pre.contains("pretokenizers")) {
    // Split(regex) then ByteLevel(use_regex false): the split decides.
    std::string name;
    for (const Json& step : pre["pretokenizers"]) {
      const std::string t = step.value("type", "");
      if (t == "Split" || (t == "ByteLevel" && step.value("use_regex", true))) {
        if (!name.empty()) return "";
        name = pre_tokenizer_name(step);
        if (name.empty()) return "";
      } else if (t != "ByteLevel") {
        return "";
      }
    }
    return name;
  }
  return "";
}

BpeVocab read_bpe_vocab(const fs::path& tokenizer_json, int64_t vocab_size) {
  const Json root = load_json_file(tokenizer_json);
  const std::string where = tokenizer_json.string();
  if (!root.contains("model") || root["model"].value("type", "") != "BPE" || !root["model"].contains("vocab")) {
    fail<ConfigError>("GGUF export: {} is not a BPE tokenizer (model.type BPE with a vocab); only sentencepiece and "
                      "byte-level BPE vocabularies are exported", where);
  }
  BpeVocab v;
  const Json& vocab = root["model"]["vocab"];
  const Json added = root.value("added_tokens", Json::array());
  if (!vocab.is_object() || !added.is_array()) {
    fail<FormatError>("GGUF export: {}: model.vocab must be an object and added_tokens a list", where);
  }
  // Every id is checked before it indexes anything: a non-negative integer below the model's vocab_size.
  const auto id_of = [&](const Json& id, const std::string& piece) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      fail<FormatError>("GGUF export: {}: the id of token '{}' must be a non-negative integer, got {}", where,
                        piece.substr(0, 40), describe_json(id));
    }
    if (id.get<int64_t>() >= vocab_size) {
      fail<ConfigError>("GGUF export: {} has the id {} (token '{}'), beyond the model's vocab_size {}", where,
                        id.get<int64_t>(), piece.substr(0, 40), vocab_size);
    }
    return static_cast<size_t>(id.get<int64_t>());
  };
  v.tokens.assign(static_cast<size_t>(vocab_size), "");
  v.types.assign(static_cast<size_t>(vocab_size), 0);
  for (const auto& [piece, id] : vocab.items()) {
    const size_t i = id_of(id, piece);
    v.tokens[i] = piece;
    v.types[i] = 1;
  }
  for (const Json& a : added) {
    if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id")) {
      fail<FormatError>("GGUF export: {}: every added_tokens entry needs a string 'content' and an 'id', got {}", where,
                        describe_json(a));
    }
    const size_t i = id_of(a["id"], a["content"].get<std::string>());
    v.tokens[i] = a["content"].get<std::string>();
    const Json special = a.value("special", Json(false));
    v.types[i] = special.is_boolean() && special.get<bool>() ? 3 : 4;
  }
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.types[i] == 0) {
      v.tokens[i] = fmt::format("[PAD{}]", i);
      v.types[i] = 5;
    }
  }
  const Json merges = root["model"].value("merges", Json::array());
  if (!merges.is_array()) fail<FormatError>("GGUF export: {}: model.merges must be a list", where);
  for (const Json& m : merges) {
    // "left right" (older files) or ["left", "right"] (tokenizers >= 0.20).
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      fail<FormatError>("GGUF export: {}: a merge must be \"left right\" or [\"left\", \"right\"], got {}", where,
                        describe_json(m));
    }
  }
  try {
    v.pre = pre_tokenizer_name(root.value("pre_tokenizer", Json()));
  } catch (const nlohmann::json::exception&) {  // a field of the wrong type: a shape we cannot name
    fail<FormatError>("GGUF export: {}: pre_tokenizer has a field of an unexpected type: {}", where,
                      describe_json(root["pre_tokenizer"]));
  }
  v.pre_known = !v.pre.empty();
  if (!v.pre_known) v.pre = "default";
  return v;
}

uint32_t file_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q4_0: return 2;
    case GgmlType::Q8_0: return 7;
  }
  return 0;
}

}  // namespace

GgufExportReport export_gguf(CausalLM& model, const fs::path& model_dir, const fs::path& file,
                             const GgufExportOptions& options) {
  const DecoderConfig& c = model->config();
  if (c.multimodal) {
    fail<ConfigError>("GGUF export of {}: it is a vision-language model ({}), and llama.cpp keeps the vision tower and "
                      "projector in a separate mmproj file that swiftcpp does not write; export it with --format hf",
                      model_dir.string(), c.architecture);
  }
  if (model->has_packed_weights()) {
    fail<ConfigError>("GGUF export of {}: its linear layers are packed integers (a GPTQ-layout checkpoint); export the "
                      "float model instead", model_dir.string());
  }
  GgufExportReport report;
  const std::string arch = gguf_architecture(c.model_type);
  report.architecture = arch;
  if (c.rope_scaling.type != "default" && c.rope_scaling.type != "linear") {
    fail<ConfigError>("GGUF export: rope_scaling type {} is not supported yet (default and linear are)",
                      c.rope_scaling.type);
  }
  if (c.moe.num_experts > 0 && arch == "qwen2moe" && c.moe.norm_topk_prob) {
    fail<ConfigError>("GGUF export of {}: norm_topk_prob is true, but llama.cpp's qwen2moe uses the raw top-k "
                      "probabilities", model_dir.string());
  }
  if (c.moe.num_experts > 0) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      if (!c.moe.sparse(i)) {
        fail<ConfigError>("GGUF export of {}: layer {} is dense in a mixture of experts (decoder_sparse_step, "
                          "mlp_only_layers), which llama.cpp's {} does not take", model_dir.string(), i, arch);
      }
    }
  }
  GgufWriter w;
  w.set_string("general.architecture", arch);
  w.set_string("general.name", options.name.empty() ? model_dir.filename().string() : options.name);
  w.set_u32("general.file_type", file_type(options.type));
  if (options.type == GgmlType::Q8_0 || options.type == GgmlType::Q4_0) w.set_u32("general.quantization_version", 2);
  w.set_u32(arch + ".context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.set_u32(arch + ".embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.set_u32(arch + ".block_count", static_cast<uint32_t>(c.num_hidden_layers));
  w.set_u32(arch + ".feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.set_u32(arch + ".attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
  w.set_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
  // LayerNorm families (StarCoder2) name their epsilon differently.
  w.set_f32(arch + (c.norm == nn::NormKind::kLayerNorm ? ".attention.layer_norm_epsilon"
                                                       : ".attention.layer_norm_rms_epsilon"),
            c.rms_norm_eps);
  w.set_f32(arch + ".rope.freq_base", c.rope_theta);
  w.set_u32(arch + ".rope.dimension_count", static_cast<uint32_t>(c.rotary_dim > 0 ? c.rotary_dim : c.head_dim));
  if (c.moe.num_experts > 0) {
    w.set_u32(arch + ".expert_count", static_cast<uint32_t>(c.moe.num_experts));
    w.set_u32(arch + ".expert_used_count", static_cast<uint32_t>(c.moe.top_k));
    if (arch == "qwen2moe") {
      w.set_u32(arch + ".expert_feed_forward_length", static_cast<uint32_t>(c.moe.intermediate_size));
      w.set_u32(arch + ".expert_shared_feed_forward_length", static_cast<uint32_t>(c.moe.shared_intermediate_size));
    }
  }

  w.set_u32(arch + ".vocab_size", static_cast<uint32_t>(c.vocab_size));
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    w.set_u32(arch + ".attention.key_length", static_cast<uint32_t>(c.head_dim));
    w.set_u32(arch + ".attention.value_length", static_cast<uint32_t>(c.head_dim));
  }
  if (c.rope_scaling.type == "linear") {
    w.set_string(arch + ".rope.scaling.type", "linear");
    w.set_f32(arch + ".rope.scaling.factor", c.rope_scaling.factor);
  }

  // Tokenizer: sentencepiece pieces, scores and types, or a byte-level BPE vocabulary with its merges; then the
  // checkpoint's special tokens and chat template.
  const fs::path spm = model_dir / "tokenizer.model";
  const fs::path bpe_json = model_dir / "tokenizer.json";
  if (fs::exists(spm)) {
    const SentencePieceVocab vocab = read_sentencepiece_vocab(spm);
    if (static_cast<int64_t>(vocab.pieces.size()) > c.vocab_size) {
      fail<ConfigError>("GGUF export: {} has {} pieces, more than the model's vocab_size {}", spm.string(),
                        vocab.pieces.size(), c.vocab_size);
    }
    Json tokens = Json::array(), scores = Json::array(), types = Json::array();
    for (size_t i = 0; i < vocab.pieces.size(); ++i) {
      tokens.push_back(vocab.pieces[i]);
      scores.push_back(vocab.scores[i]);
      types.push_back(vocab.types[i]);
    }
    for (int64_t i = static_cast<int64_t>(vocab.pieces.size()); i < c.vocab_size; ++i) {  // embedding rows past the
      tokens.push_back(fmt::format("[PAD{}]", i));                                         // vocabulary, as llama.cpp's
      scores.push_back(-1000.0);                                                           // converter pads them
      types.push_back(5);  // UNUSED
    }
    report.tokenizer_model = "llama";
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_array("tokenizer.ggml.tokens", GgufType::STRING, tokens);
    w.set_array("tokenizer.ggml.scores", GgufType::FLOAT32, scores);
    w.set_array("tokenizer.ggml.token_type", GgufType::INT32, types);
    for (size_t i = 0; i < vocab.types.size(); ++i) {
      if (vocab.types[i] == 2) {
        w.set_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(i));
        break;
      }
    }
  } else if (fs::exists(bpe_json)) {
    const BpeVocab vocab = read_bpe_vocab(bpe_json, c.vocab_size);
    report.tokenizer_model = "gpt2";
    report.pre_tokenizer = vocab.pre;
    report.pre_tokenizer_known = vocab.pre_known;
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", vocab.pre);
    w.set_array("tokenizer.ggml.tokens", GgufType::STRING, Json(vocab.tokens));
    w.set_array("tokenizer.ggml.token_type", GgufType::INT32, Json(vocab.types));
    w.set_array("tokenizer.ggml.merges", GgufType::STRING, Json(vocab.merges));
  } else {
    fail<ConfigError>("GGUF export: {} has neither tokenizer.model (sentencepiece) nor tokenizer.json (BPE)",
                      model_dir.string());
  }
  const auto tokenizer = load_tokenizer(model_dir);
  const SpecialTokens& sp = tokenizer->specials();
  if (sp.bos) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*sp.bos));
  if (!sp.eos.empty()) w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(sp.eos.front()));
  if (sp.pad) w.set_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*sp.pad));
  w.set_bool("tokenizer.ggml.add_bos_token", sp.add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", sp.add_eos);
  if (fs::exists(model_dir / "tokenizer_config.json")) {
    const Json tc = load_json_file(model_dir / "tokenizer_config.json");
    if (tc.contains("chat_template") && tc["chat_template"].is_string()) {
      w.set_string("tokenizer.chat_template", tc["chat_template"].get<std::string>());
    }
  }

  // Tensors, in the decoder's order; a layer's experts stacked into one [E, out, in] tensor per projection.
  const auto params = model->named_parameters(true);
  std::set<std::string> written;
  for (const auto& item : params) {
    const std::string name = gguf_tensor_name(item.key());
    if (name.empty()) fail<ConfigError>("GGUF export: no llama.cpp name for parameter {}", item.key());
    if (!written.insert(name).second) continue;  // the other experts of a stacked tensor
    at::Tensor t = item.value().detach().to(at::kCPU, at::kFloat);
    if (name.find("_exps.weight") != std::string::npos) {
      // This is expert 0's weight: gather every expert's under the same name, in expert order.
      const std::string marker = ".experts.0.";
      const size_t at_marker = item.key().find(marker);
      std::vector<at::Tensor> stack;
      for (int64_t e = 0; e < c.moe.num_experts; ++e) {
        const std::string key = item.key().substr(0, at_marker) + ".experts." + std::to_string(e) + "." +
                                item.key().substr(at_marker + marker.size());
        const at::Tensor* p = params.find(key);
        if (p == nullptr) fail<ConfigError>("GGUF export: expert weight {} is missing", key);
        stack.push_back(p->detach().to(at::kCPU, at::kFloat));
      }
      t = at::stack(stack);  // [E, out, in]
    }
    if (c.norm == nn::NormKind::kRMSNormOffset && name.size() > 11 &&
        name.compare(name.size() - 11, 11, "norm.weight") == 0) {
      t = t + 1;  // Gemma: llama.cpp's converter stores the (1 + w) scale
    }
    if (arch == "llama" && item.key().find("self_attn.q_proj.weight") != std::string::npos) {
      t = permute_qk(t, c.num_attention_heads);
    } else if (arch == "llama" && item.key().find("self_attn.k_proj.weight") != std::string::npos) {
      t = permute_qk(t, c.num_key_value_heads);
    }
    GgmlType type = t.dim() >= 2 ? options.type : GgmlType::F32;
    const bool output = name == "output.weight" || (c.tie_word_embeddings && name == "token_embd.weight");
    if (output && type == GgmlType::Q4_0 && options.wide_output) {
      type = GgmlType::Q8_0;
      ++report.wide_tensors;
    }
    if (t.size(-1) % ggml_block_size(type) != 0) {
      type = GgmlType::F16;  // as llama.cpp's own converter falls back
      ++report.fallback_tensors;
    }
    w.add_tensor(name, t, type);
    ++report.tensors;
  }
  w.write(file);
  return report;
}

DecoderConfig gguf_decoder_config(const GgufFile& f) {
  const std::string arch = f.at("general.architecture").value.get<std::string>();
  DecoderConfig c;
  if (arch == "llama") {
    c.model_type = "llama";
  } else if (arch == "qwen2" || arch == "qwen3") {
    c.model_type = arch;
    c.qkv_bias = arch == "qwen2";
    c.qk_norm = arch == "qwen3";
  } else {
    fail<ConfigError>("{}: GGUF architecture {} is not supported (llama, qwen2, qwen3 are)", f.path().string(), arch);
  }
  const auto num = [&](const std::string& key) {
    const Json& v = f.at(arch + "." + key).value;
    if (!v.is_number()) fail<FormatError>("{}: metadata {}.{} is not a number", f.path().string(), arch, key);
    return v;
  };
  c.hidden_size = num("embedding_length").get<int64_t>();
  c.num_hidden_layers = num("block_count").get<int64_t>();
  c.intermediate_size = num("feed_forward_length").get<int64_t>();
  c.num_attention_heads = num("attention.head_count").get<int64_t>();
  c.num_key_value_heads = f.contains(arch + ".attention.head_count_kv") ? num("attention.head_count_kv").get<int64_t>()
                                                                        : c.num_attention_heads;
  c.max_position_embeddings = num("context_length").get<int64_t>();
  c.rms_norm_eps = num("attention.layer_norm_rms_epsilon").get<double>();
  c.rope_theta = f.contains(arch + ".rope.freq_base") ? num("rope.freq_base").get<double>() : 10000.0;
  c.head_dim = f.contains(arch + ".attention.key_length") ? num("attention.key_length").get<int64_t>()
                                                          : c.hidden_size / std::max<int64_t>(1, c.num_attention_heads);
  if (f.contains(arch + ".rope.scaling.type") && f.at(arch + ".rope.scaling.type").value == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = num("rope.scaling.factor").get<double>();
  }
  const GgufTensorInfo* embed = f.find_tensor("token_embd.weight");
  if (embed == nullptr) fail<FormatError>("{}: no tensor token_embd.weight", f.path().string());
  c.vocab_size = embed->torch_shape()[0];
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  if (f.contains("tokenizer.ggml.bos_token_id")) c.bos_token_id = f.at("tokenizer.ggml.bos_token_id").value.get<int64_t>();
  if (f.contains("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {f.at("tokenizer.ggml.eos_token_id").value.get<int64_t>()};
  c.validate(f.path().string());
  return c;
}

namespace {

// A Q8_0 or Q4_0 tensor [rows, cols] as nn::QuantBlocks, without rounding: Q8_0's int8 q becomes q + 128 with zero
// point 128, Q4_0's nibbles (zero point 8, the same byte order) are copied; each block's float16 d is its scale.
nn::QuantBlocks gguf_blocks(const GgufFile& f, const GgufTensorInfo& info) {
  const std::vector<int64_t> shape = info.torch_shape();
  const int64_t rows = shape.at(0), cols = shape.at(1), blocks = cols / 32;
  const bool q8 = info.type == GgmlType::Q8_0;
  const int64_t block_bytes = q8 ? 34 : 18, data_bytes = q8 ? 32 : 16;
  nn::QuantBlocks b;
  b.rows = rows;
  b.cols = cols;
  b.blocks = blocks;
  b.bits = q8 ? 8 : 4;
  b.q = at::empty({rows, blocks * data_bytes}, at::kByte);
  b.scales = at::empty({rows, blocks}, at::kFloat);
  b.zeros = at::full({rows, blocks}, q8 ? 128 : 8, at::kByte);
  const uint8_t* src = f.data(info);
  uint8_t* q = b.q.data_ptr<uint8_t>();
  float* scales = b.scales.data_ptr<float>();
  parallel::for_range(0, rows * blocks, 32, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const uint8_t* block = src + i * block_bytes;
      uint16_t d;
      std::memcpy(&d, block, sizeof d);
      scales[i] = static_cast<float>(c10::Half(d, c10::Half::from_bits()));
      uint8_t* dst = q + i * data_bytes;
      if (q8) {
        for (int j = 0; j < 32; ++j) dst[j] = static_cast<uint8_t>(block[2 + j] ^ 0x80);  // int8 + 128
      } else {
        std::memcpy(dst, block + 2, 16);
      }
    }
  });
  return b;
}

// The row order permute_qk_inverse gives a [rows, *] weight: row k of the result is row order[k] of the input.
at::Tensor row_order(int64_t rows, int64_t heads) {
  return permute_qk_inverse(at::arange(rows, at::kFloat).view({rows, 1}), heads).view({rows}).to(at::kLong);
}

}  // namespace

CausalLM load_gguf_model(const fs::path& file, const LoadOptions& options) {
  const auto f = GgufFile::open(file);
  const DecoderConfig c = gguf_decoder_config(*f);
  CausalLM model(c);
  std::vector<std::string> missing, misshaped;
  std::set<std::string> used;
  at::NoGradGuard no_grad;
  // Inference on the CPU: linear layers stored as Q8_0 / Q4_0 keep their blocks (nn::QuantBlocks).
  std::map<std::string, nn::LinearImpl*> linears;
  if (options.quantized_kernels && options.device.is_cpu()) {
    for (const auto& m : model->named_modules("", /*include_self=*/false)) {
      if (auto* linear = m.value()->as<nn::Linear>()) linears[m.key() + ".weight"] = linear;
    }
  }
  for (auto& item : model->named_parameters(true)) {
    const std::string name = gguf_tensor_name(item.key());
    const GgufTensorInfo* info = f->find_tensor(name);
    if (info == nullptr) {
      missing.push_back(name);
      continue;
    }
    used.insert(name);
    if (info->torch_shape() != item.value().sizes().vec()) {
      misshaped.push_back(fmt::format("{} (file {}, expected {})", name, fmt::join(info->torch_shape(), "x"),
                                      fmt::join(item.value().sizes(), "x")));
      continue;
    }
    const auto linear = linears.find(item.key());
    if (linear != linears.end() && (info->type == GgmlType::Q8_0 || info->type == GgmlType::Q4_0)) {
      nn::QuantBlocks blocks = gguf_blocks(*f, *info);
      const int64_t rows = blocks.rows;
      if (c.model_type == "llama" && item.key().find("self_attn.q_proj.weight") != std::string::npos) {
        blocks = blocks.select_rows(row_order(rows, c.num_attention_heads));
      } else if (c.model_type == "llama" && item.key().find("self_attn.k_proj.weight") != std::string::npos) {
        blocks = blocks.select_rows(row_order(rows, c.num_key_value_heads));
      }
      linear->second->blocks = std::make_shared<const nn::QuantBlocks>(std::move(blocks));
      item.value().set_data(at::empty({0}, at::TensorOptions().dtype(options.dtype)));
      continue;
    }
    at::Tensor t = f->tensor(name);
    if (c.model_type == "llama" && item.key().find("self_attn.q_proj.weight") != std::string::npos) {
      t = permute_qk_inverse(t, c.num_attention_heads);
    } else if (c.model_type == "llama" && item.key().find("self_attn.k_proj.weight") != std::string::npos) {
      t = permute_qk_inverse(t, c.num_key_value_heads);
    }
    item.value().set_data(t.contiguous().to(options.device, options.dtype));
  }
  std::vector<std::string> unexpected;
  for (const auto& t : f->tensors()) {
    if (used.count(t.name) == 0 && t.name != "rope_freqs.weight") unexpected.push_back(t.name);
  }
  if (!missing.empty() || !misshaped.empty() || !unexpected.empty()) {
    std::string msg = fmt::format("{}: GGUF tensors do not fit the {} decoder ({} layers, hidden {})", file.string(),
                                  c.model_type, c.num_hidden_layers, c.hidden_size);
    if (!missing.empty()) msg += "\n  missing: " + list_names(missing);
    if (!misshaped.empty()) msg += "\n  wrong shape: " + list_names(misshaped);
    if (!unexpected.empty()) msg += "\n  unexpected: " + list_names(unexpected);
    throw FormatError(msg);
  }
  warn_nonfinite_weights(model, file.string());
  model->eval();
  return model;
}

void check_gguf_vocabulary(const GgufFile& f, const Tokenizer& tokenizer, const std::string& origin) {
  const Json& tokens = f.at("tokenizer.ggml.tokens").value;
  const int n = tokenizer.vocab_size();
  if (static_cast<int64_t>(tokens.size()) < n) {
    fail<ConfigError>("the tokenizer of {} has {} tokens, {} has {}: not the tokenizer this GGUF was made with", origin,
                      n, f.path().string(), tokens.size());
  }
  for (int i = 0; i < n; ++i) {
    if (!tokens[static_cast<size_t>(i)].is_string() || tokens[static_cast<size_t>(i)].get<std::string>() != tokenizer.id_to_piece(i)) {
      fail<ConfigError>("the tokenizer of {} differs from {}'s vocabulary at id {} ('{}' vs {}): not the tokenizer this "
                        "GGUF was made with", origin, f.path().string(), i, tokenizer.id_to_piece(i),
                        tokens[static_cast<size_t>(i)].dump());
    }
  }
}

ModelWithTokenizer load_model_with_tokenizer(const std::string& model, const std::string& tokenizer_dir,
                                             const LoadOptions& options) {
  ModelWithTokenizer out;
  out.gguf = fs::is_regular_file(model);
  if (!out.gguf && !tokenizer_dir.empty()) fail<ConfigError>("--tokenizer is for a GGUF --model file");
  out.assets_dir = !out.gguf ? fs::path(model) : !tokenizer_dir.empty() ? fs::path(tokenizer_dir)
                                                                        : fs::absolute(model).parent_path();
  if (out.gguf && !fs::exists(out.assets_dir / "tokenizer.model") && !fs::exists(out.assets_dir / "tokenizer.json") &&
      !fs::exists(out.assets_dir / "vocab.json")) {
    fail<ConfigError>("{} is a GGUF file and {} holds no tokenizer: pass --tokenizer DIR (the Hugging Face folder it "
                      "was exported from)", model, out.assets_dir.string());
  }
  out.model = out.gguf ? load_gguf_model(model, options) : load_causal_lm(model, options);
  out.tokenizer = load_tokenizer(out.assets_dir);
  if (out.gguf) check_gguf_vocabulary(*GgufFile::open(model), *out.tokenizer, out.assets_dir.string());
  return out;
}

}  // namespace swiftcpp
